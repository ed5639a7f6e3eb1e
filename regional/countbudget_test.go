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

	// Released to make room for another: its last lease, its floor as
	// high as the lease, held past its expiry until its release, which
	// a release note of a later budget of the counter does not move.
	eu.SetBudget(doc(6, map[string]map[string]budget.CounterLeaseDoc{"s_big": {"eu": {Floor: 0.7}}}))
	last := clock.Now().Add(30 * time.Second)
	eu.SetBudget(doc(7, map[string]map[string]budget.CounterLeaseDoc{"s_big": {"eu": {Floor: 0.6, Released: last}, "us": {Floor: 0.3, Released: last}}}))
	clock.AdvanceBy(11 * time.Second)
	if f, holds := eu.CounterAllowance("g-strict", "s_big"); f != 0.6 || holds {
		t.Fatalf("last lease lapsed: CounterAllowance = %v, %v; want its floor 0.6", f, holds)
	}
	eu.SetBudget(doc(8, map[string]map[string]budget.CounterLeaseDoc{"s_big": {"eu": {Released: last.Add(time.Hour)}}}))
	if f, _ := eu.CounterAllowance("g-strict", "s_big"); f != 0.6 {
		t.Fatalf("a release note after the last lease: CounterAllowance = %v, want its floor 0.6", f)
	}
	clock.AdvanceBy(20 * time.Second)
	if f, _ := eu.CounterAllowance("g-strict", "s_big"); f != 0.05 {
		t.Fatalf("after the last lease's release: CounterAllowance = %v, want the rule's floor 0.05 (its lease lapsed)", f)
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
	if !eu.SetBudget(elasticDoc(clock.Now(), map[string]map[string]budget.CounterLeaseDoc{"e_acme": {"eu": {Floor: 0.02, Share: 0.28}, "us": {Floor: 0.02, Share: 0.68}}})) {
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
	// Leases of an hour: one document holds for the whole test.
	bc := budget.DefaultConfig()
	bc.LeaseTTL = time.Hour
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}, Budget: bc}}, mustParse(t, globalRules))
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
	// course for 1,500. It is pressed from the 100th check on, and
	// counted from the 101st (the first is no pace).
	clock.AdvanceBy(6 * time.Minute)
	if got := countAllowed(t, eu, "s_fast", 150); got != 150 {
		t.Fatalf("s_fast admitted %d of 150", got)
	}
	if got := countAllowed(t, eu, "s_small", 90); got != 90 {
		t.Fatalf("s_small admitted %d of 90", got)
	}
	clock.AdvanceBy(time.Second)
	reps := counters()
	if len(reps) != 1 || reps[0].Key != "s_fast" || reps[0].Denied != 0 || math.Abs(reps[0].Admitted-0.05) > 1e-9 || reps[0].Counted != time.Second {
		t.Fatalf("counters reported: %+v; want s_fast alone, 50 admitted while pressed, counted for 1s", reps)
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

// TestElasticHoldsBackWhatOthersMayHaveAdmitted: in elastic mode a region
// borrows the slack it sees less what the other regions may have admitted
// of the counter over the copy's lag, each at the pace this region admits
// it: a counter that goes fast borrows less, a slow one all of it.
func TestElasticHoldsBackWhatOthersMayHaveAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		elapsed time.Duration // into the hour's window when the checks come
		want    int
	}{
		// 1,000 checks one second into the window: at n admitted,
		// us may have admitted n/2 meanwhile (500ms of lag); the
		// region stops at n + n/2 >= 990: 660.
		{"fast", time.Second, 660},
		// Half an hour in: n/3600 in flight, nothing.
		{"slow", 30 * time.Minute, 990},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newVirtualClock()
			eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}, Lag: 500 * time.Millisecond}},
				mustParse(t, globalRules))
			clock.AdvanceBy(tc.elapsed)
			eu.HeardFrom("us")
			if !eu.SetBudget(elasticDoc(clock.Now(), nil)) {
				t.Fatal("the document was not taken")
			}
			if got := countAllowed(t, eu, "e_acme", 1000); got != tc.want {
				t.Fatalf("admitted %d, want %d", got, tc.want)
			}
		})
	}
}

// TestElasticCounterWithItsOwnBudgetKeepsWithinTheLimit: a counter that
// got a budget of its own after the other regions borrowed (their use is
// not in its leases) keeps to its allowance only while the global count
// the region sees is within the limit.
func TestElasticCounterWithItsOwnBudgetKeepsWithinTheLimit(t *testing.T) {
	clock := newVirtualClock()
	regions := []string{"eu", "us"}
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: regions, Lag: noLag}}, mustParse(t, globalRules))
	us := New(Config{Region: "us", Clock: clock.Now, Global: GlobalConfig{Regions: regions, Lag: noLag}}, mustParse(t, globalRules))
	eu.HeardFrom("us")
	us.HeardFrom("eu")
	// us borrows 700 of e_acme before it has a budget of its own.
	if got := countAllowed(t, us, "e_acme", 700); got != 700 {
		t.Fatalf("us admitted %d of 700, borrowing", got)
	}
	if _, err := eu.MergeRemote(t.Context(), us.OwnDeltas(0, 0)[0]); err != nil {
		t.Fatal(err)
	}
	if !eu.SetBudget(elasticDoc(clock.Now(), map[string]map[string]budget.CounterLeaseDoc{"e_acme": {"eu": {Floor: 0.02, Share: 0.58}, "us": {Floor: 0.02, Share: 0.38}}})) {
		t.Fatal("the document was not taken")
	}
	if got := countAllowed(t, eu, "e_acme", 1000); got != 300 {
		t.Fatalf("e_acme in eu, with its own lease of 60%% and us's 700 seen, admitted %d: want 300, up to the limit", got)
	}
}

// TestElasticCounterGivesUpWhatAnotherAdmittedOverItsLease: leases of a
// counter's own budget are shared out on usage seen a gossip round late,
// and a region that borrowed until it took its lease may have admitted more
// than that lease. The regions still within their leases give up what it
// admitted over it, each in proportion to its lease, so that together they
// keep to the limit; seeing the global count within the limit is not
// enough, since each of them fills its own lease meanwhile.
func TestElasticCounterGivesUpWhatAnotherAdmittedOverItsLease(t *testing.T) {
	clock := newVirtualClock()
	regions := []string{"ap", "eu", "us"}
	engines := map[string]*Engine{}
	for _, r := range regions {
		engines[r] = New(Config{Region: r, Clock: clock.Now, Global: GlobalConfig{Regions: regions, Lag: noLag}}, mustParse(t, globalRules))
		for _, o := range regions {
			engines[r].HeardFrom(o)
		}
	}
	// us borrows 300 of e_acme before it has a budget of its own; its
	// lease, from usage seen earlier, is 200.
	if got := countAllowed(t, engines["us"], "e_acme", 300); got != 300 {
		t.Fatalf("us admitted %d of 300, borrowing", got)
	}
	leases := map[string]map[string]budget.CounterLeaseDoc{"e_acme": {
		"us": {Floor: 0.02, Share: 0.18}, "eu": {Floor: 0.02, Share: 0.38}, "ap": {Floor: 0.02, Share: 0.38}}}
	for _, r := range []string{"eu", "ap"} {
		if _, err := engines[r].MergeRemote(t.Context(), engines["us"].OwnDeltas(0, 0)[0]); err != nil {
			t.Fatal(err)
		}
		if !engines[r].SetBudget(elasticDoc(clock.Now(), leases)) {
			t.Fatal("the document was not taken")
		}
	}
	// 400 + 300 + 400 may be admitted in all, 100 over the limit: eu and
	// ap, with 400 each, give up 50 each.
	total := 300
	for _, r := range []string{"eu", "ap"} {
		got := countAllowed(t, engines[r], "e_acme", 1000)
		if got != 350 {
			t.Errorf("e_acme in %s, with its own lease of 40%% and us's 300 seen over its 20%%, admitted %d: want 350", r, got)
		}
		total += got
	}
	if total > 1000 {
		t.Errorf("admitted %d in all, over the limit of 1,000", total)
	}
}

// TestElasticPaceCountsWhatWasDenied: a region denied a counter for a
// while admitted less than it was asked for; the pace it holds back for is
// what it was asked for since it first denied it.
func TestElasticPaceCountsWhatWasDenied(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}, Lag: 500 * time.Millisecond}},
		mustParse(t, globalRules))
	clock.AdvanceBy(time.Second)
	// Not heard from us: its floor of 50, 950 denied.
	if got := countAllowed(t, eu, "e_acme", 1000); got != 50 {
		t.Fatalf("before hearing from us eu admitted %d, want its floor of 50", got)
	}
	clock.AdvanceBy(time.Second)
	eu.HeardFrom("us")
	// Denied 949 more over the second since it was first denied (the
	// first denial begins the count): 474 may be in flight from us; it
	// borrows up to 990 - 474 = 516 (its own pace alone, 50 in two
	// seconds, would have held back 12).
	if got := countAllowed(t, eu, "e_acme", 1000); got != 516-50 {
		t.Fatalf("eu admitted %d more, want %d", got, 516-50)
	}
}

// elasticDoc is a budget document of g-elastic issued at now, for ten
// seconds: eu's lease of the rule is 20%, and counters lists the counters'
// own leases.
func elasticDoc(now time.Time, counters map[string]map[string]budget.CounterLeaseDoc) budget.Document {
	expires := now.Add(10 * time.Second)
	return budget.Document{Rule: "g-elastic", Seq: 1, Issued: now,
		Leases:   map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: 0.15, Expires: expires}},
		Counters: counters, CounterExpires: expires}
}

// TestForgedBudgetHoldsNoLongerThanALease: a budget document forged with
// a far higher Seq and a lease that expires in 2100 is taken (nothing but
// NATS's permissions tells it from the leader's), but its lease holds no
// longer than a real one could, and once it lapses the leader's
// documents, of lower Seq, are taken again.
func TestForgedBudgetHoldsNoLongerThanALease(t *testing.T) {
	clock := newVirtualClock()
	bc := budget.DefaultConfig() // leases of 10 s, 500 ms of skew
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}, Budget: bc}}, mustParse(t, globalRules))
	doc := func(seq uint64, share float64, expires time.Time) budget.Document {
		return budget.Document{Rule: "g-strict", Seq: seq, Issued: clock.Now(),
			Leases: map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: share, Expires: expires}}}
	}
	if !eu.SetBudget(doc(7, 0.25, clock.Now().Add(bc.LeaseTTL))) {
		t.Fatal("the leader's document was not taken")
	}
	forged := doc(1<<60, 0.95, time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))
	if !eu.SetBudget(forged) {
		t.Fatal("the forged document was not taken")
	}
	if l, _, _ := eu.Lease("g-strict"); l.Expires.After(clock.Now().Add(bc.LeaseTTL + bc.Skew)) {
		t.Fatalf("the forged lease expires %v: want no later than a real one", l.Expires)
	}
	clock.AdvanceBy(time.Second)
	if eu.SetBudget(doc(8, 0.30, clock.Now().Add(bc.LeaseTTL))) {
		t.Fatal("a lower Seq was taken while the forged lease held")
	}
	clock.AdvanceBy(bc.LeaseTTL)
	if got, holds := eu.GlobalAllowance("g-strict"); holds || got >= 0.30 {
		t.Fatalf("after a lease's time: allowance %v (holds %v), want the floor", got, holds)
	}
	if !eu.SetBudget(doc(9, 0.30, clock.Now().Add(bc.LeaseTTL))) {
		t.Fatal("the leader's document, once the forged lease lapsed, was not taken")
	}
	if got, holds := eu.GlobalAllowance("g-strict"); !holds || math.Abs(got-0.35) > 1e-9 {
		t.Fatalf("the leader's lease: allowance %v (holds %v), want 0.35", got, holds)
	}
}

// TestLowerSeqOnceLeasesLapse: a region that knows no lease time (regiond
// is given none: it caps what it takes at the longest globalsync issues)
// takes a document numbered below the one it holds once that one's leases
// have lapsed — a globalsync that forgot a rule, idle for minutes, and
// numbers it anew — not five minutes later.
func TestLowerSeqOnceLeasesLapse(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	doc := func(seq uint64, share float64) budget.Document {
		return budget.Document{Rule: "g-strict", Seq: seq, Issued: clock.Now(),
			Leases: map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: share, Expires: clock.Now().Add(10 * time.Second)}}}
	}
	if !eu.SetBudget(doc(132, 0.6)) {
		t.Fatal("the first document was not taken")
	}
	clock.AdvanceBy(5 * time.Second)
	if eu.SetBudget(doc(3, 0.4)) {
		t.Fatal("a lower Seq was taken while the held lease held")
	}
	clock.AdvanceBy(2 * time.Minute)
	if !eu.SetBudget(doc(4, 0.4)) {
		t.Fatal("a lower Seq was not taken two minutes after the held lease lapsed")
	}
	if got, holds := eu.GlobalAllowance("g-strict"); !holds || math.Abs(got-0.45) > 1e-9 {
		t.Fatalf("allowance %v (holds %v), want the new lease's 0.45", got, holds)
	}
}
