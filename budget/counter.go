package budget

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"time"
)

// Counters of their own
//
// A rule's shares follow the rule's summed demand, which serves the long
// tail of its counters well and a tenant whose traffic lives elsewhere
// than the rule's badly: a tenant that sends only to us gets us's share of
// its limit. A counter whose region reports demand the rule's share could
// not meet (ReportCounter) gets a budget of its own, shared out by its own
// demand, until it falls idle.
//
// A counter's budget is its own pool, kept as a rule's is (marks per live
// window, grants, acknowledgements), with these differences:
//
//   - Its floors follow its demand: the reserve is split over the regions
//     in proportion to what each asks of the counter, each at most the
//     rule's floor, so that no part of a tenant's limit waits in a region
//     the tenant never uses, while a region cut off keeps a floor in
//     proportion to the traffic it had. A region uses the floor of the
//     newest lease it holds once that lapses, so a floor counts until the
//     region acknowledges a newer lease.
//   - A region takes a rule's budget document whole: once it has one that
//     gives the counter a lease, it enforces the counter's lease (or its
//     floor) on the counter, and the rule's on the others. Until it
//     acknowledges one of the counter's leases it may still enforce the
//     rule's, and counts in the counter's pool with the rule's marks.
//   - When the counter falls idle its budget is released: documents say
//     so (Lease.Released) and when its regions go back to the rule's
//     lease, at the first window that begins after its last lease has
//     lapsed (Revert). Until then a region enforces on it the lease it
//     holds, lapsed or not, or the rule's floor if it holds none (the
//     rule's newer leases count only the other counters). After that the
//     counter leaves the documents, and a region that still holds a lease
//     of it goes back at once; a region that never hears of it stays on
//     the lapsed lease's floor, which is never above the rule's. Demand
//     that comes back before then gets a new budget after.
//   - It is not charged debt: over-admission is withheld from the rule.
//
// Leases of a counter are numbered with its rule's: a rebalance issues one
// Seq for the rule and for each of its counters.

// Revert is when the regions may go back to a rule's lease for a counter
// whose last lease is l: at the start of the first window (of the rule's
// window length) that begins after l has lapsed and the skew allowance
// passed, or the one after for a sliding window, whose estimate carries
// the window before.
func Revert(l *Lease, window time.Duration, sliding bool, skew time.Duration) time.Time {
	w := window.Microseconds()
	if w <= 0 {
		return l.Expires.Add(skew)
	}
	e := floorDiv(l.Expires.Add(skew).UnixMicro(), w) + 1
	if sliding {
		e++
	}
	return time.UnixMicro(e * w)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// counterState is what a counter's own budget keeps besides a rule's.
type counterState struct {
	// since is the Seq of the counter's first leases: acknowledgements of
	// earlier ones are of an earlier budget of the counter, or the rule's.
	since uint64
	// ackedExp is when the lease each region acknowledged expires.
	ackedExp map[string]time.Time
	// floors are the floors each region was told, oldest first, each
	// lower than the one before it (a floor no higher than a later one
	// never decides the most the region may use).
	floors map[string][]floorRec
	// lastExpires is when the newest lease expires; lastDemand the last
	// rebalance that saw demand.
	lastExpires, lastDemand time.Time
	// released is when the regions go back to the rule, once the counter
	// is idle or evicted; zero while it is not.
	released time.Time
	// evicted says the counter gives its room to another (Release): its
	// next leases are its last, each with its floor as high as the
	// lease, and say when the regions go back to the rule.
	evicted bool
	// seeded says the rule's marks of the windows live when the counter
	// got its budget are in the counter's.
	seeded bool
	// usedNow is what each region last said it used of the counter, and
	// in which window: what it wants of a fixed window is that, and its
	// demand over what is left of the window.
	usedNow map[string]usedIn
}

type usedIn struct {
	epoch int64
	used  float64
}

// ruleBefore is what a rule's counters need to know of the rule as it
// was before its rebalance: its leases, lapsed ones included, the marks of
// the live windows, and its floors.
type ruleBefore struct {
	grants map[string][]grant
	seed   map[int64]map[string]float64
	floor  func(string) float64
}

// most is the most a region may use of the rule in window e under its
// floor and the leases of the rule numbered before seq.
func (rb ruleBefore) most(r string, seq uint64, e, window int64, sliding bool) float64 {
	start := time.UnixMicro(e * window)
	if sliding {
		start = start.Add(-time.Duration(window) * time.Microsecond)
	}
	f := rb.floor(r)
	for _, g := range rb.grants[r] {
		if g.seq < seq && g.expires.After(start) {
			f = max(f, g.fraction)
		}
	}
	return f
}

// release releases the budget at now: its regions go back to the rule at
// the first window that starts after its last lease lapsed (Revert), or
// now if it never had one.
func (cs *counterState) release(now time.Time, window time.Duration, sliding bool, skew time.Duration) {
	cs.released, cs.evicted = now, false
	if !cs.lastExpires.IsZero() {
		l := Lease{Expires: cs.lastExpires}
		cs.released = Revert(&l, window, sliding, skew)
	}
}

// idleAfter is how long a counter's demand must stay nil before its budget
// is released: a lease's life, or a window if longer. (Demand that comes
// back before its regions have gone back to the rule waits for them: a
// region may go back before it hears of new leases.)
func (a *Allocator) idleAfter(window time.Duration) time.Duration { return max(a.cfg.LeaseTTL, window) }

type floorRec struct {
	Seq   uint64
	Floor float64
}

// DefaultMaxCounters is Config.Counters' default, and MaxCounters the most
// it may be: every counter with a budget of its own is in its rule's
// budget document, and a document must fit in one NATS message (1 MB by
// default). Deflated (wire.go), a counter takes some 63 bytes of one in
// the simulator's tenants-free scenario (9,762 in 618 KB), and at most
// about 170 however little its key and numbers compress
// (TestDocumentFitsANATSMessage); a leader told its documents' sizes
// holds no more counters than fit (FitCounters; coord's Sized).
const (
	DefaultMaxCounters = 12_000
	MaxCounters        = 15_000
)

// ReportCounter records a region's report on one counter of a rule (key:
// the counter's key within the rule), for the next Rebalance: a counter
// the allocator does not serve yet gets a budget of its own, if the rule
// has room for one more (Config.Counters). Report.Used is about this
// counter alone.
func (a *Allocator) ReportCounter(rule, key string, r Report) {
	p := a.state(rule)
	c := p.counters[key]
	if c == nil {
		d := r.Demand
		if !(d > 0) || math.IsInf(d, 0) || a.Full(rule) {
			return
		}
		c = p.newCounter(key, p.seq+1)
	}
	if r.Acked < c.counter.since {
		r.Acked, r.HasUsed = 0, false
	}
	before := c.acked[r.Region]
	c.report(r)
	if r.UsedEpoch != 0 && r.Used >= 0 && r.Used <= 1+eps {
		c.counter.usedNow[r.Region] = usedIn{r.UsedEpoch, r.Used}
	}
	if after := c.acked[r.Region]; after != before {
		for _, g := range c.grants[r.Region] {
			if g.seq == after {
				c.counter.ackedExp[r.Region] = g.expires
			}
		}
	}
}

// CounterUseSeen records what a region is known to have used of a counter
// with a budget of its own in window epoch (a fraction of its limit, as
// the gossip shows it), after the region's reports (ReportCounter): in
// elastic mode it may have borrowed more than any lease of the counter's
// or the rule's, and the counter's room must leave it that; the most of
// what it said and what was seen counts.
func (a *Allocator) CounterUseSeen(rule, key, region string, epoch int64, used float64) {
	p := a.rules[rule]
	if p == nil || p.counters[key] == nil || !(used > 0) || used > 1+eps {
		return
	}
	c := p.counters[key]
	if u, ok := c.counter.usedNow[region]; !ok || u.epoch < epoch || (u.epoch == epoch && u.used < used) {
		c.counter.usedNow[region] = usedIn{epoch, used}
	}
}

// Full reports whether a rule has as many counters with budgets of their
// own as it may (Config.Counters, besides those released and not yet gone
// back to the rule, of which it may have as many again).
func (a *Allocator) Full(rule string) bool {
	p := a.rules[rule]
	if p == nil {
		return a.cfg.Counters <= 0
	}
	return len(p.counters)-p.releasedN >= a.cfg.Counters || len(p.counters) >= 2*a.cfg.Counters || p.atFit()
}

// AtFit reports whether a rule's document holds as many counters as fit in
// it (FitCounters): none is added, and evicting one to make room for
// another makes none — the evicted one stays in the document until it goes
// back to the rule.
func (a *Allocator) AtFit(rule string) bool {
	p := a.rules[rule]
	return p != nil && p.atFit()
}

func (p *ruleState) atFit() bool { return p.fit > 0 && len(p.counters) >= p.fit }

// FitCounters bounds how many counters a rule's budget document holds,
// with budgets of their own or going back to the rule, to n (0: no bound
// but Config.Counters), so that the document fits in a message: no
// counter gets a budget of its own while the document holds n, and if it
// holds more, those that would lose least going back to the rule (Weakest)
// are released until it would hold n once they have gone back.
func (a *Allocator) FitCounters(rule string, n int, now time.Time) {
	p := a.rules[rule]
	if p == nil {
		return
	}
	p.fit = max(n, 0)
	if p.fit == 0 {
		return
	}
	if over := len(p.counters) - p.releasedN - p.fit; over > 0 {
		for _, w := range a.WeakestN(rule, over) {
			a.Release(rule, w.Key, now)
		}
	}
}

// Gain is what a counter whose regions ask demand of it (limits per
// window, by region) would gain from a budget of its own: of what it asks,
// up to its limit, the part the rule's shares would not give it where it
// is asked. The rule's shares are taken as they settle, in proportion to
// the rule's demand in each region (the leases of the moment are smaller
// at first, and in a window's last part); a region that has not asked for
// the rule counts an equal part. A tenant asking several times its limit
// everywhere gains nothing (each region's share of the rule is used up,
// and the shares sum to the limit); one asking its limit of one region
// gains most.
func (a *Allocator) Gain(rule string, demand map[string]float64) float64 {
	p := a.rules[rule]
	sum, n := 0.0, 0
	if p != nil {
		sum, n = sumInOrder(p.demand), len(p.demand)
	}
	total, served := 0.0, 0.0
	var keys [16]string
	for _, r := range sortedKeys(keys[:0], demand) {
		d := demand[r]
		if !(d > 0) || math.IsInf(d, 0) {
			continue
		}
		total += d
		switch {
		case sum > 0:
			served += min(d, p.demand[r]/sum)
		case n > 0:
			served += min(d, 1/float64(n))
		}
	}
	return max(0, min(1, total)-served)
}

// Weakest returns the counter of a rule with a budget of its own, not
// released and asking for less than its limit, that would lose least
// going back to the rule (Gain, of its smoothed demand), to make room for
// one that would gain more (Release). A counter asking for its limit or
// more keeps its budget until it falls idle: going back to the rule, it
// would run for a window or two on the shares its last leases gave it,
// which its demand may since have outgrown. Nor is one that got its budget
// since the last Rebalance taken: it has no smoothed demand yet, and got
// it for what it would gain.
func (a *Allocator) Weakest(rule string) (key string, gain float64, ok bool) {
	w := a.WeakestN(rule, 1)
	if len(w) == 0 {
		return "", 0, false
	}
	return w[0].Key, w[0].Gain, true
}

// Weak is a counter Weakest would give, and what it would lose.
type Weak struct {
	Key  string
	Gain float64
}

// WeakestN returns the n counters Weakest would give one after the other,
// each released in turn: in one pass over the rule's counters.
func (a *Allocator) WeakestN(rule string, n int) []Weak {
	p := a.rules[rule]
	if p == nil || n <= 0 {
		return nil
	}
	less := func(x, y Weak) bool { return x.Gain < y.Gain || (x.Gain == y.Gain && x.Key < y.Key) }
	out := make([]Weak, 0, n+1)
	for k, c := range p.counters {
		if !c.counter.released.IsZero() || c.counter.evicted || c.counter.since > p.seq {
			continue
		}
		if sumInOrder(c.demand) >= 1 {
			continue
		}
		w := Weak{k, a.Gain(rule, c.demand)}
		if len(out) == n && !less(w, out[n-1]) {
			continue
		}
		i := len(out)
		for i > 0 && less(w, out[i-1]) {
			i--
		}
		out = slices.Insert(out, i, w)
		if len(out) > n {
			out = out[:n]
		}
	}
	return out
}

// Release releases a counter's budget of its own, to make room for
// another: the next Rebalance gives it its last leases, each region's
// floor as high as its lease, so that its regions keep what they had of
// it until they go back to the rule — at the first window that begins
// after those leases have lapsed, as the leases say — rather than fall to
// their floors for a window or two. (A region that never gets them keeps
// the lease it held, whose floor is no higher than the rule's.)
func (a *Allocator) Release(rule, key string, now time.Time) {
	p := a.rules[rule]
	if p == nil || p.counters[key] == nil {
		return
	}
	cs := p.counters[key].counter
	if !cs.released.IsZero() || cs.evicted {
		return
	}
	cs.evicted = true
	p.releasedN++
}

// Counters returns the keys of the counters of a rule that have budgets of
// their own, sorted.
func (a *Allocator) Counters(rule string) []string {
	if s := a.rules[rule]; s != nil {
		return slices.Sorted(maps.Keys(s.counters))
	}
	return nil
}

// CounterDemand returns the smoothed demand of each region for one counter
// with a budget of its own.
func (a *Allocator) CounterDemand(rule, key string) map[string]float64 {
	if s := a.rules[rule]; s != nil && s.counters[key] != nil {
		return maps.Clone(s.counters[key].demand)
	}
	return nil
}

// floorHeld is the most a region may use of the counter without a lease:
// the highest floor of a lease it may hold, the one it acknowledged or a
// newer one.
func (c *ruleState) floorHeld(r string) float64 {
	f := 0.0
	for _, rec := range c.counter.floors[r] {
		if rec.Seq >= c.acked[r] {
			f = max(f, rec.Floor)
		}
	}
	return f
}

// tellFloor records that a region was told floor f with lease seq.
func (c *ruleState) tellFloor(r string, seq uint64, f float64) {
	recs := c.counter.floors[r]
	recs = slices.DeleteFunc(recs, func(x floorRec) bool { return x.Seq < c.acked[r] || x.Floor <= f })
	c.counter.floors[r] = append(recs, floorRec{seq, f})
}

// mayUseRule says whether a region may enforce the rule's lease on the
// counter: it has not acknowledged one of the counter's own leases. (A
// region that holds a document with the counter's lease enforces it, and
// every document after the counter's first leases has one, or says the
// counter is released: the rule's leases a region may still enforce on it
// are those it held before.)
func (c *ruleState) mayUseRule(r string) bool { return c.acked[r] < c.counter.since }

// rebalanceCounters computes the leases of every counter of a rule with a
// budget of its own, after the rule's (p): same Seq, same expiry. It
// appends them to out, and returns it.
//
// Each counter's rebalance reads the rule's state and writes its own:
// many counters are rebalanced in chunks in parallel (inChunks), each
// chunk's leases in its own part of out, which are then joined in key
// order, so that the leases are the same as one by one.
func (a *Allocator) rebalanceCounters(out []Lease, now time.Time, rule Rule, p *ruleState, regions []string, first, last int64, rb ruleBefore) []Lease {
	keys := slices.Sorted(maps.Keys(p.counters))
	// At most a lease a region per counter: each chunk appends in its
	// own stretch of out's room.
	per := len(regions)
	base := len(out)
	out = slices.Grow(out, len(keys)*per)[:base+len(keys)*per]
	type part struct {
		leases   []Lease
		done     []string // fallen idle: back to the rule
		released int
	}
	parts := make([]part, chunksOf(len(keys)))
	inChunks(len(keys), func(i, lo, hi int) {
		pt := &parts[i]
		pt.leases = out[base+lo*per : base+lo*per : base+hi*per]
		for _, key := range keys[lo:hi] {
			c := p.counters[key]
			var done bool
			pt.leases, done = a.rebalanceCounter(pt.leases, now, rule, key, c, p, regions, first, last, rb)
			if done {
				pt.done = append(pt.done, key)
				continue
			}
			if !c.counter.released.IsZero() || c.counter.evicted {
				pt.released++
			}
		}
	})
	out = out[:base]
	p.releasedN = 0
	for i := range parts {
		out = append(out, parts[i].leases...) // within its own stretch or before it: copy moves it down
		for _, key := range parts[i].done {
			delete(p.counters, key)
		}
		p.releasedN += parts[i].released
	}
	return out
}

// rebalanceCounter computes one counter's leases and appends them to out,
// which it returns; done says the counter has fallen idle and no region
// may still use a lease of its own: it goes back to the rule, and no
// lease is appended.
func (a *Allocator) rebalanceCounter(out []Lease, now time.Time, rule Rule, key string, c, p *ruleState, regions []string, first, last int64, rb ruleBefore) ([]Lease, bool) {
	c.window = p.window
	c.setSliding(p.sliding)
	cs := c.counter
	// (A region that has not heard that the limit was lowered uses more
	// of it than its fractions say: room counts them in the rule's limit,
	// Rule.Floors.)
	floorOf := c.floorHeld
	c.open(first, last, regions, floorOf)
	c.prune(now, a.cfg.Skew)
	c.lower(first, last, floorOf)
	c.takeDemand(now, regions, a.cfg.LeaseTTL, a.cfg.Smoothing)
	total := 0.0
	for _, r := range regions {
		total += c.demand[r]
	}
	if total > 0 {
		cs.lastDemand = now
	}
	// Where a region may enforce the rule's lease on the counter, it is
	// one it took before the counter's first leases: what it used in the
	// live windows when the counter got its budget (seed), and what the
	// rule's leases older than the counter's allow.
	if !cs.seeded {
		cs.seeded = true
		for e, hw := range rb.seed {
			for r, f := range hw {
				c.raise(e, r, f)
			}
		}
	}
	for e := first; e <= last; e++ {
		for _, r := range slices.Sorted(maps.Keys(c.hwRegions(e, e, regions))) {
			if c.mayUseRule(r) {
				c.raise(e, r, rb.most(r, cs.since, e, p.window, p.sliding))
			}
		}
	}
	if cs.released.IsZero() && !(total > 0) && now.Sub(cs.lastDemand) >= a.idleAfter(rule.Window) {
		// Idle: released. No more leases; the regions go back to the
		// rule once the last has lapsed.
		cs.release(now, rule.Window, rule.Sliding, a.cfg.Skew)
	}
	if !cs.released.IsZero() {
		if !now.Add(-a.cfg.Skew).Before(cs.released) {
			return out, true // every region is back on the rule
		}
		for _, r := range regions {
			out = append(out, Lease{Rule: rule.ID, Key: key, Region: r, Seq: p.seq, Issued: now, Released: cs.released})
		}
		return out, false
	}
	floorCap := a.cfg.Floor(len(regions))
	floors := make([]float64, len(regions))
	needs := make([]float64, len(regions))
	weights := make([]float64, len(regions))
	used := make([]float64, len(regions))
	// A fixed window's room is what each region has used of it, and the
	// rest shared out by demand over what is left of the window: a
	// region whose demand moved away keeps what it used, and no more.
	left, ep := 1.0, c.epoch(now)
	if !c.sliding {
		left = float64((ep+1)*c.window-now.UnixMicro()) / float64(c.window)
	}
	base := 0.0 // what the regions may use whatever the shares: floors, or what they used
	for i, r := range regions {
		floors[i] = 0
		if _, ok := c.heard[r]; !ok {
			// Not heard of the counter yet: it keeps the rule's floor
			// until it says what it asks of the counter (a region
			// that holds a lease of it reports it), so that a
			// tenant's spill there is not denied meanwhile.
			floors[i] = floorCap
		} else if total > 0 {
			// No higher than the rule's: a region that never hears the
			// counter was released stays on it.
			floors[i] = min(floorCap, a.cfg.Reserve*c.demand[r]/total)
		}
		if u, ok := cs.usedNow[r]; ok && u.epoch == ep && !c.sliding {
			used[i] = u.used
		}
		base += max(floors[i], used[i])
		weights[i] = c.demand[r]
		needs[i] = max(0, c.demand[r]*left-max(0, floors[i]-used[i]))
	}
	distributable := max(0, 1-base)
	shares := c.steady(regions, waterFill(needs, weights, distributable), distributable, a.cfg.Hysteresis)
	wants := make([]float64, len(regions))
	for i := range regions {
		wants[i] = max(floors[i], used[i]) + shares[i]
	}
	fractions := c.room(first, last, regions, floorOf, wants, higherLimits(rule, floorCap))

	expires := now.Add(a.cfg.LeaseTTL)
	c.counter.lastExpires = expires
	c.seq = p.seq
	if cs.evicted {
		// The last leases: they say when the regions go back to the
		// rule, and no lease of the counter follows them.
		cs.release(now, rule.Window, rule.Sliding, a.cfg.Skew)
	}
	for i, r := range regions {
		f := fractions[i]
		// A floor no higher than the lease: the region may use it for
		// as long as it holds no newer lease. The last leases' floors
		// are as high as the leases in a fixed window: no newer one
		// comes, and a region that holds one goes back to the rule
		// when it says, at a window's start. (A sliding window's
		// estimate carries the window before into the rule's, whose
		// room counts the rule's floor there.)
		fl := min(floors[i], f)
		if !cs.released.IsZero() && !rule.Sliding {
			fl = f
		}
		c.share[r] = f - fl
		c.tellFloor(r, p.seq, fl)
		c.issue(r, grant{seq: p.seq, fraction: f, floor: fl, expires: expires}, first, last)
		out = append(out, Lease{Rule: rule.ID, Key: key, Region: r, Seq: p.seq, Floor: fl, Share: f - fl, Issued: now, Expires: expires,
			Released: cs.released})
	}
	return out, false
}

// CounterSnapshot is what an allocator taking over needs of a counter with
// a budget of its own, besides the leases still in force.
type CounterSnapshot struct {
	Since    uint64                       `json:"since"`
	Marks    map[int64]map[string]float64 `json:"marks,omitempty"`
	Acked    map[string]uint64            `json:"acked,omitempty"`
	AckedExp map[string]time.Time         `json:"acked_expires,omitempty"`
	// Floors is the highest floor each region may use of the counter.
	Floors map[string]float64 `json:"floors,omitempty"`
	// LastDemand is the last rebalance that saw demand; Released, once
	// idle, when the regions go back to the rule.
	LastDemand time.Time `json:"last_demand,omitzero"`
	Released   time.Time `json:"released,omitzero"`
}

func (c *ruleState) counterSnapshot() CounterSnapshot {
	out := CounterSnapshot{Since: c.counter.since, Marks: make(map[int64]map[string]float64, len(c.hw)),
		Acked: maps.Clone(c.acked), AckedExp: maps.Clone(c.counter.ackedExp), Floors: map[string]float64{},
		LastDemand: c.counter.lastDemand, Released: c.counter.released}
	for e, hw := range c.hw {
		out.Marks[e] = maps.Clone(hw)
	}
	for r := range c.counter.floors {
		if f := c.floorHeld(r); f > 0 {
			out.Floors[r] = f
		}
	}
	return out
}

// newCounter gives a rule's counter a budget of its own, whose first
// leases are numbered since.
func (p *ruleState) newCounter(key string, since uint64) *ruleState {
	c := newRuleState()
	c.counter = &counterState{since: since, ackedExp: map[string]time.Time{}, floors: map[string][]floorRec{}, usedNow: map[string]usedIn{}}
	if p.counters == nil {
		p.counters = map[string]*ruleState{}
	}
	p.counters[key] = c
	return c
}

// restoreCounter takes in a counter's snapshot, after the leases (Restore)
// that the counter's rule numbers up to seq.
func (p *ruleState) restoreCounter(key string, snap CounterSnapshot) {
	c := p.counters[key]
	if c == nil {
		c = p.newCounter(key, snap.Since)
	}
	if snap.Since > 0 {
		c.counter.since = snap.Since
	}
	c.counter.seeded = true // the snapshot's marks hold the seed
	c.counter.lastDemand = later(c.counter.lastDemand, snap.LastDemand)
	c.counter.released = later(c.counter.released, snap.Released)
	c.restoreMarks(snap.Marks)
	for r, seq := range snap.Acked {
		if seq > c.acked[r] {
			c.acked[r] = seq
			c.counter.ackedExp[r] = snap.AckedExp[r]
		}
	}
	for r, f := range snap.Floors {
		if f > 0 && f <= 1+eps {
			// Until the region acknowledges a lease issued from now on.
			c.counter.floors[r] = append(c.counter.floors[r], floorRec{Seq: max(p.seq, c.acked[r]), Floor: f})
		}
	}
	for _, gs := range c.grants {
		for _, g := range gs {
			c.counter.lastExpires = later(c.counter.lastExpires, g.expires)
		}
	}
	c.pruneAcked()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// restoreCounterLeases tells a rule's counters of the leases another
// allocator issued of them.
func (p *ruleState) restoreCounterLeases(leases []Lease) {
	for _, l := range leases {
		c := p.counters[l.Key]
		if c == nil {
			c = p.newCounter(l.Key, l.Seq)
		}
		c.counter.since = min(c.counter.since, l.Seq)
		c.seq = max(c.seq, l.Seq)
		if !l.Released.IsZero() {
			c.counter.released = later(c.counter.released, l.Released)
			continue
		}
		c.grants[l.Region] = append(c.grants[l.Region], grant{seq: l.Seq, fraction: l.Floor + l.Share, floor: l.Floor, expires: l.Expires})
		c.tellFloor(l.Region, l.Seq, l.Floor)
		c.share[l.Region] = l.Share
		c.counter.lastExpires = later(c.counter.lastExpires, l.Expires)
	}
	for _, c := range p.counters {
		for r, gs := range c.grants {
			slices.SortFunc(gs, func(x, y grant) int { return cmp.Compare(x.seq, y.seq) })
			c.grants[r] = gs
		}
	}
}

// sumInOrder sums a map's values in the order of their keys, so that the
// sum is the same to the last bit whatever order the map ranges in.
func sumInOrder(m map[string]float64) float64 {
	var keys [16]string
	sum := 0.0
	for _, k := range sortedKeys(keys[:0], m) {
		sum += m[k]
	}
	return sum
}

// sortedKeys appends a map's keys to buf, sorted (a region's map: buf on
// the caller's stack holds them without allocating).
func sortedKeys(buf []string, m map[string]float64) []string {
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}
