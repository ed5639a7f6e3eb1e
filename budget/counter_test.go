package budget

import (
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// counterRegion is a region as the allocator cannot see it, enforcing a
// rule on one counter k, which may have a budget of its own, and on the
// rule's other counters: the documents it took, its clock's offset, and
// the most it may have counted per window, of k and of the others.
type counterRegion struct {
	name   string
	offset time.Duration
	docSeq uint64
	rule   []received
	// counter is k's lease held (nil: k is on the rule's lease), released
	// when it goes back to the rule; got lists when each arrived.
	counter  *Lease
	released time.Time
	got      []received
	acked    uint64
	kAcked   uint64
	used     map[int64]float64 // the rule's other counters
	kUsed    map[int64]float64
	// kRule is what k may have used while on the rule's lease: the
	// rule's report counts k only then (a region reports a counter with
	// a budget of its own apart).
	kRule map[int64]float64
}

// take puts a budget document (one rebalance's leases for this region) in
// force, whole, as the region does; an older one than it holds is ignored.
func (m *counterRegion) take(doc []Lease, at time.Time) {
	if len(doc) == 0 || doc[0].Seq <= m.docSeq {
		return
	}
	m.docSeq = doc[0].Seq
	hasK := false
	for _, l := range doc {
		switch {
		case l.Key == "":
			m.rule = append(m.rule, received{l, at})
		case !l.Released.IsZero() && !l.Last():
			// Released: the lease held, or the rule's floor, until then
			// — a last lease held, until its own release.
			hasK = true
			if m.counter == nil || !m.counter.Last() {
				m.released = l.Released
			}
		default:
			// A lease, or the last, held until its release.
			hasK = true
			m.counter, m.released = &l, l.Released
			m.got = append(m.got, received{l, at})
		}
	}
	if !hasK {
		m.counter, m.got, m.released = nil, nil, time.Time{}
	}
}

// kEnforced is what the region enforces on k at true time t.
func (m *counterRegion) kEnforced(t time.Time, floor float64) float64 {
	local := t.Add(m.offset)
	if !m.released.IsZero() && !local.Before(m.released) {
		m.counter, m.got, m.released = nil, nil, time.Time{}
	}
	if m.counter != nil {
		return Allowance(m.counter, m.counter.Floor, local)
	}
	if !m.released.IsZero() {
		return floor
	}
	return Allowance(newestOf(m.rule), floor, local)
}

// TestCounterBudgetsNeverOverCommit drives the allocator with one rule whose
// counter k gets, loses and gets again a budget of its own as its demand
// comes and goes, with leases late, lost, reordered and lapsing, leader
// changes and skewed clocks; every region uses all it may. In no window may
// the regions together use more than the limit, of k or of any other
// counter.
func TestCounterBudgetsNeverOverCommit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, cfg, rule, names, offsets := drawModel(t, 8000, 4)
		n := len(names)
		regions := make([]*counterRegion, n)
		for i := range regions {
			regions[i] = &counterRegion{name: names[i], offset: offsets[i], used: map[int64]float64{}, kUsed: map[int64]float64{},
				kRule: map[int64]float64{}}
		}
		floor := cfg.Floor(n)
		type pending struct {
			region int
			doc    []Lease
			due    int
		}
		var queue []pending
		var issued []Lease
		var lastTick time.Time
		const timeout = 50 * time.Millisecond
		now := t0
		for step := range rapid.IntRange(1, 80).Draw(t, "steps") {
			for _, m := range regions {
				if !rapid.Bool().Draw(t, "report") {
					continue
				}
				e := epochOf(now.Add(m.offset), rule.Window)
				rep := Report{Region: m.name, Demand: rapid.Float64Range(0, 3).Draw(t, "demand")}
				for _, r := range m.rule {
					if !r.at.After(now.Add(-timeout)) {
						rep.Acked = max(rep.Acked, r.lease.Seq)
					}
				}
				if rep.Acked > m.acked {
					m.acked = rep.Acked
					// The most any counter on the rule's lease used: k's
					// too while it was.
					rep.Used, rep.UsedEpoch, rep.HasUsed = max(m.used[e], m.kRule[e]), e, true
					if rule.Sliding && rapid.Bool().Draw(t, "prev") {
						rep.PrevUsed, rep.HasPrev = max(m.used[e-1], m.kRule[e-1]), true
					}
				} else {
					rep.Acked = m.acked
				}
				a.Report(rule.ID, rep)
				if !rapid.Bool().Draw(t, "report k") {
					continue
				}
				kr := Report{Region: m.name, Demand: rapid.Float64Range(0, 3).Draw(t, "k demand") * float64(rapid.IntRange(0, 1).Draw(t, "k idle"))}
				if m.counter != nil {
					for _, r := range m.got {
						if !r.at.After(now.Add(-timeout)) && r.lease.Seq <= m.counter.Seq {
							kr.Acked = max(kr.Acked, r.lease.Seq)
						}
					}
				}
				if kr.Acked > m.kAcked {
					m.kAcked = kr.Acked
					kr.Used, kr.UsedEpoch, kr.HasUsed = m.kUsed[e], e, true
					if rule.Sliding && rapid.Bool().Draw(t, "k prev") {
						kr.PrevUsed, kr.HasPrev = m.kUsed[e-1], true
					}
				}
				a.ReportCounter(rule.ID, "k", kr)
			}
			if rapid.IntRange(0, 20).Draw(t, "evict") == 0 {
				// Another counter takes k's place.
				a.Release(rule.ID, "k", now)
			}
			if rapid.IntRange(0, 15).Draw(t, "leader change") == 0 {
				b, _ := NewAllocator(cfg)
				var live []Lease
				for _, l := range issued {
					if l.Expires.After(lastTick.Add(-cfg.Skew)) {
						live = append(live, l)
					}
				}
				b.Restore(rule.ID, live)
				b.RestoreSnapshot(rule.ID, a.Snapshot(rule.ID))
				a = b
			}
			leases, err := a.Rebalance(now, rule, names)
			if err != nil {
				t.Fatal(err)
			}
			issued, lastTick = append(issued, leases...), now
			kSum := 0.0
			docs := make([][]Lease, n)
			for _, l := range leases {
				i := int(l.Region[0] - 'a')
				docs[i] = append(docs[i], l)
				if l.Key != "" {
					if l.Key != "k" || l.Floor < 0 || l.Share < 0 || (l.Floor > floor+1e-9 && !l.Last()) {
						t.Fatalf("counter lease %+v", l)
					}
					kSum += l.Allowance()
				}
			}
			if kSum > 1+1e-9 {
				t.Fatalf("k's leases sum to %v", kSum)
			}
			for i, doc := range docs {
				if rapid.IntRange(0, 9).Draw(t, "lost") > 0 {
					queue = append(queue, pending{i, doc, step + rapid.IntRange(0, 3).Draw(t, "delay")})
				}
			}
			kept := queue[:0]
			for _, p := range queue {
				if p.due > step {
					kept = append(kept, p)
					continue
				}
				regions[p.region].take(p.doc, now)
			}
			queue = kept
			dt := time.Duration(rapid.IntRange(50, 2000).Draw(t, "dt_ms")) * time.Millisecond
			for _, m := range regions {
				// Until the next step a region's allowance only falls
				// (as leases lapse), but where k goes back to the
				// rule's lease, which is at a window's start: the most
				// it may use in each window it meets is what it may
				// use as it enters.
				windowsMet(rule.Window, now, dt, m.offset, func(e int64, enter time.Time) {
					m.used[e] = max(m.used[e], Allowance(newestOf(m.rule), floor, enter.Add(m.offset)))
					k := m.kEnforced(enter, floor)
					m.kUsed[e] = max(m.kUsed[e], k)
					if m.counter == nil && m.released.IsZero() {
						m.kRule[e] = max(m.kRule[e], k)
					}
				})
			}
			now = now.Add(dt)
		}
		kUsed, used := make([]map[int64]float64, n), make([]map[int64]float64, n)
		for i, m := range regions {
			kUsed[i], used[i] = m.kUsed, m.used
		}
		checkWindows(t, rule.Sliding, "k's limit", kUsed)
		checkWindows(t, rule.Sliding, "the limit of the rule's other counters", used)
	})
}

// TestCounterFollowsItsOwnDemand: two tenants of one rule, each homed in
// one region, get nearly all of their own limit there, where the rule's
// shares would give each half.
func TestCounterFollowsItsOwnDemand(t *testing.T) {
	a, err := NewAllocator(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "per-tenant", Window: time.Minute}
	names := []string{"eu", "us"}
	home := map[string]string{"acme": "us", "globex": "eu"}
	held := map[string]map[string]*Lease{} // key → region → lease
	var leases []Lease
	for i := range 6 {
		now := t0.Add(time.Duration(i) * time.Second)
		e := epochOf(now, rule.Window)
		for _, r := range names {
			a.Report(rule.ID, Report{Region: r, Demand: 0.1})
			for key, h := range home {
				rep := Report{Region: r}
				if h == r {
					rep.Demand = 2
				}
				if l := held[key][r]; l != nil {
					rep.Acked, rep.HasUsed, rep.UsedEpoch = l.Seq, true, e
				}
				a.ReportCounter(rule.ID, key, rep)
			}
		}
		leases, err = a.Rebalance(now, rule, names)
		if err != nil {
			t.Fatal(err)
		}
		for i := range leases {
			l := &leases[i]
			if l.Key != "" {
				if held[l.Key] == nil {
					held[l.Key] = map[string]*Lease{}
				}
				held[l.Key][l.Region] = l
			}
		}
	}
	for key, h := range home {
		got := held[key][h].Allowance()
		if got < 0.97 {
			t.Errorf("%s in its home %s: allowance %.3f, want at least 0.97", key, h, got)
		}
		sum := 0.0
		for _, r := range names {
			sum += held[key][r].Allowance()
		}
		if sum > 1+1e-9 {
			t.Errorf("%s: allowances sum to %v", key, sum)
		}
	}
	if got := a.Counters(rule.ID); len(got) != 2 {
		t.Errorf("counters with budgets of their own: %v", got)
	}
	// Idle: once every lease has lapsed and every region may have gone
	// back to the rule, the counters go too.
	now := t0.Add(6 * time.Second)
	for range 200 {
		now = now.Add(time.Second)
		for _, r := range names {
			a.Report(rule.ID, Report{Region: r, Demand: 0.1})
			for key := range home {
				a.ReportCounter(rule.ID, key, Report{Region: r})
			}
		}
		if _, err := a.Rebalance(now, rule, names); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Counters(rule.ID); len(got) != 0 {
		t.Errorf("idle counters still served on their own: %v", got)
	}
}

// TestUnheardRegionKeepsTheRuleFloor: a counter gets a budget of its own
// from one region's report; a region that has not yet said what it asks
// of the counter keeps the rule's floor of it meanwhile (a tenant's spill
// there is not denied while its report comes), and once it says it asks
// nothing, its floor goes to the regions that do.
func TestUnheardRegionKeepsTheRuleFloor(t *testing.T) {
	cfg := DefaultConfig()
	a, err := NewAllocator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "per-tenant", Window: time.Minute}
	names := []string{"ap", "eu", "us"}
	floorOf := func(leases []Lease, region string) float64 {
		for _, l := range leases {
			if l.Key == "acme" && l.Region == region {
				return l.Floor
			}
		}
		t.Fatalf("no lease of acme for %s in %+v", region, leases)
		return 0
	}
	for _, r := range names {
		a.Report(rule.ID, Report{Region: r, Demand: 0.5})
	}
	a.ReportCounter(rule.ID, "acme", Report{Region: "us", Demand: 2})
	leases, err := a.Rebalance(t0, rule, names)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"ap", "eu"} {
		if got := floorOf(leases, r); got != cfg.Floor(len(names)) {
			t.Errorf("%s, not heard of acme yet: floor %v, want the rule's %v", r, got, cfg.Floor(len(names)))
		}
	}
	now := t0.Add(time.Second)
	for _, r := range names {
		a.Report(rule.ID, Report{Region: r, Demand: 0.5})
		rep := Report{Region: r}
		if r == "us" {
			rep.Demand = 2
		}
		a.ReportCounter(rule.ID, "acme", rep)
	}
	if leases, err = a.Rebalance(now, rule, names); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"ap", "eu"} {
		if got := floorOf(leases, r); got != 0 {
			t.Errorf("%s, asking nothing of acme: floor %v, want 0", r, got)
		}
	}
	if got := floorOf(leases, "us"); got <= 0 {
		t.Errorf("us, asking all of acme: floor %v, want above 0", got)
	}
}

// TestCounterLeavesWhatRegionsWereSeenToUse: in elastic mode a region may
// have borrowed of a counter before it had a budget of its own, more than
// any lease; what the gossip shows it used stays its (whether or not it
// reported the counter, the most of what it said and what was seen), and
// the others get only the rest.
func TestCounterLeavesWhatRegionsWereSeenToUse(t *testing.T) {
	a, err := NewAllocator(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "per-tenant", Window: time.Minute}
	names := []string{"eu", "us"}
	now := t0.Add(10 * time.Second)
	e := epochOf(now, rule.Window)
	for _, r := range names {
		a.Report(rule.ID, Report{Region: r, Demand: 0.5})
	}
	a.ReportCounter(rule.ID, "acme", Report{Region: "us", Demand: 5})
	a.CounterUseSeen(rule.ID, "acme", "eu", e, 0.4)   // borrowed, seen by the gossip
	a.CounterUseSeen(rule.ID, "acme", "us", e-1, 0.9) // of the window before: nothing now
	leases, err := a.Rebalance(now, rule, names)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, l := range leases {
		if l.Key == "acme" {
			got[l.Region] = l.Allowance()
		}
	}
	if got["eu"] < 0.4-1e-9 || got["us"] > 0.6+1e-9 || got["us"] <= 0 {
		t.Fatalf("acme's allowances %v: want eu at least the 0.4 it used, us the rest at most", got)
	}
}

// TestCounterRoomMovesInsideAWindow: a tenant's demand moves from us to eu
// inside an hour window; once us acknowledges its lower lease and says
// what it used, eu gets the rest of the limit within three rebalances.
func TestCounterRoomMovesInsideAWindow(t *testing.T) {
	for _, sliding := range []bool{false, true} {
		a, _ := NewAllocator(DefaultConfig())
		rule := Rule{ID: "hourly", Window: time.Hour, Sliding: sliding}
		names := []string{"eu", "us"}
		demand := map[string]float64{"us": 2}
		used := map[string]float64{"us": 0.3}
		held := map[string]*Lease{}
		rebalance := func(now time.Time) {
			for _, r := range names {
				a.Report(rule.ID, Report{Region: r})
				rep := Report{Region: r, Demand: demand[r]}
				if l := held[r]; l != nil {
					rep.Acked, rep.HasUsed, rep.UsedEpoch, rep.Used = l.Seq, true, epochOf(now, rule.Window), used[r]
					rep.HasPrev = true // nothing the window before
				}
				a.ReportCounter(rule.ID, "acme", rep)
			}
			ls, err := a.Rebalance(now, rule, names)
			if err != nil {
				t.Fatal(err)
			}
			for i := range ls {
				if ls[i].Key == "acme" {
					held[ls[i].Region] = &ls[i]
				}
			}
		}
		start := time.Unix(1_800_000_000/3600*3600, 0).Add(10 * time.Minute)
		for i := range 4 {
			rebalance(start.Add(time.Duration(i) * time.Second))
		}
		if sliding {
			// A sliding estimate carries the window before, in which
			// eu may have used its floor of the rule: a window later,
			// us may have it all.
			start = start.Add(time.Hour)
			for i := range 3 {
				rebalance(start.Add(time.Duration(i) * time.Second))
			}
		}
		if got := held["us"].Allowance(); got < 0.97 {
			t.Fatalf("sliding %v: us holds %.3f, want nearly all", sliding, got)
		}
		// The demand moves to eu, twenty minutes into the hour.
		demand = map[string]float64{"eu": 2}
		at := start.Add(10 * time.Minute)
		for i := range 3 {
			rebalance(at.Add(time.Duration(i) * time.Second))
		}
		// us keeps what it used (its lease may be lower: it has used
		// it); eu may use the rest, and no more.
		if us, eu := held["us"].Allowance(), held["eu"].Allowance(); eu < 1-used["us"]-0.03 || eu > 1-used["us"]+1e-9 {
			t.Fatalf("sliding %v: after the move, us %.3f eu %.3f: want eu ≈ %.2f", sliding, us, eu, 1-used["us"])
		}
	}
}

// TestRevert: a lease goes back to the rule at the first window that starts
// after it lapsed, the skew allowance past; a window later when sliding.
func TestRevert(t *testing.T) {
	l := Lease{Expires: time.Unix(100, 0).Add(300 * time.Millisecond)}
	if got := Revert(&l, time.Second, false, 500*time.Millisecond); !got.Equal(time.Unix(101, 0)) {
		t.Fatalf("fixed: %v", got)
	}
	if got := Revert(&l, time.Second, true, 500*time.Millisecond); !got.Equal(time.Unix(102, 0)) {
		t.Fatalf("sliding: %v", got)
	}
	if got := Revert(&l, time.Minute, false, 0); !got.Equal(time.Unix(120, 0)) {
		t.Fatalf("minute: %v", got)
	}
}

// TestCounterEviction: with every budget of its own taken, a counter that
// would gain more gets one once the one that would lose least is
// released (not one asking for its limit or more); the released one gets
// its last leases, each floor as high as its lease and saying when it goes
// back to the rule — at the first window after they lapse — and goes then.
func TestCounterEviction(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Counters = 2
	a, _ := NewAllocator(cfg)
	rule := Rule{ID: "r", Window: time.Second}
	names := []string{"eu", "us"}
	report := func(demand map[string]float64) {
		for key, d := range demand {
			a.ReportCounter(rule.ID, key, Report{Region: "us", Demand: d})
		}
	}
	now := t0
	report(map[string]float64{"a": 0.6, "b": 0.7})
	if _, err := a.Rebalance(now, rule, names); err != nil {
		t.Fatal(err)
	}
	report(map[string]float64{"a": 0.6, "b": 0.7, "c": 3})
	if got := a.Counters(rule.ID); len(got) != 2 || !a.Full(rule.ID) {
		t.Fatalf("counters %v, full %v: want a and b, full", got, a.Full(rule.ID))
	}
	weak, g, ok := a.Weakest(rule.ID)
	if want := a.Gain(rule.ID, map[string]float64{"us": 0.6}); !ok || weak != "a" || g != want {
		t.Fatalf("weakest %q %v %v, want a %v", weak, g, ok, want)
	}
	a.Release(rule.ID, "a", now)
	if a.Full(rule.ID) {
		t.Fatal("still full after a release")
	}
	if weak, _, ok := a.Weakest(rule.ID); !ok || weak != "b" {
		t.Fatalf("weakest after a's release: %q %v, want b", weak, ok)
	}
	report(map[string]float64{"c": 3})
	if got := a.Counters(rule.ID); len(got) != 3 {
		t.Fatalf("counters %v, want a (released), b and c", got)
	}
	now = now.Add(time.Second)
	ls, err := a.Rebalance(now, rule, names)
	if err != nil {
		t.Fatal(err)
	}
	lastSum := 0.0
	for _, l := range ls {
		if l.Key != "a" {
			continue
		}
		if want := Revert(&l, rule.Window, false, cfg.Skew); !l.Released.Equal(want) || l.Share != 0 {
			t.Fatalf("a's last lease %+v: want floor as high as the lease, released at %v", l, want)
		}
		lastSum += l.Floor
	}
	if lastSum < 0.5 || lastSum > 1+1e-9 {
		t.Fatalf("a's last leases' floors sum to %v, want what a had (at least its demand) and no more than the limit", lastSum)
	}
	a.Release(rule.ID, "b", now)
	if weak, _, ok := a.Weakest(rule.ID); ok {
		t.Fatalf("weakest %q: c, asking for 3 limits, may not be evicted", weak)
	}
	var released bool
	for range 30 {
		now = now.Add(time.Second)
		report(map[string]float64{"c": 3})
		ls, err := a.Rebalance(now, rule, names)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			released = released || (l.Key == "a" && !l.Released.IsZero())
			if l.Key == "a" && l.Released.IsZero() {
				t.Fatalf("a got a lease after its release: %+v", l)
			}
		}
	}
	if got := a.Counters(rule.ID); !released || len(got) != 1 || got[0] != "c" {
		t.Fatalf("released %v, counters %v: want a and b released, then gone", released, got)
	}
}

// TestFitCounters: a rule whose document may hold n counters sheds those
// that would lose least (never one asking for its limit or more) and takes
// no new one while it holds n; released from the bound, it takes them.
func TestFitCounters(t *testing.T) {
	a, _ := NewAllocator(DefaultConfig())
	rule := Rule{ID: "r", Window: time.Second}
	names := []string{"eu", "us"}
	demand := map[string]float64{"a": 0.5, "b": 0.6, "c": 0.7, "d": 0.8, "e": 3}
	report := func(keys ...string) {
		for _, key := range keys {
			a.ReportCounter(rule.ID, key, Report{Region: "us", Demand: demand[key]})
		}
	}
	now := t0
	report("a", "b", "c", "d", "e")
	if _, err := a.Rebalance(now, rule, names); err != nil {
		t.Fatal(err)
	}
	a.FitCounters(rule.ID, 3, now)
	if !a.AtFit(rule.ID) || !a.Full(rule.ID) {
		t.Fatal("5 counters, room for 3: want at fit, full")
	}
	live := func() []string {
		var out []string
		for _, k := range a.Counters(rule.ID) {
			if c := a.rules[rule.ID].counters[k].counter; c.released.IsZero() && !c.evicted {
				out = append(out, k)
			}
		}
		return out
	}
	if got := live(); !slices.Equal(got, []string{"c", "d", "e"}) {
		t.Fatalf("budgets kept %v, want c d e (a and b would lose least)", got)
	}
	a.FitCounters(rule.ID, 0, now)
	report("a")
	a.FitCounters(rule.ID, 1, now)
	if got := live(); !slices.Equal(got, []string{"e"}) {
		t.Fatalf("room for 1: budgets kept %v, want e alone (asking for 3 limits, never shed)", got)
	}
	for range 30 {
		now = now.Add(time.Second)
		report("a", "b", "c", "d", "e")
		if _, err := a.Rebalance(now, rule, names); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Counters(rule.ID); !slices.Equal(got, []string{"e"}) {
		t.Fatalf("room for 1, the others gone back: counters %v, want e alone", got)
	}
	a.FitCounters(rule.ID, 0, now)
	report("a", "b")
	if got := a.Counters(rule.ID); !slices.Equal(got, []string{"a", "b", "e"}) {
		t.Fatalf("no bound: counters %v, want a b e", got)
	}
}

// TestWeakestNotNew: a counter that got its budget since the last
// rebalance, for what it would gain, is not taken back for the next
// candidate of the same rebalance (it has no smoothed demand yet, and
// would look as if it gained nothing).
func TestWeakestNotNew(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Counters = 2
	a, _ := NewAllocator(cfg)
	rule := Rule{ID: "r", Window: time.Second}
	for key, d := range map[string]float64{"a": 0.6, "b": 0.7} {
		a.ReportCounter(rule.ID, key, Report{Region: "us", Demand: d})
	}
	if _, err := a.Rebalance(t0, rule, []string{"eu", "us"}); err != nil {
		t.Fatal(err)
	}
	a.Release(rule.ID, "a", t0)
	a.ReportCounter(rule.ID, "d", Report{Region: "us", Demand: 0.9})
	if got := a.Counters(rule.ID); !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Fatalf("counters %v, want a (released), b and d", got)
	}
	if w := a.WeakestN(rule.ID, 5); len(w) != 1 || w[0].Key != "b" {
		t.Fatalf("weakest %v, want b alone (a released, d new)", w)
	}
}

// TestManyCountersRebalanceAsOneByOne: a rule's counters rebalanced in
// parallel chunks (thousands of them) get the same leases, in the same
// order, and leave the same snapshot, as one by one on one goroutine;
// counters falling idle go back to the rule from any chunk. (With -race,
// it also shows the chunks touch nothing in common.)
func TestManyCountersRebalanceAsOneByOne(t *testing.T) {
	rule := Rule{ID: "tenant-global", Window: 10 * time.Second}
	regions := []string{"ap-south", "eu-west", "sa-east", "us-east", "us-west"}
	keys := make([]string, 5*minChunk)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	play := func(procs int) (rounds [][]Lease, snaps []Snapshot, left int) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		cfg := DefaultConfig()
		cfg.Counters = len(keys)
		a, err := NewAllocator(cfg)
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		var seq uint64
		for round := range 8 {
			reportTenants(a, rule, regions, keys, seq, now, func(k int) (float64, bool) {
				// Idle from the third round on, one in seven: released,
				// then back to the rule.
				return 0.05 * float64(1+k%3), round < 2 || k%7 != 0
			})
			ls, err := a.Rebalance(now, rule, regions)
			if err != nil {
				t.Fatal(err)
			}
			seq = ls[0].Seq
			rounds = append(rounds, ls)
			snaps = append(snaps, a.Snapshot(rule.ID))
			now = now.Add(7 * time.Second)
		}
		return rounds, snaps, len(a.Counters(rule.ID))
	}
	oneRounds, oneSnaps, oneLeft := play(1)
	manyRounds, manySnaps, manyLeft := play(4)
	if oneLeft != manyLeft || oneLeft >= len(keys) || oneLeft < len(keys)/2 {
		t.Fatalf("%d and %d counters left with budgets of their own, want the same, fewer than %d (the idle ones back to the rule)", oneLeft, manyLeft, len(keys))
	}
	for i := range oneRounds {
		if len(oneRounds[i]) < len(keys) {
			t.Fatalf("round %d: %d leases, want one a region for each counter", i, len(oneRounds[i]))
		}
		if !reflect.DeepEqual(oneRounds[i], manyRounds[i]) {
			t.Fatalf("round %d: the leases differ in parallel (%d against %d)", i, len(manyRounds[i]), len(oneRounds[i]))
		}
		if !reflect.DeepEqual(oneSnaps[i], manySnaps[i]) {
			t.Fatalf("round %d: the snapshots differ in parallel", i)
		}
	}
}
