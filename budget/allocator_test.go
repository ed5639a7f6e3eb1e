package budget

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Unix(1_800_000_000, 0).UTC()

// modelRegion is a region as the allocator cannot see it: the leases it
// received, its clock's offset, and what it has enforced per window.
type modelRegion struct {
	name     string
	offset   time.Duration
	received []received
	acked    uint64
	used     map[int64]float64 // window → the most it enforced, so the most it may have counted
}

type received struct {
	lease Lease
	at    time.Time
}

// enforced is what the region enforces at true time t: the newest lease it
// received (by Seq: one that arrives after a newer one is ignored) while it
// holds by the region's clock, or its floor.
func (m *modelRegion) enforced(t time.Time, floor float64) float64 {
	return Allowance(newestOf(m.received), floor, t.Add(m.offset))
}

// newestOf is the newest lease received by Seq.
func newestOf(rs []received) *Lease {
	var n *Lease
	for i := range rs {
		if l := &rs[i].lease; n == nil || l.Seq > n.Seq {
			n = l
		}
	}
	return n
}

func epochOf(t time.Time, window time.Duration) int64 {
	return int64(math.Floor(float64(t.UnixMicro()) / float64(window.Microseconds())))
}

// TestStrictNeverOverCommits drives the allocator with regions whose
// leases arrive late or never, whose clocks are off by up to the skew
// allowance, and which always use all they may: in no window may the
// regions together use more than the whole limit.
func TestStrictNeverOverCommits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, cfg, rule, names, offsets := drawModel(t, 15000, 5)
		n := len(names)
		regions := make([]*modelRegion, n)
		for i := range regions {
			regions[i] = &modelRegion{name: names[i], offset: offsets[i], used: map[int64]float64{}}
		}
		floor := cfg.Floor(n)
		type pending struct {
			region int
			lease  Lease
			due    int
		}
		var queue []pending
		var issued []Lease
		var lastTick time.Time
		const timeout = 50 * time.Millisecond
		now := t0
		for step := range rapid.IntRange(1, 60).Draw(t, "steps") {
			// Reports, as of just before now.
			for _, m := range regions {
				if !rapid.Bool().Draw(t, "report") {
					continue
				}
				rep := Report{Region: m.name, Demand: rapid.Float64Range(0, 3).Draw(t, "demand")}
				for _, r := range m.received {
					if !r.at.After(now.Add(-timeout)) {
						rep.Acked = max(rep.Acked, r.lease.Seq)
					}
				}
				if rep.Acked > m.acked {
					m.acked = rep.Acked
					e := epochOf(now.Add(m.offset), rule.Window)
					// What a region reports: its count in the window
					// it is in, and only that.
					rep.Used, rep.UsedEpoch, rep.HasUsed = m.used[e], e, true
					if rule.Sliding && rapid.Bool().Draw(t, "prev") {
						rep.PrevUsed, rep.HasPrev = m.used[e-1], true
					}
				} else {
					rep.Acked = m.acked
				}
				a.Report(rule.ID, rep)
			}
			if rapid.IntRange(0, 15).Draw(t, "leader change") == 0 {
				// Another allocator takes over (a new globalsync
				// leader): it knows the previous one's snapshot, and
				// every lease that expires after its last rebalance
				// (windows may have begun since, under them).
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
			shares := 0.0
			for i, l := range leases {
				if l.Region != names[i] || l.Floor != floor || l.Share < 0 || l.Debt != 0 {
					t.Fatalf("lease %d: %+v (floor %v)", i, l, floor)
				}
				shares += l.Share
				if rapid.IntRange(0, 9).Draw(t, "lost") > 0 {
					queue = append(queue, pending{i, l, step + rapid.IntRange(0, 3).Draw(t, "delay")})
				}
			}
			if shares > 1-cfg.Reserve+1e-9 {
				t.Fatalf("shares sum to %v, above 1 - reserve %v", shares, 1-cfg.Reserve)
			}
			kept := queue[:0]
			for _, p := range queue {
				if p.due <= step {
					regions[p.region].received = append(regions[p.region].received, received{p.lease, now})
				} else {
					kept = append(kept, p)
				}
			}
			queue = kept
			dt := time.Duration(rapid.IntRange(50, 2000).Draw(t, "dt_ms")) * time.Millisecond
			for _, m := range regions {
				windowsMet(rule.Window, now, dt, m.offset, func(e int64, enter time.Time) {
					m.used[e] = max(m.used[e], m.enforced(enter, floor))
				})
			}
			now = now.Add(dt)
		}
		used := make([]map[int64]float64, n)
		for i, m := range regions {
			used[i] = m.used
		}
		checkWindows(t, rule.Sliding, "the limit", used)
	})
}

// drawModel draws what both models of the allocator share: its settings
// (a lease's life up to maxTTL ms), the rule, and up to maxRegions regions
// with clocks off by up to the skew allowance.
func drawModel(t *rapid.T, maxTTL, maxRegions int) (*Allocator, Config, Rule, []string, []time.Duration) {
	cfg := DefaultConfig()
	cfg.Reserve = rapid.Float64Range(0, 0.5).Draw(t, "reserve")
	cfg.LeaseTTL = time.Duration(rapid.IntRange(500, maxTTL).Draw(t, "ttl_ms")) * time.Millisecond
	cfg.Skew = time.Duration(rapid.IntRange(0, 1000).Draw(t, "skew_ms")) * time.Millisecond
	cfg.Hysteresis = rapid.Float64Range(0, 0.1).Draw(t, "hysteresis")
	cfg.Smoothing = rapid.Float64Range(0.1, 1).Draw(t, "smoothing")
	a, err := NewAllocator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{
		ID:      "r",
		Window:  time.Duration(rapid.IntRange(200, 20000).Draw(t, "window_ms")) * time.Millisecond,
		Sliding: rapid.Bool().Draw(t, "sliding"),
	}
	n := rapid.IntRange(1, maxRegions).Draw(t, "regions")
	names := make([]string, n)
	offsets := make([]time.Duration, n)
	for i := range names {
		names[i] = string(rune('a' + i))
		offsets[i] = time.Duration(rapid.Int64Range(-cfg.Skew.Microseconds(), cfg.Skew.Microseconds()).Draw(t, "offset_us")) * time.Microsecond
	}
	return a, cfg, rule, names, offsets
}

// windowsMet calls use with each window a region whose clock is off by
// offset meets from now until now+dt, and when it enters it (now at the
// latest): until the next step its allowance only falls, so the most it
// may use in each window is what it may use as it enters.
func windowsMet(window time.Duration, now time.Time, dt, offset time.Duration, use func(e int64, enter time.Time)) {
	from, to := epochOf(now.Add(offset), window), epochOf(now.Add(dt+offset-time.Microsecond), window)
	for e := from; e <= to; e++ {
		enter := time.UnixMicro(e * window.Microseconds()).Add(-offset)
		if enter.Before(now) {
			enter = now
		}
		use(e, enter)
	}
}

// checkWindows fails if in any window the regions together may have
// admitted more than the limit (of what): used is each region's most per
// window. A sliding estimate is at most the most the region could admit
// in a window or the one before.
func checkWindows(t *rapid.T, sliding bool, what string, used []map[int64]float64) {
	windows := map[int64]bool{}
	for _, u := range used {
		for e := range u {
			windows[e] = true
		}
	}
	for e := range windows {
		sum := 0.0
		for _, u := range used {
			if sliding {
				sum += max(u[e], u[e-1])
			} else {
				sum += u[e]
			}
		}
		if sum > 1+1e-9 {
			t.Fatalf("window %d: regions together may admit %v of %s", e, sum, what)
		}
	}
}

func TestWaterFill(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 6).Draw(t, "n")
		needs := rapid.SliceOfN(rapid.Float64Range(0, 2), n, n).Draw(t, "needs")
		weights := rapid.SliceOfN(rapid.Float64Range(0, 2), n, n).Draw(t, "weights")
		total := rapid.Float64Range(0, 1).Draw(t, "total")
		got := waterFill(needs, weights, total)
		sum, needed := 0.0, 0.0
		for i, g := range got {
			if g < 0 {
				t.Fatalf("negative share %v", g)
			}
			sum += g
			needed += needs[i]
		}
		if math.Abs(sum-total) > 1e-9 {
			t.Fatalf("shares sum to %v, want %v", sum, total)
		}
		if needed >= total {
			// Every need is met up to a common level: a region that got
			// less than it needed got at least as much as any other.
			for i := range got {
				if got[i] < needs[i]-1e-9 {
					for j := range got {
						if got[j] > got[i]+1e-9 {
							t.Fatalf("region %d got %v < need %v while %d got %v", i, got[i], needs[i], j, got[j])
						}
					}
				}
			}
		} else {
			for i := range got {
				if got[i] < needs[i]-1e-9 {
					t.Fatalf("region %d got %v, needs %v, with enough for all", i, got[i], needs[i])
				}
			}
		}
	})
}

// steady rebalances n times with every region reporting demand and
// acknowledging the lease it got, having used all of its last allowance.
func steady(t *testing.T, a *Allocator, rule Rule, now time.Time, n int, demand map[string]float64, held map[string]*Lease) []Lease {
	t.Helper()
	names := slices.Sorted(func(yield func(string) bool) {
		for r := range demand {
			if !yield(r) {
				return
			}
		}
	})
	var leases []Lease
	for i := range n {
		at := now.Add(time.Duration(i) * time.Second)
		for _, r := range names {
			rep := Report{Region: r, Demand: demand[r]}
			if l := held[r]; l != nil {
				rep.Acked, rep.HasUsed = l.Seq, true
				rep.Used, rep.UsedEpoch = 0, epochOf(at, rule.Window)
			}
			a.Report(rule.ID, rep)
		}
		var err error
		leases, err = a.Rebalance(at, rule, names)
		if err != nil {
			t.Fatal(err)
		}
		for i := range leases {
			held[leases[i].Region] = &leases[i]
		}
	}
	return leases
}

func sumAllowance(leases []Lease) float64 {
	s := 0.0
	for i := range leases {
		s += leases[i].Allowance()
	}
	return s
}

func TestSharesFollowDemand(t *testing.T) {
	a, err := NewAllocator(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "tenant-global", Window: time.Minute}
	held := map[string]*Lease{}
	leases := steady(t, a, rule, t0, 5, map[string]float64{"ap": 0.1, "eu": 0.6, "us": 1.5}, held)
	if got := sumAllowance(leases); math.Abs(got-1) > 1e-6 {
		t.Fatalf("allowances sum to %v, want the whole limit", got)
	}
	byRegion := map[string]float64{}
	for _, l := range leases {
		byRegion[l.Region] = l.Allowance()
	}
	// ap asks for less than the level and gets what it asks; eu and us
	// both ask for more than the level and share the rest equally.
	if math.Abs(byRegion["ap"]-0.1) > 0.02 || math.Abs(byRegion["us"]-byRegion["eu"]) > 1e-6 {
		t.Fatalf("allowances %v: want ap ≈ 0.1, eu = us", byRegion)
	}

	// Demand moves from us to ap, mid-window: the shares follow within
	// three rebalances, since the regions say they used nothing.
	leases = steady(t, a, rule, t0.Add(5*time.Second), 3, map[string]float64{"ap": 1.5, "eu": 0.6, "us": 0.1}, held)
	for _, l := range leases {
		byRegion[l.Region] = l.Allowance()
	}
	if h := 2 * a.Config().Hysteresis; math.Abs(byRegion["ap"]-byRegion["eu"]) > h || math.Abs(byRegion["us"]-0.1) > h {
		t.Fatalf("after the shift, allowances %v: want ap ≈ eu and us ≈ 0.1", byRegion)
	}
	if got := sumAllowance(leases); got < 0.99 {
		t.Fatalf("after the shift, allowances sum to %v, want at least 0.99", got)
	}
}

func TestCutOffRegionKeepsItsLease(t *testing.T) {
	cfg := DefaultConfig()
	a, _ := NewAllocator(cfg)
	rule := Rule{ID: "g", Window: time.Minute}
	held := map[string]*Lease{}
	names := []string{"ap", "eu", "us"}
	leases := steady(t, a, rule, t0, 3, map[string]float64{"ap": 1, "eu": 1, "us": 1}, held)
	usBefore := leases[2].Share + leases[2].Floor
	// us is cut off: it reports nothing and keeps its lease. The others'
	// demand grows, but us's fraction is not given away before its lease
	// has expired and the skew allowance passed.
	cut := held["us"].Expires
	at := t0.Add(3 * time.Second)
	for ; at.Before(cut.Add(cfg.Skew)); at = at.Add(time.Second) {
		for _, r := range names[:2] {
			a.Report(rule.ID, Report{Region: r, Demand: 3, Acked: held[r].Seq})
		}
		ls, err := a.Rebalance(at, rule, names)
		if err != nil {
			t.Fatal(err)
		}
		others := ls[0].Allowance() + ls[1].Allowance()
		if others+usBefore > 1+1e-9 {
			t.Fatalf("at %v the others hold %v while us may still use %v", at.Sub(t0), others, usBefore)
		}
		held["ap"], held["eu"] = &ls[0], &ls[1]
	}
	// The window ends; in the next, with us's lease lapsed, the others
	// get all but us's floor.
	at = t0.Add(time.Minute + time.Second)
	var ls []Lease
	for range 3 {
		for _, r := range names[:2] {
			a.Report(rule.ID, Report{Region: r, Demand: 3, Acked: held[r].Seq})
		}
		ls, _ = a.Rebalance(at, rule, names)
		held["ap"], held["eu"] = &ls[0], &ls[1]
		at = at.Add(time.Second)
	}
	if got, want := ls[0].Allowance()+ls[1].Allowance(), 1-cfg.Floor(3); math.Abs(got-want) > 1e-6 {
		t.Fatalf("after us's lease lapsed the others hold %v, want %v (all but us's floor)", got, want)
	}
}

// TestCutOffRegionsShareComesBack: us holds most of a rule's limit and is
// cut off; the others, asking for all of it, get all but us's floor once
// the last lease above its floor that us may have received has lapsed and
// every window us may have counted under it has left their estimates (a
// fixed window's next, a sliding window's the one after), and the skew
// allowance after. (A sliding
// window's marks once carried each window's into the next for ever, and
// us's share never came back.)
func TestCutOffRegionsShareComesBack(t *testing.T) {
	for _, sliding := range []bool{false, true} {
		t.Run(fmt.Sprintf("sliding=%v", sliding), func(t *testing.T) {
			cfg := DefaultConfig()
			a, _ := NewAllocator(cfg)
			rule := Rule{ID: "g", Window: 10 * time.Second, Sliding: sliding}
			names := []string{"ap", "eu", "us"}
			floor := cfg.Floor(3)
			held := map[string]*Lease{}
			demand := map[string]float64{"ap": 0.01, "eu": 0.01, "us": 3}
			var toUS []Lease // every lease us may have received
			at := t0
			// usMay is the most us may use at t, of the leases it may
			// hold.
			usMay := func(t time.Time) float64 {
				most := floor
				for _, l := range toUS {
					if t.Before(l.Expires.Add(cfg.Skew)) {
						most = max(most, l.Allowance())
					}
				}
				return most
			}
			rebalance := func(reporting []string) []Lease {
				t.Helper()
				for _, r := range reporting {
					rep := Report{Region: r, Demand: demand[r]}
					if l := held[r]; l != nil {
						rep.Acked = l.Seq
					}
					a.Report(rule.ID, rep)
				}
				ls, err := a.Rebalance(at, rule, names)
				if err != nil {
					t.Fatal(err)
				}
				for i := range ls {
					if slices.Contains(reporting, ls[i].Region) {
						held[ls[i].Region] = &ls[i]
					}
				}
				toUS = append(toUS, ls[2])
				at = at.Add(time.Second)
				return ls
			}
			for range 5 {
				rebalance(names)
			}
			if got := held["us"].Allowance(); got < 0.8 {
				t.Fatalf("us asking for all: %v", got)
			}
			// Cut off: us reports nothing; the others ask for all.
			demand["ap"], demand["eu"] = 3, 3
			var lapsed time.Time
			others := map[time.Time]float64{}
			for at.Before(t0.Add(time.Minute)) {
				now := at
				ls := rebalance(names[:2])
				others[now] = ls[0].Allowance() + ls[1].Allowance()
				if others[now]+usMay(now) > 1+1e-9 {
					t.Fatalf("at %v the others hold %v while us may use %v", now.Sub(t0), others[now], usMay(now))
				}
				if ls[2].Allowance() > floor+1e-9 {
					lapsed = ls[2].Expires.Add(cfg.Skew)
				}
			}
			if lapsed.IsZero() {
				t.Fatal("us got nothing above its floor while cut off")
			}
			// back is when the window after us's last lapsed lease
			// begins (a sliding window: the one after that), and the
			// skew allowance after it the others' windows.
			back := time.UnixMicro((lapsed.UnixMicro()/rule.Window.Microseconds() + 1) * rule.Window.Microseconds())
			if sliding {
				back = back.Add(rule.Window)
			}
			for now, got := range others {
				if want := 1 - floor; !now.Before(back.Add(cfg.Skew)) && math.Abs(got-want) > 1e-6 {
					t.Errorf("at %v, us's leases lapsed at %v: the others hold %v, want %v (all but us's floor)", now.Sub(t0), lapsed.Sub(t0), got, want)
				}
			}
			if n := len(others); !at.After(back.Add(10 * time.Second)) {
				t.Fatalf("%d rebalances, until %v: none well after %v", n, at.Sub(t0), back.Sub(t0))
			}
		})
	}
}

// TestHigherFloorIsLeftToItsRegion: us is cut off and its lease has
// lapsed, but it may still enforce an older, higher limit (twice the
// current one): its floor, as a fraction of the current limit, is twice
// the configured one, and the others are granted all but that.
func TestHigherFloorIsLeftToItsRegion(t *testing.T) {
	cfg := DefaultConfig()
	a, _ := NewAllocator(cfg)
	names := []string{"ap", "eu", "us"}
	floor := cfg.Floor(3)
	rule := Rule{ID: "g", Window: time.Minute, Floors: map[string]float64{"us": 2 * floor}}
	held := map[string]*Lease{}
	at := t0
	var ls []Lease
	for range 5 {
		for _, r := range names[:2] {
			rep := Report{Region: r, Demand: 3}
			if held[r] != nil {
				rep.Acked = held[r].Seq
			}
			a.Report(rule.ID, rep)
		}
		var err error
		if ls, err = a.Rebalance(at, rule, names); err != nil {
			t.Fatal(err)
		}
		held["ap"], held["eu"] = &ls[0], &ls[1]
		at = at.Add(time.Second)
	}
	if got, want := ls[0].Allowance()+ls[1].Allowance(), 1-2*floor; got > want+1e-9 || got < want-0.01 {
		t.Fatalf("the others hold %v, want %v: all but us's higher floor", got, want)
	}
}

func TestDebtIsWithheldOnce(t *testing.T) {
	a, _ := NewAllocator(DefaultConfig())
	rule := Rule{ID: "g", Window: 10 * time.Second}
	held := map[string]*Lease{}
	steady(t, a, rule, t0, 2, map[string]float64{"eu": 1, "us": 1}, held)
	a.Charge(rule.ID, "us", 0.05)
	// Still in the first window: nothing withheld yet.
	ls := steady(t, a, rule, t0.Add(2*time.Second), 1, map[string]float64{"eu": 1, "us": 1}, held)
	if ls[1].Debt != 0 {
		t.Fatalf("debt withheld in the window it was charged in: %+v", ls[1])
	}
	// The next window withholds it, on every lease of that window.
	for i := range 3 {
		ls = steady(t, a, rule, t0.Add(10*time.Second+time.Duration(i)*time.Second), 1, map[string]float64{"eu": 1, "us": 1}, held)
		if ls[1].Debt != 0.05 || ls[0].Debt != 0 {
			t.Fatalf("window 2, rebalance %d: debts eu %v us %v, want 0 and 0.05", i, ls[0].Debt, ls[1].Debt)
		}
	}
	ls = steady(t, a, rule, t0.Add(20*time.Second), 1, map[string]float64{"eu": 1, "us": 1}, held)
	if ls[1].Debt != 0 || len(a.Debt(rule.ID)) != 0 {
		t.Fatalf("window 3: debt %v still withheld (owed %v)", ls[1].Debt, a.Debt(rule.ID))
	}
}

func TestAllowance(t *testing.T) {
	l := &Lease{Floor: 0.05, Share: 0.4, Debt: 0.1, Expires: t0}
	if got := Allowance(l, 0.05, t0.Add(-time.Millisecond)); math.Abs(got-0.35) > 1e-12 {
		t.Fatalf("allowance under the lease %v, want 0.35", got)
	}
	if got := Allowance(l, 0.05, t0); got != 0.05 {
		t.Fatalf("allowance after expiry %v, want the floor", got)
	}
	if got := Allowance(nil, 0.05, t0); got != 0.05 {
		t.Fatalf("allowance without a lease %v, want the floor", got)
	}
}

func TestBadInput(t *testing.T) {
	bad := DefaultConfig()
	bad.Smoothing = 0
	if _, err := NewAllocator(bad); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "smoothing") {
		t.Fatalf("smoothing 0: %v", err)
	}
	a, _ := NewAllocator(DefaultConfig())
	for _, c := range []struct {
		rule    Rule
		regions []string
		want    string
	}{
		{Rule{ID: "", Window: time.Second}, []string{"a"}, "empty id"},
		{Rule{ID: "r", Window: 0}, []string{"a"}, "window"},
		{Rule{ID: "r", Window: time.Second}, nil, "no regions"},
		{Rule{ID: "r", Window: time.Second}, []string{"a", "a"}, "listed once"},
	} {
		if _, err := a.Rebalance(t0, c.rule, c.regions); !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v %v: %v, want %q", c.rule, c.regions, err, c.want)
		}
	}
	if len(a.rules) != 0 {
		t.Fatalf("bad rules left state behind: %v", a.rules)
	}
	// A report with a bogus ack (ahead of any lease) or demand is not
	// believed.
	a.Report("r", Report{Region: "a", Demand: math.NaN(), Acked: 99})
	if s := a.rules["r"]; s.acked["a"] != 0 || s.sample["a"] != 0 {
		t.Fatalf("bogus report kept: acked %v demand %v", s.acked["a"], s.sample["a"])
	}
}

// TestRestoredLeasesCount: an allocator that takes over from another
// counts the other's leases until they lapse, and numbers after them.
func TestRestoredLeasesCount(t *testing.T) {
	a, _ := NewAllocator(DefaultConfig())
	rule := Rule{ID: "g", Window: time.Minute}
	held := map[string]*Lease{}
	old := steady(t, a, rule, t0, 3, map[string]float64{"eu": 0.2, "us": 2}, held)
	b, _ := NewAllocator(DefaultConfig())
	b.Restore(rule.ID, old)
	// eu's demand jumps; b may not give eu what us may still use.
	b.Report(rule.ID, Report{Region: "eu", Demand: 2})
	b.Report(rule.ID, Report{Region: "us", Demand: 0.01})
	ls, err := b.Rebalance(t0.Add(3*time.Second), rule, []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	if ls[0].Seq <= old[0].Seq {
		t.Fatalf("seq %d after restoring %d", ls[0].Seq, old[0].Seq)
	}
	usOld := old[1].Floor + old[1].Share
	if got := ls[0].Floor + ls[0].Share; got+usOld > 1+1e-9 {
		t.Fatalf("eu given %v while us may still use %v", got, usOld)
	}
}

// TestHysteresisStrandsNothing: small moves of demand are held back by
// hysteresis, but the shares still add up to all that is handed out.
func TestHysteresisStrandsNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := DefaultConfig()
		cfg.Hysteresis = rapid.Float64Range(0, 0.2).Draw(t, "hysteresis")
		a, _ := NewAllocator(cfg)
		rule := Rule{ID: "g", Window: time.Hour}
		regions := []string{"a", "b", "c"}
		now := t0
		for range rapid.IntRange(1, 20).Draw(t, "rebalances") {
			for _, r := range regions {
				a.Report(rule.ID, Report{Region: r, Demand: rapid.Float64Range(0, 2).Draw(t, "demand")})
			}
			// Far enough apart that no mark holds a share back.
			now = now.Add(2 * time.Hour)
			ls, err := a.Rebalance(now, rule, regions)
			if err != nil {
				t.Fatal(err)
			}
			sum := 0.0
			for _, l := range ls {
				sum += l.Share
			}
			if math.Abs(sum-(1-cfg.Reserve)) > 1e-6 {
				t.Fatalf("shares sum to %v, want %v", sum, 1-cfg.Reserve)
			}
		}
	})
}

// TestDebtSurvivesANewLeader: an allocator restored from another's
// snapshot withholds the debt the other charged, in the window in course
// and the next, no more and no less.
func TestDebtSurvivesANewLeader(t *testing.T) {
	demand := map[string]float64{"eu": 1, "us": 1}
	rule := Rule{ID: "g", Window: 10 * time.Second}
	takeOver := func(old *Allocator, leases []Lease) *Allocator {
		t.Helper()
		a, _ := NewAllocator(DefaultConfig())
		a.Restore(rule.ID, leases)
		a.RestoreSnapshot(rule.ID, old.Snapshot(rule.ID))
		return a
	}
	// Charged, not yet withheld: the new leader withholds it next window.
	a, _ := NewAllocator(DefaultConfig())
	held := map[string]*Lease{}
	ls := steady(t, a, rule, t0, 2, demand, held)
	a.Charge(rule.ID, "us", 0.3)
	b := takeOver(a, ls)
	ls = steady(t, b, rule, t0.Add(10*time.Second), 1, demand, held)
	if ls[1].Debt != 0.3 {
		t.Fatalf("a new leader withholds %v of us's debt of 0.3", ls[1].Debt)
	}
	// Withheld in the window in course (0.3 of a lease of 0.45): the next
	// leader keeps withholding it in that window, and the rest after.
	b.Charge(rule.ID, "us", 0.7)
	ls = steady(t, b, rule, t0.Add(20*time.Second), 1, demand, held)
	first := ls[1].Debt
	c := takeOver(b, ls)
	ls = steady(t, c, rule, t0.Add(21*time.Second), 1, demand, held)
	if ls[1].Debt != first {
		t.Fatalf("in the same window the new leader withholds %v, the old withheld %v", ls[1].Debt, first)
	}
	ls = steady(t, c, rule, t0.Add(30*time.Second), 1, demand, held)
	if got := first + ls[1].Debt; math.Abs(got-0.7) > 1e-9 && ls[1].Debt != ls[1].Floor+ls[1].Share {
		t.Fatalf("withheld %v then %v of a debt of 0.7", first, ls[1].Debt)
	}
	if ls[1].Debt == 0 {
		t.Fatal("the rest of the debt was forgotten")
	}
}
