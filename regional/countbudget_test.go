package regional

import (
	"math"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
)

// TestCounterBudgets: a region enforces a counter's own lease on that
// counter and the rule's on the others; a tenant denied under the rule's
// lease is reported on its own, and what it uses under its own lease is
// not the rule's; a released counter runs on its lease's
// floor (or the rule's) until it goes back to the rule; a counter a newer
// document leaves out goes back at once; an older document changes
// nothing.
func TestCounterBudgets(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	doc := func(seq uint64, counters map[string]map[string]budget.CounterLeaseDoc) budget.Document {
		return budget.Document{Rule: "g-strict", Seq: seq, Issued: clock.Now(),
			Leases:         map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: 0.15, Expires: clock.Now().Add(10 * time.Second)}},
			Counters:       counters,
			CounterExpires: clock.Now().Add(10 * time.Second)}
	}

	// Before any budget of its own, s_acme gets the rule's 20% and is
	// denied past it: a candidate, reported on its own.
	if !eu.SetBudget(doc(1, nil)) {
		t.Fatal("the first document was not taken")
	}
	if got := countAllowed(t, eu, "s_acme", 250); got != 200 {
		t.Fatalf("under the rule's lease s_acme got %d, want 200", got)
	}
	reps := eu.GlobalReport()
	var rule RuleReport
	for _, r := range reps {
		if r.Rule == "g-strict" {
			rule = r
		}
	}
	if len(rule.Counters) != 1 || rule.Counters[0].Key != "s_acme" || rule.Counters[0].Denied != 0.05 || rule.Counters[0].Acked != 0 {
		t.Fatalf("counters reported: %+v, want s_acme with 0.05 denied", rule.Counters)
	}
	if rule.Admitted != 0.2 || rule.Denied != 0.05 {
		t.Fatalf("rule demand %+v: want 0.2 admitted, 0.05 denied", rule.Demand)
	}
	// Denied no more since: not named again (a report names the
	// candidates denied most since they were last named).
	for _, r := range eu.GlobalReport() {
		if r.Rule == "g-strict" && len(r.Counters) != 0 {
			t.Fatalf("reported again with no new denial: %+v", r.Counters)
		}
	}

	// Its own lease: 90% for s_acme, the rule's 20% for the others.
	if !eu.SetBudget(doc(2, map[string]map[string]budget.CounterLeaseDoc{"s_acme": {"eu": {Floor: 0.02, Share: 0.88}, "us": {Floor: 0.01, Share: 0.09}}})) {
		t.Fatal("the second document was not taken")
	}
	if eu.SetBudget(doc(1, nil)) {
		t.Fatal("an older document was taken")
	}
	clock.AdvanceBy(globalDenialHold * time.Microsecond)
	if got := countAllowed(t, eu, "s_acme", 800); got != 700 {
		t.Fatalf("with its own 90%% s_acme got %d more, want 700", got)
	}
	if got := countAllowed(t, eu, "s_other", 250); got != 200 {
		t.Fatalf("s_other got %d, want the rule's 200", got)
	}
	if f, holds := eu.CounterAllowance("g-strict", "s_acme"); f != 0.9 || !holds {
		t.Fatalf("CounterAllowance = %v, %v; want 0.9 held", f, holds)
	}
	// Acknowledged once in force for longer than the ack delay.
	clock.AdvanceBy(time.Second)
	reps = eu.GlobalReport()
	for _, r := range reps {
		if r.Rule == "g-strict" {
			rule = r
		}
	}
	if len(rule.Counters) == 0 || rule.Counters[0].Key != "s_acme" || rule.Counters[0].Acked != 2 || rule.Counters[0].Used != 0.9 {
		t.Fatalf("counters reported: %+v, want s_acme acknowledging 2, having used 0.9", rule.Counters)
	}
	// The rule's lease bounds the counters on it: the most used of those
	// is s_other's 0.2 (and s_acme's 0.2 before its own lease), not
	// s_acme's 0.9 under its own.
	if rule.Used != 0.2 {
		t.Fatalf("the rule's report says %v used, want 0.2: the most of a counter on the rule's lease", rule.Used)
	}

	// Released: the lease it holds until then (lapsed: its floor), then
	// the rule's.
	release := clock.Now().Add(20 * time.Second)
	eu.SetBudget(doc(3, map[string]map[string]budget.CounterLeaseDoc{"s_acme": {"eu": {Released: release}, "us": {Released: release}}}))
	clock.AdvanceBy(11 * time.Second)
	if f, holds := eu.CounterAllowance("g-strict", "s_acme"); f != 0.02 || holds {
		t.Fatalf("released, lease lapsed: CounterAllowance = %v, %v; want its floor 0.02", f, holds)
	}
	clock.AdvanceBy(10 * time.Second)
	if f, _ := eu.CounterAllowance("g-strict", "s_acme"); f != 0.05 {
		t.Fatalf("after the release: CounterAllowance = %v, want the rule's floor 0.05 (its lease lapsed)", f)
	}

	// A counter released that the region held no lease of: the rule's
	// floor until then, whatever the rule's lease.
	eu.SetBudget(doc(4, map[string]map[string]budget.CounterLeaseDoc{"s_new": {"eu": {Released: clock.Now().Add(time.Minute)}}}))
	if f, _ := eu.CounterAllowance("g-strict", "s_new"); f != 0.05 {
		t.Fatalf("released without a lease: CounterAllowance = %v, want the rule's floor 0.05", f)
	}
	// Left out of a newer document: back to the rule at once.
	eu.SetBudget(doc(5, nil))
	if f, _ := eu.CounterAllowance("g-strict", "s_new"); f != 0.2 {
		t.Fatalf("left out: CounterAllowance = %v, want the rule's 0.2", f)
	}
}

// TestGlobalDenialSaysTheWindowEnd: a global limit denied for want of
// budget says to retry at the window's end, whether the store or the
// denial cache answers; a store that cannot answer says the window ends
// where it does.
func TestGlobalDenialSaysTheWindowEnd(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	countAllowed(t, eu, "s_1", 50) // the floor: 50 of 1000 an hour
	end := clock.Now().Truncate(time.Hour).Add(time.Hour)
	cached := false
	for i := range 3 {
		d := mustCheck(t, eu, Request{APIKey: "s_1", Endpoint: "/x"})
		if d.Allowed || len(d.Limits) == 0 {
			t.Fatalf("check %d: %+v, want denied", i, d)
		}
		l := d.Limits[0]
		if want := end.Sub(clock.Now()); l.RetryAfter != want || !l.ResetAt.Equal(end) {
			t.Fatalf("check %d (cached %v): retry after %v, reset %v; want %v and the window's end %v", i, l.Cached, l.RetryAfter, l.ResetAt, want, end)
		}
		cached = cached || l.Cached
		clock.AdvanceBy(100 * time.Millisecond)
	}
	if !cached {
		t.Fatal("no denial came from the cache: the test checks only the store")
	}
	p := Params{Algorithm: FixedWindow, Limit: 10, Window: time.Minute.Microseconds()}
	if got := p.resetAt(time.Unix(100, 0).UnixMicro()); got != time.Unix(120, 0).UnixMicro() {
		t.Fatalf("resetAt = %v, want the window's end", time.UnixMicro(got))
	}
}

// TestElasticCounterWithItsOwnBudgetDoesNotBorrow: in elastic mode a
// counter on the rule's lease borrows the slack it sees; one with a
// budget of its own keeps to its own lease, which follows its demand
// (the slack it would see a gossip round late, every region wanting more
// of it would take too).
func TestElasticCounterWithItsOwnBudgetDoesNotBorrow(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	eu.HeardFrom("us")
	expires := clock.Now().Add(10 * time.Second)
	if !eu.SetBudget(budget.Document{Rule: "g-elastic", Seq: 1, Issued: clock.Now(),
		Leases:         map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: 0.15, Expires: expires}},
		Counters:       map[string]map[string]budget.CounterLeaseDoc{"e_acme": {"eu": {Floor: 0.02, Share: 0.28}, "us": {Floor: 0.02, Share: 0.68}}},
		CounterExpires: expires}) {
		t.Fatal("the document was not taken")
	}
	if got := countAllowed(t, eu, "e_other", 1000); got != 990 {
		t.Fatalf("e_other, on the rule's lease of 20%%, admitted %d: want 990, borrowing up to the ceiling (1%% headroom)", got)
	}
	if got := countAllowed(t, eu, "e_acme", 1000); got != 300 {
		t.Fatalf("e_acme, with its own lease of 30%%, admitted %d: want 300, borrowing nothing", got)
	}
}

// TestPressedCounterReportedBeforeDenied: in strict mode a counter on the
// rule's lease that has used half the region's allowance, at a pace that
// would use all of it before the window ends, is reported on its own
// before it is denied, with how long the region has counted it; one that
// has used less, or goes slower, is not.
func TestPressedCounterReportedBeforeDenied(t *testing.T) {
	clock := newVirtualClock() // the start of an hour: g-strict's window
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	if !eu.SetBudget(budget.Document{Rule: "g-strict", Seq: 1, Issued: clock.Now(),
		Leases: map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: 0.15, Expires: clock.Now().Add(time.Hour)}}}) {
		t.Fatal("the document was not taken")
	}
	counters := func() []CounterReport {
		for _, r := range eu.GlobalReport() {
			if r.Rule == "g-strict" {
				return r.Counters
			}
		}
		return nil
	}
	// A tenth of the way into the window: 150 of the 200 allowed is on
	// course for 1,500. It is pressed from the 100th check on.
	clock.AdvanceBy(6 * time.Minute)
	if got := countAllowed(t, eu, "s_fast", 150); got != 150 {
		t.Fatalf("s_fast admitted %d of 150", got)
	}
	if got := countAllowed(t, eu, "s_small", 90); got != 90 {
		t.Fatalf("s_small admitted %d of 90", got)
	}
	clock.AdvanceBy(time.Second)
	reps := counters()
	if len(reps) != 1 || reps[0].Key != "s_fast" || reps[0].Denied != 0 || math.Abs(reps[0].Admitted-0.051) > 1e-9 || reps[0].Counted != time.Second {
		t.Fatalf("counters reported: %+v; want s_fast alone, 51 admitted while pressed, counted for 1s", reps)
	}
	// Nine tenths of the way: 150 is on course for 167, within the 200.
	clock.AdvanceBy(48 * time.Minute)
	if got := countAllowed(t, eu, "s_late", 150); got != 150 {
		t.Fatalf("s_late admitted %d of 150", got)
	}
	if reps := counters(); len(reps) != 0 {
		t.Fatalf("counters reported: %+v; want none (s_fast asked nothing since, s_late is on course to fit)", reps)
	}
}
