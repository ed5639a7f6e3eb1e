package regional

import (
	"math"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
)

// valuesIn returns n counter values of rule g-strict whose keys fall in
// the given slice of two.
func valuesIn(t *testing.T, slice, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n && i < 1000; i++ {
		v := "s_t" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if budget.ShardOf(CounterKey("g-strict", v), 2) == slice {
			out = append(out, v)
		}
	}
	if len(out) < n {
		t.Fatalf("found %d values in slice %d, want %d", len(out), slice, n)
	}
	return out
}

// TestBudgetSlices: with globalsync cut in two instances, a region
// enforces on each counter the rule's lease of the counter's slice and
// acknowledges each slice's apart; a slice's document replaces the
// counters of its slice only, and one naming another slice's counter does
// not give it a budget; when the slicing changes, the rule's leases held
// before are dropped.
func TestBudgetSlices(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	a, b := valuesIn(t, 0, 2), valuesIn(t, 1, 2)
	doc := func(shard int, seq uint64, share float64, counters map[string]map[string]budget.CounterLeaseDoc) budget.Document {
		return budget.Document{Rule: "g-strict", Seq: seq, Issued: clock.Now(), Shard: shard, Shards: 2,
			Leases:         map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: share, Expires: clock.Now().Add(10 * time.Second)}},
			Counters:       counters,
			CounterExpires: clock.Now().Add(10 * time.Second)}
	}
	own := func(f float64) map[string]budget.CounterLeaseDoc {
		return map[string]budget.CounterLeaseDoc{"eu": {Floor: 0.01, Share: f - 0.01}}
	}
	allowance := func(values string) float64 {
		t.Helper()
		f, _ := eu.CounterAllowance("g-strict", values)
		return f
	}

	if !eu.SetBudget(doc(0, 1, 0.15, map[string]map[string]budget.CounterLeaseDoc{a[0]: own(0.5)})) {
		t.Fatal("slice 0's document was not taken")
	}
	// Slice 1 has no lease yet: its counters run on the floor.
	if got, want := allowance(b[0]), eu.Floor(); got != want {
		t.Fatalf("%s (slice 1) before its slice's document: %v, want the floor %v", b[0], got, want)
	}
	// Slice 1's document: its own lease, a counter of its own, and a
	// counter of slice 0 it has no say over.
	if !eu.SetBudget(doc(1, 1, 0.35, map[string]map[string]budget.CounterLeaseDoc{b[0]: own(0.7), a[1]: own(0.9)})) {
		t.Fatal("slice 1's document was not taken")
	}
	for _, c := range []struct {
		values string
		want   float64
	}{{a[0], 0.5}, {a[1], 0.2}, {b[0], 0.7}, {b[1], 0.4}} {
		if got := allowance(c.values); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("allowance of %s: %v, want %v", c.values, got, c.want)
		}
	}
	if got := countAllowed(t, eu, b[1], 500); got != 400 {
		t.Errorf("%s on slice 1's lease admitted %d, want 400", b[1], got)
	}
	if got := countAllowed(t, eu, a[1], 500); got != 200 {
		t.Errorf("%s on slice 0's lease admitted %d, want 200", a[1], got)
	}

	// A newer document of slice 0 naming no counter: a[0] goes back to
	// the rule; b[0], of slice 1, keeps its own.
	if !eu.SetBudget(doc(0, 2, 0.15, nil)) {
		t.Fatal("slice 0's second document was not taken")
	}
	if got := allowance(a[0]); math.Abs(got-0.2) > 1e-9 {
		t.Errorf("%s after slice 0 left it out: %v, want the rule's 0.2", a[0], got)
	}
	if got := allowance(b[0]); math.Abs(got-0.7) > 1e-9 {
		t.Errorf("%s after slice 0's document: %v, want its own 0.7", b[0], got)
	}

	// Each slice's lease acknowledged apart.
	clock.AdvanceBy(time.Second)
	var rep RuleReport
	for _, r := range eu.GlobalReport() {
		if r.Rule == "g-strict" {
			rep = r
		}
	}
	if len(rep.Acks) != 2 || rep.Acks[0] != 2 || rep.Acks[1] != 1 || rep.Acked != 2 {
		t.Fatalf("acknowledged %d, by slice %v; want 2, [2 1]", rep.Acked, rep.Acks)
	}

	// Cut in one again: refused while a lease of the two slices may
	// hold; once they have lapsed, every lease of the rule held before
	// is dropped, slice 1's too.
	one := doc(0, 3, 0.25, nil)
	one.Shard, one.Shards = 0, 0
	if eu.SetBudget(one) {
		t.Fatal("a document of another slicing was taken while the slices' leases hold")
	}
	clock.AdvanceBy(11 * time.Second)
	one = doc(0, 3, 0.25, nil)
	one.Shard, one.Shards = 0, 0
	if !eu.SetBudget(one) {
		t.Fatal("the unsliced document was not taken once the slices' leases had lapsed")
	}
	if got := allowance(b[1]); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("%s once unsliced: %v, want the one lease's 0.3", b[1], got)
	}
	if got := allowance(b[0]); math.Abs(got-0.3) > 1e-9 {
		t.Errorf("%s once unsliced: %v, want the one lease's 0.3 (its own budget was of the old slicing)", b[0], got)
	}
	for _, r := range eu.GlobalReport() {
		if r.Rule == "g-strict" && r.Acks != nil {
			t.Errorf("acks by slice once unsliced: %v", r.Acks)
		}
	}
	// A document of an impossible slice is refused.
	bad := doc(2, 9, 0.5, nil)
	if eu.SetBudget(bad) {
		t.Error("a document of slice 2 of 2 was taken")
	}
}

// TestResliceKeepsTheBarrier: a document of another slicing — a key an
// earlier slicing left in the bucket, replayed — changes nothing while the
// region holds a lease of its slicing, nor once its own leases have
// lapsed: an older document of the slicing in force stays refused, and the
// lease the region holds stays in force.
func TestResliceKeepsTheBarrier(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	b := valuesIn(t, 1, 1)[0]
	doc := func(shard, shards int, seq uint64, share float64, expires time.Time) budget.Document {
		return budget.Document{Rule: "g-strict", Seq: seq, Issued: clock.Now(), Shard: shard, Shards: shards,
			Leases: map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: share, Expires: expires}}}
	}
	later := clock.Now().Add(10 * time.Second)
	older, newer := doc(1, 2, 10, 0.6, later), doc(1, 2, 11, 0.1, later)
	if !eu.SetBudget(older) || !eu.SetBudget(newer) {
		t.Fatal("slice 1's documents were not taken")
	}
	if eu.SetBudget(older) {
		t.Fatal("an older document of slice 1 was taken")
	}
	// A leftover of four slices, lapsed long ago; one in force.
	if eu.SetBudget(doc(2, 4, 99, 0.9, clock.Now().Add(-time.Minute))) {
		t.Error("a lapsed document of four slices was taken")
	}
	if eu.SetBudget(doc(2, 4, 99, 0.9, later)) {
		t.Error("a document of four slices was taken while slice 1's lease of two holds")
	}
	if eu.SetBudget(older) {
		t.Error("the older document of slice 1 was taken after documents of another slicing")
	}
	if got, _ := eu.CounterAllowance("g-strict", b); math.Abs(got-0.15) > 1e-9 {
		t.Errorf("%s (slice 1): %v, want the newer lease's 0.15", b, got)
	}
}
