package budget

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// eps absorbs floating-point rounding in the safety sums.
const eps = 1e-9

// Report is what a region tells the allocator about one rule.
type Report struct {
	Region string
	// Demand is what the region was asked for, admitted plus denied for
	// want of budget, in limits per window (0.5: half the limit each
	// window).
	Demand float64
	// Acked is the Seq of the newest lease of the rule the region holds,
	// or 0 for none. A region acknowledges a lease only once it has
	// enforced it for longer than its store's timeout, so that no decision
	// made under an older lease is still in flight.
	Acked uint64
	// Used is the most the region has admitted of any counter of the rule
	// in window UsedEpoch, as a fraction of that counter's limit (for a
	// sliding window counter, its own estimate), measured when it
	// acknowledged Acked. It lets the allocator give away, within the
	// window, what a region that was lowered has not used.
	Used      float64
	UsedEpoch int64
	// HasUsed says Used and UsedEpoch are filled in.
	HasUsed bool
	// PrevUsed is, for a sliding window, what the region counted in the
	// window before UsedEpoch, as Used is measured (HasPrev says it is
	// filled in): the estimate carries it, and without it the allocator
	// keeps the region's mark of that window.
	PrevUsed float64
	HasPrev  bool
}

// Rule is what the allocator needs to know of a global rule.
type Rule struct {
	ID string
	// Window is the rule's window. Windows are aligned to multiples of it
	// since the Unix epoch, as the regions align them.
	Window time.Duration
	// Sliding is set for a sliding window counter, whose estimate carries
	// the previous window into the current one.
	Sliding bool
	// Floors are floors larger than the configured one that regions may
	// be using, as fractions of the limit: a region that has not heard
	// that the limit was lowered keeps its floor of the higher limit.
	// The others are granted only what is left.
	Floors map[string]float64
}

// Allocator computes the leases of every global rule. Not safe for
// concurrent use.
type Allocator struct {
	cfg   Config
	rules map[string]*ruleState
}

type grant struct {
	seq      uint64
	fraction float64 // floor plus share
	floor    float64 // what the region may use once it lapses
	expires  time.Time
}

type ruleState struct {
	window  int64 // µs
	sliding bool
	seq     uint64
	floors  map[string]float64 // the largest floor each region was told
	demand  map[string]float64 // smoothed
	sample  map[string]float64 // reported since the last rebalance
	heard   map[string]time.Time
	acked   map[string]uint64
	used    map[string]Report  // reports with Used, since the last rebalance
	share   map[string]float64 // the share of the last lease, for hysteresis
	grants  map[string][]grant // leases that may still be in force, oldest first
	hw      map[int64]map[string]float64
	// own is, of a sliding window's live windows, the marks that bound
	// what each region may count in the window itself, without what its
	// estimate carries from the window before: what the next window
	// carries (open). hw is at least own.
	own     map[int64]map[string]float64
	past    map[int64]map[string]float64 // marks of windows no longer live, for Granted
	debt    map[string]float64           // still to charge
	held    map[string]float64           // charged in heldEpoch
	heldEp  int64
	started bool

	counters  map[string]*ruleState // a rule's counters with budgets of their own, by key
	releasedN int                   // how many of them are released
	fit       int                   // the most its document holds (FitCounters); 0: no bound
	counter   *counterState         // set on a counter's own budget
}

func newRuleState() *ruleState {
	return &ruleState{
		demand: map[string]float64{}, sample: map[string]float64{}, heard: map[string]time.Time{}, acked: map[string]uint64{}, used: map[string]Report{},
		share: map[string]float64{}, grants: map[string][]grant{}, hw: map[int64]map[string]float64{}, own: map[int64]map[string]float64{},
		past: map[int64]map[string]float64{},
		debt: map[string]float64{}, held: map[string]float64{}, floors: map[string]float64{},
	}
}

// NewAllocator returns an allocator with the given settings.
func NewAllocator(cfg Config) (*Allocator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Allocator{cfg: cfg, rules: make(map[string]*ruleState)}, nil
}

// Config returns the allocator's settings.
func (a *Allocator) Config() Config { return a.cfg }

func (a *Allocator) state(id string) *ruleState {
	s := a.rules[id]
	if s == nil {
		s = newRuleState()
		a.rules[id] = s
	}
	return s
}

// Report records a region's report on a rule, for the next Rebalance.
// Negative or non-finite demand counts as none.
func (a *Allocator) Report(rule string, r Report) { a.state(rule).report(r) }

func (s *ruleState) report(r Report) {
	d := r.Demand
	if !(d >= 0) || math.IsInf(d, 0) {
		d = 0
	}
	s.sample[r.Region] = d
	if r.Acked > s.acked[r.Region] && r.Acked <= s.seq {
		s.acked[r.Region] = r.Acked
		if r.HasUsed && r.Used >= 0 && !math.IsInf(r.Used, 0) {
			if !(r.PrevUsed >= 0) || math.IsInf(r.PrevUsed, 0) {
				r.HasPrev = false
			}
			s.used[r.Region] = r
		}
	}
}

// Charge records over-admission by a region, as a fraction of the limit,
// to be withheld from its allowance in the windows that follow (at most
// its allowance per window) until paid.
func (a *Allocator) Charge(rule, region string, fraction float64) {
	if fraction > 0 && !math.IsInf(fraction, 0) {
		a.state(rule).debt[region] += fraction
	}
}

// Forget drops a rule that is no longer global.
func (a *Allocator) Forget(rule string) { delete(a.rules, rule) }

// Demand returns the smoothed demand of each region of a rule.
func (a *Allocator) Demand(rule string) map[string]float64 {
	if s := a.rules[rule]; s != nil {
		return maps.Clone(s.demand)
	}
	return nil
}

// Debt returns what each region of a rule still owes.
func (a *Allocator) Debt(rule string) map[string]float64 {
	if s := a.rules[rule]; s != nil {
		return maps.Clone(s.debt)
	}
	return nil
}

// Rebalance computes new leases for every region of a rule at now, one per
// region in the order given. regions are the known regions; every region
// that reports must be among them. Call it once per rebalance interval.
func (a *Allocator) Rebalance(now time.Time, rule Rule, regions []string) ([]Lease, error) {
	if rule.ID == "" {
		return nil, fmt.Errorf("%w: empty id", ErrInvalidRule)
	}
	if rule.Window <= 0 {
		return nil, fmt.Errorf("%w: %s: window %v: want more than 0", ErrInvalidRule, rule.ID, rule.Window)
	}
	if len(regions) == 0 {
		return nil, fmt.Errorf("%w: %s: no regions", ErrInvalidRule, rule.ID)
	}
	for i, r := range regions {
		if r == "" || slices.Contains(regions[:i], r) {
			return nil, fmt.Errorf("%w: %s: regions must be named and listed once", ErrInvalidRule, rule.ID)
		}
	}
	s := a.state(rule.ID)
	s.window = rule.Window.Microseconds()
	s.setSliding(rule.Sliding)
	floor := a.cfg.Floor(len(regions))
	// A region may use its floor at any time: the floor counts as a grant
	// that never lapses. A region keeps the largest floor it was told (the
	// regions known may have grown since), or, never told, this one. (A
	// region that enforces a higher limit uses more of the rule's: room
	// counts its marks in the rule's limit, Rule.Floors.)
	floorOf := func(r string) float64 { return max(floor, s.floors[r]) }

	first, last := s.epoch(now.Add(-a.cfg.Skew)), s.epoch(now.Add(a.cfg.Skew))
	s.open(first, last, regions, floorOf)
	var before map[string][]grant
	if len(s.counters) > 0 {
		// The rule's leases as they were before this rebalance, lapsed
		// ones included: counters whose regions may enforce them count
		// them in the windows that have just begun.
		before = make(map[string][]grant, len(s.grants))
		for r, gs := range s.grants {
			before[r] = slices.Clone(gs)
		}
	}
	s.prune(now, a.cfg.Skew)
	s.lower(first, last, floorOf)
	s.takeDemand(now, regions, a.cfg.LeaseTTL, a.cfg.Smoothing)

	distributable := max(0, 1-a.cfg.Reserve)
	needs := make([]float64, len(regions))
	weights := make([]float64, len(regions))
	live := 0.0
	for i, r := range regions {
		weights[i] = s.demand[r]
		needs[i] = max(0, s.demand[r]-floor)
		live += weights[i]
	}
	if live == 0 {
		// No demand anywhere (a rule whose traffic is all on counters
		// with budgets of their own, or idle): the rest goes evenly to
		// the regions heard within a lease's life, not to one cut off
		// (takeDemand forgot its demand), which could not use it.
		for i, r := range regions {
			if _, heard := s.demand[r]; heard {
				weights[i] = 1
			}
		}
	}
	targets := waterFill(needs, weights, distributable)
	shares := s.steady(regions, targets, distributable, a.cfg.Hysteresis)
	wants := make([]float64, len(regions))
	spare := distributable
	for i := range regions {
		wants[i] = floor + shares[i]
		spare -= needs[i]
	}
	fractions := s.room(first, last, regions, floorOf, wants, higherLimits(rule, floor))
	var seed map[int64]map[string]float64
	for _, c := range s.counters {
		if !c.counter.seeded {
			// The marks before this rebalance's leases: what each
			// region may have used of a counter that gets its budget
			// now.
			seed = map[int64]map[string]float64{}
			for e := first; e <= last; e++ {
				seed[e] = maps.Clone(s.hw[e])
			}
			break
		}
	}

	ep := s.epoch(now)
	newWindow := !s.started || ep != s.heldEp
	if newWindow {
		clear(s.held)
		s.heldEp = ep
	}
	s.started = true
	s.seq++
	// Room for the counters' leases too (rebalanceCounters appends them):
	// some 60,000 of a rule with 12,000 budgets, made once a rebalance,
	// not grown and copied.
	leases := make([]Lease, len(regions), len(regions)*(1+len(s.counters)))
	expires := now.Add(a.cfg.LeaseTTL)
	for i, r := range regions {
		f := max(fractions[i], floor)
		why := s.reasonOf(r, f, wants[i], targets[i], shares[i], needs[i], spare, live)
		s.share[r] = f - floor
		s.floors[r] = max(s.floors[r], floor)
		if newWindow && s.debt[r] > 0 {
			h := min(s.debt[r], f)
			s.held[r] = h
			s.debt[r] -= h
			if s.debt[r] <= eps {
				delete(s.debt, r)
			}
		}
		s.issue(r, grant{seq: s.seq, fraction: f, floor: floor, expires: expires}, first, last)
		leases[i] = Lease{
			Rule: rule.ID, Region: r, Seq: s.seq, Floor: floor, Share: f - floor,
			Debt: s.held[r], Issued: now, Expires: expires, Reason: why,
		}
	}
	return a.rebalanceCounters(leases, now, rule, s, regions, first, last, ruleBefore{before, seed, floorOf}), nil
}

// open makes the high-water marks of the live windows first to last that
// have none yet, and retires those of windows no longer live.
func (s *ruleState) open(first, last int64, regions []string, floorOf func(string) float64) {
	for e := first; e <= last; e++ {
		if s.hw[e] != nil {
			continue
		}
		// Every lease that may be in force in this window is one given
		// before now that expires after the window starts (a region's
		// clock moves its window and its leases alike): what the
		// region may use is the most any of them (or its floor)
		// allows.
		start := time.UnixMicro(e * s.window)
		if s.sliding {
			// The estimate carries what was counted in the window
			// before, under the leases in force then.
			start = start.Add(-time.Duration(s.window) * time.Microsecond)
		}
		hw := map[string]float64{}
		for _, r := range regions {
			hw[r] = floorOf(r)
		}
		for r, gs := range s.grants {
			hw[r] = max(hw[r], floorOf(r))
			for _, g := range gs {
				if g.expires.After(start) {
					hw[r] = max(hw[r], g.fraction)
				}
			}
		}
		s.hw[e] = hw
		if !s.sliding {
			continue
		}
		s.own[e] = maps.Clone(hw)
		if prev := s.ownBefore(e); prev != nil {
			// The estimate starts the window at what the window before
			// counted: what its own marks bound, not what it carried
			// from the one before it (a region silent since would
			// keep its share for ever).
			for r, f := range prev {
				hw[r] = max(hw[r], f)
			}
		}
	}
	for e, hw := range s.hw {
		if e < first {
			s.past[e] = hw
			delete(s.hw, e)
			delete(s.own, e)
		}
	}
	for e := range s.past {
		if e < first-pastWindows {
			delete(s.past, e)
		}
	}
}

// takeDemand takes in the demand reported since the last rebalance.
func (s *ruleState) takeDemand(now time.Time, regions []string, ttl time.Duration, smoothing float64) {
	for _, r := range regions {
		if _, ok := s.sample[r]; ok {
			s.heard[r] = now
		} else if h, ok := s.heard[r]; !ok || now.Sub(h) >= ttl {
			// Silent for a lease's life: cut off, or gone. It runs
			// on its floor; its demand is not believed any more.
			delete(s.demand, r)
		}
		if d, ok := s.sample[r]; ok {
			if cur, seen := s.demand[r]; seen && d < cur {
				s.demand[r] += smoothing * (d - cur)
			} else {
				// A region short of budget must not wait for it.
				s.demand[r] = d
			}
		}
	}
	clear(s.sample)
}

// steady applies the hysteresis to target shares: a share moves only by
// hysteresis or more. What holding shares back leaves over goes to those
// held below their targets, in proportion to how far below they are, so
// that no part of the limit is stranded.
func (s *ruleState) steady(regions []string, target []float64, distributable, hysteresis float64) []float64 {
	shares := make([]float64, len(regions))
	sum := 0.0
	for i, r := range regions {
		cur, had := s.share[r]
		shares[i] = target[i]
		if had && math.Abs(target[i]-cur) < hysteresis {
			shares[i] = cur
		}
		sum += shares[i]
	}
	if sum > distributable+eps {
		copy(shares, target)
	} else if left := distributable - sum; left > eps {
		gap := 0.0
		for i := range shares {
			gap += max(0, target[i]-shares[i])
		}
		for i := range shares {
			if g := max(0, target[i]-shares[i]); g > 0 {
				shares[i] += left * g / gap
			}
		}
	}
	return shares
}

// room returns the fraction each region may be granted, given what each
// wants: no more than it wants, and more than its high-water mark in a
// live window only out of room that no region's mark covers. ratio is,
// for a region that still enforces a higher limit than the rule's (it has
// not heard that it was lowered), that limit over the rule's: what it
// admits under a fraction f is f × ratio of the rule's limit, its marks
// and its grants alike.
func (s *ruleState) room(first, last int64, regions []string, floorOf func(string) float64, wants []float64, ratio map[string]float64) []float64 {
	scale := func(r string) float64 { return max(1, ratio[r]) }
	mark := func(r string) float64 {
		m := floorOf(r)
		for e := first; e <= last; e++ {
			m = max(m, s.hw[e][r])
		}
		return m * scale(r)
	}
	base, extra := 0.0, 0.0
	// In name order: a sum of floats in map order differs in its last
	// bits from run to run.
	for _, r := range slices.Sorted(maps.Keys(s.hwRegions(first, last, regions))) {
		base += mark(r)
	}
	more := make([]float64, len(regions))
	for i, r := range regions {
		more[i] = max(0, wants[i]*scale(r)-mark(r))
		extra += more[i]
	}
	factor := 1.0
	if extra > 0 && base+extra > 1 {
		factor = max(0, 1-base) / extra * (1 - eps)
	}
	out := make([]float64, len(regions))
	for i, r := range regions {
		out[i] = wants[i]
		if m := mark(r); out[i]*scale(r) > m {
			out[i] = (m + more[i]*factor) / scale(r)
		}
	}
	return out
}

// higherLimits is, for each region that enforces a higher limit than the
// rule's, that limit over the rule's, from the floors it may be using
// (Rule.Floors, its floor of the higher limit, over the floor).
func higherLimits(rule Rule, floor float64) map[string]float64 {
	if len(rule.Floors) == 0 || floor <= 0 {
		return nil
	}
	out := make(map[string]float64, len(rule.Floors))
	for r, f := range rule.Floors {
		if f > floor {
			out[r] = f / floor
		}
	}
	return out
}

// issue records a grant to region r: it counts in every live window.
func (s *ruleState) issue(r string, g grant, first, last int64) {
	s.grants[r] = append(s.grants[r], g)
	for e := first; e <= last; e++ {
		s.raise(e, r, g.fraction)
	}
}

// setSliding says whether the rule is a sliding window. Marks taken in
// before (a snapshot, restored before the first rebalance) count as their
// windows' own.
func (s *ruleState) setSliding(sliding bool) {
	if sliding && !s.sliding {
		for e, hw := range s.hw {
			s.own[e] = maps.Clone(hw)
		}
	} else if !sliding {
		clear(s.own)
	}
	s.sliding = sliding
}

// raise raises region r's mark in window e to f, if lower: what it may
// count in the window itself (own, for a sliding window), and so in all.
func (s *ruleState) raise(e int64, r string, f float64) {
	if s.hw[e] == nil {
		s.hw[e] = map[string]float64{}
	}
	s.hw[e][r] = max(s.hw[e][r], f)
	if s.sliding {
		if s.own[e] == nil {
			s.own[e] = map[string]float64{}
		}
		s.own[e][r] = max(s.own[e][r], f)
	}
}

// epoch is the index of the window that holds t.
func (s *ruleState) epoch(t time.Time) int64 {
	us := t.UnixMicro()
	e := us / s.window
	if us < 0 && us%s.window != 0 {
		e--
	}
	return e
}

// prune drops the grants that no longer count: lapsed past the skew
// allowance, or older than one the region says it holds. The newest grant
// of a region is kept while it holds, acknowledged or not.
func (s *ruleState) prune(now time.Time, skew time.Duration) {
	for r, gs := range s.grants {
		acked := s.acked[r]
		kept := gs[:0]
		for _, g := range gs {
			if now.Before(g.expires.Add(skew)) && g.seq >= acked {
				kept = append(kept, g)
			}
		}
		if len(kept) == 0 {
			delete(s.grants, r)
		} else {
			s.grants[r] = kept
		}
	}
}

// mark is region r's high-water mark in window e, live or past, if the
// allocator kept one.
func (s *ruleState) mark(e int64, r string) (float64, bool) {
	if hw := s.hw[e]; hw != nil {
		return hw[r], true
	}
	if hw := s.past[e]; hw != nil {
		return hw[r], true
	}
	return 0, false
}

// ownBefore is the own marks (what each region may count in the window
// itself) of the latest window before e that has them, or nil.
func (s *ruleState) ownBefore(e int64) map[string]float64 {
	best, found := int64(0), false
	for k := range s.own {
		if k < e && (!found || k > best) {
			best, found = k, true
		}
	}
	if !found {
		return nil
	}
	return s.own[best]
}

// lower brings down the high-water marks of regions that acknowledged a
// newer lease: from then on, a region uses at most what it had used in its
// window, or what the leases it may still hold allow. In later windows it
// has used nothing yet.
func (s *ruleState) lower(first, last int64, floorOf func(string) float64) {
	for r, rep := range s.used {
		holds := floorOf(r)
		for _, g := range s.grants[r] {
			holds = max(holds, g.fraction)
		}
		for e := max(first, rep.UsedEpoch); e <= last; e++ {
			hw := s.hw[e]
			if hw == nil {
				continue
			}
			m := holds
			if e == rep.UsedEpoch || s.sliding {
				m = max(m, rep.Used)
			}
			if s.sliding && e == rep.UsedEpoch && rep.HasPrev {
				// A sliding estimate carries the window before, of
				// which the region said what it counted.
				m = max(m, rep.PrevUsed)
			} else if s.sliding {
				// It carries the window before, of which the region
				// reported nothing: its mark stands, and without one
				// nothing is lowered.
				prev, ok := s.mark(e-1, r)
				if !ok {
					continue
				}
				m = max(m, prev)
			}
			hw[r] = min(hw[r], m)
			if own := s.own[e]; own != nil {
				// What it may count in the window itself: its count,
				// in the window it reported, and what it still holds.
				m := holds
				if e == rep.UsedEpoch {
					m = max(m, rep.Used)
				}
				own[r] = min(own[r], m)
			}
		}
	}
	clear(s.used)
}

// hwRegions is every region that may hold part of the limit in a live
// window: the known ones and any that still hold a grant.
func (s *ruleState) hwRegions(first, last int64, regions []string) map[string]bool {
	all := map[string]bool{}
	for _, r := range regions {
		all[r] = true
	}
	for e := first; e <= last; e++ {
		for r := range s.hw[e] {
			all[r] = true
		}
	}
	return all
}

// Restore tells the allocator of leases another allocator issued (a
// globalsync leader that went away): they count as given, until they lapse
// or the regions acknowledge newer ones, and this allocator numbers its
// leases after them. Give it every lease that expires after the other
// allocator's last Rebalance, with its Snapshot (RestoreSnapshot), before
// this allocator's first Rebalance of the rule.
func (a *Allocator) Restore(rule string, leases []Lease) {
	s := a.state(rule)
	var counters []Lease
	for _, l := range leases {
		if l.Rule != rule && l.Rule != "" {
			continue
		}
		s.seq = max(s.seq, l.Seq)
		if l.Key != "" {
			counters = append(counters, l)
			continue
		}
		s.grants[l.Region] = append(s.grants[l.Region], grant{seq: l.Seq, fraction: l.Floor + l.Share, floor: l.Floor, expires: l.Expires})
		s.floors[l.Region] = max(s.floors[l.Region], l.Floor)
		s.share[l.Region] = l.Share
	}
	s.restoreCounterLeases(counters)
	for r, gs := range s.grants {
		slices.SortFunc(gs, func(x, y grant) int { return cmp.Compare(x.seq, y.seq) })
		s.grants[r] = gs
	}
	s.pruneAcked()
}

// pastWindows is how many windows back Granted can tell.
const pastWindows = 8

// Granted returns, for window epoch of a rule (its start / its length),
// the most each region may have admitted in it, as a fraction of the
// limit: what reconciliation holds a region to. It knows the last few
// windows only.
func (a *Allocator) Granted(rule string, epoch int64) map[string]float64 {
	s := a.rules[rule]
	if s == nil {
		return nil
	}
	if hw := s.hw[epoch]; hw != nil {
		return maps.Clone(hw)
	}
	return maps.Clone(s.past[epoch])
}

// Snapshot is what an allocator taking over a rule needs besides the
// leases still in force: the high-water marks of the live windows (usage
// under leases that have lapsed still counts in its window), the leases
// each region acknowledged (older ones no longer count), and the debt
// still to withhold.
type Snapshot struct {
	Marks map[int64]map[string]float64 // window epoch → region → fraction
	Acked map[string]uint64
	// Debt is what is still to be withheld (carry_debt); Held what is
	// withheld in window HeldEpoch.
	Debt, Held map[string]float64
	HeldEpoch  int64
	// Counters are the snapshots of the counters with budgets of their
	// own, by key.
	Counters map[string]CounterSnapshot
}

// Snapshot returns the rule's snapshot, to hand to RestoreSnapshot.
func (a *Allocator) Snapshot(rule string) Snapshot {
	s := a.rules[rule]
	if s == nil {
		return Snapshot{}
	}
	out := Snapshot{Marks: make(map[int64]map[string]float64, len(s.hw)), Acked: maps.Clone(s.acked),
		Debt: maps.Clone(s.debt)}
	if s.started {
		out.Held, out.HeldEpoch = maps.Clone(s.held), s.heldEp
	}
	for e, hw := range s.hw {
		out.Marks[e] = maps.Clone(hw)
	}
	if len(s.counters) > 0 {
		// Each counter's snapshot reads its own state: many are made in
		// parallel (inChunks).
		keys := slices.Collect(maps.Keys(s.counters))
		snaps := make([]CounterSnapshot, len(keys))
		inChunks(len(keys), func(_, lo, hi int) {
			for i := lo; i < hi; i++ {
				snaps[i] = s.counters[keys[i]].counterSnapshot()
			}
		})
		out.Counters = make(map[string]CounterSnapshot, len(s.counters))
		for i, k := range keys {
			out.Counters[k] = snaps[i]
		}
	}
	return out
}

// RestoreSnapshot takes in another allocator's snapshot: each mark the
// higher of its and ours, each acknowledgement the newer. Restore it, and
// the leases (Restore), before the rule's first Rebalance.
func (a *Allocator) RestoreSnapshot(rule string, snap Snapshot) {
	s := a.state(rule)
	s.restoreMarks(snap.Marks)
	for r, seq := range snap.Acked {
		s.acked[r] = max(s.acked[r], seq)
	}
	s.pruneAcked()
	// Debt still owed, and what the window in course withholds, go on
	// being withheld: a new leader neither forgets nor charges it twice.
	for r, d := range snap.Debt {
		if d > 0 && d <= 1+eps {
			s.debt[r] = max(s.debt[r], d)
		}
	}
	if snap.Held != nil && !s.started {
		for r, h := range snap.Held {
			if h > 0 && h <= 1+eps {
				s.held[r] = h
			}
		}
		s.heldEp, s.started = snap.HeldEpoch, true
	}
	for k, cs := range snap.Counters {
		// Every one, whatever the cap: regions may hold their leases.
		s.restoreCounter(k, cs)
	}
}

// restoreMarks takes in another allocator's marks, each the higher of its
// and ours. A snapshot keeps no own marks: each counts as its window's own
// (what the next window carries), which carries it one window more.
func (s *ruleState) restoreMarks(marks map[int64]map[string]float64) {
	for e, hw := range marks {
		for r, f := range hw {
			if f >= 0 && f <= 1+eps {
				s.raise(e, r, f)
			}
		}
	}
}

// pruneAcked drops the grants a region acknowledged it moved on from. (A
// restored grant the previous allocator had already dropped so would
// otherwise count again, in windows that begin after it was dropped.)
func (s *ruleState) pruneAcked() {
	for r, gs := range s.grants {
		s.grants[r] = slices.DeleteFunc(gs, func(g grant) bool { return g.seq < s.acked[r] })
		if len(s.grants[r]) == 0 {
			delete(s.grants, r)
		}
	}
}

// NumberAfter makes the rule's next leases numbered after seq: a rule
// forgotten (Forget) and global again goes on from its last leases, which
// the regions may still hold, rather than from 1.
func (a *Allocator) NumberAfter(rule string, seq uint64) {
	s := a.state(rule)
	s.seq = max(s.seq, seq)
}

// Seq returns the Seq of the rule's newest lease.
func (a *Allocator) Seq(rule string) uint64 {
	if s := a.rules[rule]; s != nil {
		return s.seq
	}
	return 0
}
