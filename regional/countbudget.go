package regional

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
)

// Counters with budgets of their own (budget.ReportCounter): a global
// counter whose region was denied for want of budget, or is on course to
// be before the window ends (pressed), is reported on its own, globalsync may give it leases of its own, and the region then
// enforces those on it, and its rule's lease on the rule's other counters.
// A region takes a rule's document whole (SetBudget): the counters' leases
// before the rule's, so that no check sees the rule's newer lease on a
// counter without the counter's own.

// counterBudgets are the counter leases a region holds, and what it was
// asked of each counter it reports on its own.
type counterBudgets struct {
	mu   sync.Mutex                              // serializes SetBudget
	held atomic.Pointer[map[string]*heldCounter] // by counter key (CounterKey)
	// heldGen counts the budgets put in force: it grows after each is
	// stored, so that a reader that loads it, then held, knows the
	// budgets it read are in force while heldGen is the same (a denial
	// keeps a counter's budget by it, not by the map, which it would
	// keep alive).
	heldGen atomic.Uint64
	docSeq  map[string]uint64 // leaseKey → the newest document taken
	// docUntil is, by leaseKey, until when the newest document taken holds
	// off older ones: while its leases may hold, and no longer than a
	// lease's time after it was taken.
	docUntil map[string]time.Time

	demand  *shardMap[*counterDemand] // by counter key
	tracked atomic.Int64
}

// heldCounter is one counter's own budget as the region holds it: a lease
// (has), or none while the counter is released (it then enforces the
// rule's floor on it), and when it goes back to the rule (released).
type heldCounter struct {
	key          string // CounterKey(rule, values)
	rule, values string
	lease        budget.Lease
	has          bool
	released     time.Time
	recent       adoptions
	// leases are every region's lease of the counter (floor and share,
	// a fraction of its limit) in the document the region's own lease
	// came in, in the order of globalState.regions; nil unless the
	// document gave every region one. An elastic region reads what the
	// others may still admit in them (overrun).
	leases []float64
}

// counterDemand counts what a region was asked for of one counter, as
// ruleDemand does for a rule.
type counterDemand struct {
	key              string // CounterKey(rule, values)
	rule, values     string
	since            int64 // µs: when the region began counting
	admitted, denied atomic.Int64
	touched          atomic.Int64 // µs of the last check
	reported         atomic.Int64 // admitted and denied, as last reported
	gone             atomic.Bool  // forgotten: a denial that kept it looks it up again
}

// maxTrackedCounters bounds the counters a region tracks on their own:
// the most a rule may give budgets of their own to, and as many
// candidates.
const maxTrackedCounters = 2 * budget.MaxCounters

// maxCandidates bounds the counters without a budget of their own that a
// report names: those asked for most since they were last reported.
const maxCandidates = 200

// trackIdle is how long a counter tracked on its own, with no lease, may go
// without a check before it is forgotten.
const trackIdle = 30 * time.Second

// counter returns the budget the region holds for a counter key, if it has
// one and has not gone back to the rule by now.
func (g *globalState) counter(key []byte, now time.Time) *heldCounter {
	return liveAt(heldIn(g.budgets.held.Load(), key), now)
}

// heldIn is a counter key's budget in the budgets m, if it has one.
func heldIn(m *map[string]*heldCounter, key []byte) *heldCounter {
	if m == nil || len(*m) == 0 {
		return nil
	}
	return (*m)[string(key)]
}

// liveAt is h, unless it has gone back to the rule by now.
func liveAt(h *heldCounter, now time.Time) *heldCounter {
	if h == nil || (!h.released.IsZero() && !now.Before(h.released)) {
		return nil
	}
	return h
}

// heldFor is counter for a check's item at the check's time now (µs),
// looked up once for the check.
func (e *Engine) heldFor(it *item, now int64) *heldCounter {
	if !it.heldKnown {
		it.heldGen = e.global.budgets.heldGen.Load()
		it.heldEntry = heldIn(e.global.budgets.held.Load(), it.key)
		it.held, it.heldKnown = liveAt(it.heldEntry, time.UnixMicro(now)), true
	}
	return it.held
}

// SetBudget puts a rule's budget document in force: the region's lease of
// the rule (SetLease) and of each counter with a budget of its own; the
// other regions' leases are noted for usage reports. A document older than
// the newest taken for its rule changes nothing while that one's leases
// could hold (see leaseCap): a document forged with a far higher Seq holds
// off the leader's for no longer than a lease. It reports whether the
// document was taken.
//
// A document of one slice of the rule's counters (globalsync sharded,
// budget.ShardOf) is the rule's on that slice alone: its counters replace
// those of its slice, and a counter it names of another slice is not
// taken. The number of slices changes only once no lease of the rule the
// region holds may still hold (docs/operations.md says how to reslice),
// and only for a document whose leases are in force: then every lease of
// the rule held before is dropped (the region runs on its floor until
// each slice's document comes). A document of another slicing meanwhile
// — a key left in the bucket by an earlier one, replayed by a watch —
// changes nothing.
func (e *Engine) SetBudget(d budget.Document) bool {
	g := e.global
	if g.alone || d.Rule == "" {
		return false
	}
	now := e.now()
	n := max(1, d.Shards)
	if d.Shard < 0 || d.Shard >= n || n > budget.MaxShards {
		return false
	}
	dk := leaseKey(d.Rule, d.Shard)
	g.budgets.mu.Lock()
	if d.Seq <= g.budgets.docSeq[dk] && now.Before(g.budgets.docUntil[dk]) {
		g.budgets.mu.Unlock()
		return false
	}
	limit := e.leaseCap(now)
	// It holds off older documents while its leases may hold: a leader
	// that forgot the rule numbers its leases anew, and its documents
	// must be taken once these have lapsed, not a longest lease later.
	until := d.CounterExpires
	for _, l := range d.Leases {
		until = later(until, l.Expires)
	}
	until = earlier(until, limit)
	resliced := false
	if was := max(1, (*g.shards.Load())[d.Rule]); n != was {
		if !now.Before(until) || e.mayHold(d.Rule, was, now) {
			g.budgets.mu.Unlock()
			return false
		}
		e.setShards(d.Rule, was, n)
		resliced = true
	}
	g.budgets.docSeq[dk], g.budgets.docUntil[dk] = d.Seq, until
	if d.CounterExpires.After(limit) {
		d.CounterExpires = limit
	}
	cur := g.budgets.held.Load()
	next := make(map[string]*heldCounter, len(*cur)+len(d.Counters))
	for k, h := range *cur {
		if h.rule != d.Rule || (!resliced && budget.ShardOf(k, n) != d.Shard) {
			next[k] = h
		}
	}
	var buf []byte
	for values, byRegion := range d.Counters {
		buf = appendCounterKey(buf[:0], d.Rule, values)
		if budget.ShardOf(buf, n) != d.Shard {
			continue // another slice's: not this leader's to give
		}
		old := (*cur)[string(buf)]
		if resliced {
			old = nil
		}
		var h *heldCounter
		if old != nil && old.rule == d.Rule {
			h = new(heldCounter)
			*h = *old
		} else {
			h = &heldCounter{key: string(buf), rule: d.Rule, values: values}
		}
		c, ok := byRegion[e.cfg.Region]
		switch {
		case !ok:
			// No word for this region: as it was.
			if old == nil {
				continue
			}
		case !c.Released.IsZero() && c.Floor+c.Share <= 0:
			// Released: the lease held (or the rule's floor) until then
			// — a last lease held, until its own release (it may be of
			// an earlier budget of the counter, come late).
			if !h.has || !h.lease.Last() {
				h.released = c.Released
			}
		default:
			// A lease; or the counter's last, held until its release.
			l := budget.Lease{Rule: d.Rule, Key: values, Region: e.cfg.Region, Seq: d.Seq, Floor: c.Floor, Share: c.Share,
				Issued: d.Issued, Expires: d.CounterExpires, Released: c.Released}
			if !h.has || l.Seq > h.lease.Seq || !h.lease.Holds(now) {
				h.recent = h.recent.kept(now, e.cfg.Timeout)
				h.lease, h.has, h.released = l, true, c.Released
				h.recent = append(h.recent, adoption{seq: l.Seq, at: now})
				h.leases = regionLeases(byRegion, g.regions)
			}
		}
		next[h.key] = h
	}
	// Counters the document does not name have gone back to the rule.
	g.budgets.held.Store(&next)
	g.budgets.heldGen.Add(1)
	g.budgets.mu.Unlock()
	for _, l := range d.All() {
		e.SetLease(l)
	}
	return true
}

// mayHold reports whether a lease of a rule the region holds, of the
// rule's (in any of its was slices) or of a counter's own budget, may
// still hold at now, or a released counter still waits for its release.
// Called with budgets.mu held.
func (e *Engine) mayHold(rule string, was int, now time.Time) bool {
	g := e.global
	for i := range was {
		if now.Before(g.budgets.docUntil[leaseKey(rule, i)]) {
			return true
		}
	}
	for _, h := range *g.leases.Load() {
		if h.lease.Rule == rule && h.lease.Holds(now) {
			return true
		}
	}
	for _, h := range *g.budgets.held.Load() {
		if h.rule == rule && (h.has && h.lease.Holds(now) || now.Before(h.released)) {
			return true
		}
	}
	return false
}

// setShards notes that a rule's counters are cut in n slices, no longer
// in was, and drops the rule's leases of every slice. Called with
// budgets.mu held.
func (e *Engine) setShards(rule string, was, n int) {
	g := e.global
	cur := *g.shards.Load()
	next := make(map[string]int, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	if n > 1 {
		next[rule] = n
	} else {
		delete(next, rule)
	}
	g.leaseMu.Lock()
	leases := *g.leases.Load()
	kept := make(map[string]*heldLease, len(leases))
	for k, h := range leases {
		if h.lease.Rule != rule {
			kept[k] = h
		}
	}
	for i := range was {
		delete(g.budgets.docSeq, leaseKey(rule, i))
		delete(g.budgets.docUntil, leaseKey(rule, i))
	}
	g.leases.Store(&kept)
	g.shards.Store(&next)
	g.leaseMu.Unlock()
}

// regionLeases is every region's lease of a counter in a document (floor
// and share), in the order of regions, or nil if one has none, or has been
// released.
func regionLeases(byRegion map[string]budget.CounterLeaseDoc, regions []string) []float64 {
	out := make([]float64, len(regions))
	for i, r := range regions {
		c, ok := byRegion[r]
		if !ok || !c.Released.IsZero() {
			return nil
		}
		out[i] = c.Floor + c.Share
	}
	return out
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// counterAllowance is the fraction of a counter's limit the region may
// admit at now under the counter's own budget.
func (e *Engine) counterAllowance(h *heldCounter, r *Rule, now time.Time) float64 {
	if !h.has {
		return e.ruleFloor(r)
	}
	return budget.Allowance(&h.lease, h.lease.Floor, now)
}

// ruleFloor is what the region may admit of a global rule's counters with
// no lease in force.
func (e *Engine) ruleFloor(r *Rule) float64 {
	if h := (*e.global.leases.Load())[r.ID]; h != nil {
		return min(e.global.floor, h.lease.Floor)
	}
	return e.global.floor
}

// trackCounter counts a check of a counter on its own, asking for units
// (millionths of its limit): one that holds a budget of its own, or one
// denied under the rule's lease (a candidate).
func (e *Engine) trackCounter(it *item, units int64, admitted, denied bool, now int64) {
	d := it.demand
	if d == nil {
		d = e.lookupDemand(it, now)
		it.demand = d
	}
	if d == nil {
		return
	}
	switch {
	case admitted:
		d.admitted.Add(units)
	case denied:
		d.denied.Add(units)
	}
	d.touched.Store(now)
}

// lookupDemand finds what the region counts of a check's counter on its
// own; nil for one it begins to track now, if there is room (this check
// is left out of it).
func (e *Engine) lookupDemand(it *item, now int64) *counterDemand {
	g := e.global
	var d *counterDemand
	g.budgets.demand.with(it.key, func(m map[string]*counterDemand) {
		if d = m[string(it.key)]; d != nil || g.budgets.tracked.Load() >= maxTrackedCounters {
			return
		}
		key := string(it.key)
		rule, values, ok := ParseCounterKey(key)
		if !ok {
			return
		}
		// Counted from this check on, this one left out: a rate of
		// the first report is what came in since it (one check over
		// a few hundred milliseconds is no pace).
		m[key] = &counterDemand{key: key, rule: rule, values: values, since: now}
		g.budgets.tracked.Add(1)
	})
	return d
}

// CounterReport is what a replica reports of one counter on its own.
type CounterReport struct {
	// Key is the counter's key within its rule.
	Key string
	// Admitted and Denied are cumulative, in limits, as a rule's are,
	// counted for Counted (0 for a counter held but not asked for).
	Admitted, Denied float64
	Counted          time.Duration
	// Acked is the Seq of the counter's lease the replica may
	// acknowledge, 0 for none.
	Acked uint64
	// Used is what the region counted of the counter in window UsedEpoch,
	// as a fraction of its limit; PrevUsed, with HasPrev, in the window
	// before (a sliding window's estimate carries it).
	Used      float64
	UsedEpoch int64
	PrevUsed  float64
	HasPrev   bool
}

// counterReports reports a rule's counters on their own: every one the
// region holds a budget for, then the candidates most asked for, at most
// budget.MaxCounters in all. Counters no longer asked for are forgotten.
func (e *Engine) counterReports(r *Rule, now time.Time) []CounterReport {
	g := e.global
	held := *g.budgets.held.Load()
	us := now.UnixMicro()
	type cand struct {
		d    *counterDemand
		held *heldCounter
	}
	var cands []cand
	g.budgets.demand.sweep(func(k string, d *counterDemand) bool {
		if d.rule != r.ID {
			return false
		}
		h := held[k]
		if h == nil && us-d.touched.Load() > trackIdle.Microseconds() {
			g.budgets.tracked.Add(-1)
			d.gone.Store(true)
			return true
		}
		cands = append(cands, cand{d, h})
		return false
	})
	for k, h := range held {
		if h.rule == r.ID {
			if _, ok := g.budgets.demand.load([]byte(k)); !ok {
				cands = append(cands, cand{&counterDemand{key: k, rule: h.rule, values: h.values}, h})
			}
		}
	}
	// Held first, then those asked for most since they were last
	// reported (a candidate counts what it was denied, and what it was
	// admitted while pressed); in key order for equal ones.
	total := func(d *counterDemand) int64 { return d.admitted.Load() + d.denied.Load() }
	recent := func(d *counterDemand) int64 { return total(d) - d.reported.Load() }
	slices.SortFunc(cands, func(a, b cand) int {
		if (a.held != nil) != (b.held != nil) {
			if a.held != nil {
				return -1
			}
			return 1
		}
		if a.held == nil {
			if c := cmp.Compare(recent(b.d), recent(a.d)); c != 0 {
				return c
			}
		}
		return cmp.Compare(a.d.values, b.d.values)
	})
	n := 0
	for n < len(cands) && cands[n].held != nil {
		n++
	}
	nheld := n
	for n < len(cands) && n < budget.MaxCounters && recent(cands[n].d) > 0 && n-nheld < maxCandidates {
		n++
	}
	cands = cands[:min(n, budget.MaxCounters)]
	for _, c := range cands {
		c.d.reported.Store(total(c.d))
	}
	window := r.Base.Window
	ep := us / max(1, window)
	out := make([]CounterReport, 0, len(cands))
	rs := e.rules.Load()
	for _, c := range cands {
		rep := CounterReport{Key: c.d.values, Admitted: float64(c.d.admitted.Load()) / 1e6, Denied: float64(c.d.denied.Load()) / 1e6, UsedEpoch: ep}
		if c.d.since != 0 {
			rep.Counted = counted(c.d.since, now)
		}
		if c.held != nil && c.held.has {
			rep.Acked = c.held.recent.ackable(now, e.cfg.Timeout)
		}
		key := c.d.key
		if gr, limit, ok := rs.GlobalLimitOf(key); ok && limit > 0 {
			start := ep * window / 1000
			var p, n, pp, pn uint64
			g.usage.with(func(cs *crdt.Counters) {
				p, n = cs.Own(crdt.ID{Key: key, Epoch: start})
				pp, pn = cs.Own(crdt.ID{Key: key, Epoch: start - window/1000})
			})
			// Decided in memory lately: the most the region may have used.
			if b := g.degraded.usedBound(key, start); b > p-min(p, n) {
				p, n = b, 0
			}
			if b := g.degraded.usedBound(key, start-window/1000); b > pp-min(pp, pn) {
				pp, pn = b, 0
			}
			rep.Used = math.Max(0, float64(int64(p)-int64(n))) / float64(limit)
			if gr.Base.Algorithm == Concurrency {
				// In flight: the window before's slots count still.
				rep.Used += math.Max(0, float64(int64(pp)-int64(pn))) / float64(limit)
			}
			if g.startedUs <= (ep-1)*window {
				// This copy has counted since before the window before
				// began: it knows what the region counted in it.
				rep.PrevUsed, rep.HasPrev = math.Max(0, float64(int64(pp)-int64(pn)))/float64(limit), true
			}
		}
		out = append(out, rep)
	}
	return out
}

// CounterAllowance is GlobalAllowance for one counter of a global rule
// (values: its key within the rule, as the rule joins its descriptors):
// the fraction of the counter's limit the region may admit in a window
// now, under the counter's own budget if it has one, and whether a lease
// is in force.
func (e *Engine) CounterAllowance(rule, values string) (float64, bool) {
	r := e.rules.Load().Rule(rule)
	if r == nil || r.Scope != ScopeGlobal {
		return 0, false
	}
	now := e.now()
	if e.global.alone {
		return 1, false
	}
	key := []byte(CounterKey(rule, values))
	if h := e.global.counter(key, now); h != nil {
		return e.counterAllowance(h, r, now), h.has && h.lease.Holds(now)
	}
	frac, _, _ := e.allowance(r, key, now)
	h := e.global.ruleLease(rule, key)
	return frac, h != nil && h.lease.Holds(now)
}
