package regional

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
)

// GlobalConfig says where this region stands among the others, for global
// rules.
type GlobalConfig struct {
	// Regions are all the regions, this one included (--regions). Empty
	// or naming this region alone: the region is the only one and
	// enforces every global limit whole (--dev).
	Regions []string
	// Budget holds the reserve that makes the floors and the headroom of
	// elastic mode; the zero value means budget.DefaultConfig().
	Budget budget.Config
	// UnknownPeers, with no Regions, says the region may have peers it
	// does not know of (regiond with --nats but no --regions): it is not
	// alone, takes the whole reserve as its floor, and never borrows in
	// elastic mode, since it cannot hear the others' usage.
	UnknownPeers bool
	// StaleAfter is how long another region may go unheard (HeardFrom)
	// before this one stops borrowing in elastic mode: slack seen in a
	// copy of the others' usage that old may have been spent since, and
	// a region cut off would otherwise borrow the whole limit by itself.
	// 0 means 1.5s: three of the transport's heartbeats.
	StaleAfter time.Duration
	// Lag is how far behind the others' usage this region's copy runs: a
	// gossip round and the time on the wire. In elastic mode a region
	// does not borrow what the other regions may have admitted of a
	// counter in that time (at the pace it admits the counter itself,
	// each): a counter that takes its whole limit within a gossip round
	// borrows nothing. 0 means 500ms.
	Lag time.Duration
}

// DefaultStaleAfter and DefaultLag are GlobalConfig's defaults.
const (
	DefaultStaleAfter = 1500 * time.Millisecond
	DefaultLag        = 500 * time.Millisecond
)

// Validate reports whether the configuration is usable for region.
func (c GlobalConfig) Validate(region string) error {
	if c.StaleAfter < 0 {
		return fmt.Errorf("regional: global stale_after %v: want 0 or more", c.StaleAfter)
	}
	if c.Lag < 0 {
		return fmt.Errorf("regional: global lag %v: want 0 or more", c.Lag)
	}
	if c.Budget != (budget.Config{}) {
		if err := c.Budget.Validate(); err != nil {
			return err
		}
	}
	if len(c.Regions) == 0 {
		return nil
	}
	_, err := crdt.NewCounters(region, c.Regions)
	return err
}

// globalDenialHold bounds how long a global limit's denial is served from
// the denial cache: a new lease or gossip from the other regions may free
// room sooner than the window ends.
const globalDenialHold = 250_000 // µs

// globalState is the engine's part in global limits: leases, demand, and
// this replica's copy of the global counters.
type globalState struct {
	alone        bool
	unknownPeers bool
	floor        float64
	budget       budget.Config
	usage        *counters
	regions      []string // every region counted, this one included, sorted
	self         int      // this region's index in regions
	known        map[string]bool

	leaseMu sync.Mutex
	leases  atomic.Pointer[map[string]*heldLease] // by leaseKey
	// shards is, by rule, how many slices globalsync cuts the rule's
	// counters in (budget.ShardOf), as its documents last said: only
	// rules cut in more than one.
	shards atomic.Pointer[map[string]int]
	demand sync.Map // rule id → *ruleDemand
	others sync.Map // rule id + "\x00" + region → budget.Lease: other regions', for usage reports

	// Elastic mode borrows only while every other region was heard from
	// within staleAfter: freshUntil (µs) is when the first of them goes
	// stale, 0 while one was never heard.
	staleAfter time.Duration
	lag        int64    // µs: GlobalConfig.Lag
	peers      []string // the other regions
	heardMu    sync.Mutex
	heard      map[string]time.Time
	freshUntil atomic.Int64

	expired atomic.Int64 // µs of the last expireGlobal

	budgets   counterBudgets
	degraded  degradedGlobals // what this replica admitted without its store
	startedUs int64           // when the engine began counting, µs
}

type heldLease struct {
	lease budget.Lease
	// recent lists the leases taken lately, newest last: the one to
	// acknowledge is the newest taken long enough ago.
	recent adoptions
}

type adoption struct {
	seq uint64
	at  time.Time
}

// ruleDemand counts what a region was asked for under one global rule, in
// millionths of the limit of each request's counter.
type ruleDemand struct {
	since            int64 // µs: when the region began counting
	admitted, denied atomic.Int64
	// hitCost is what a hit of the rule that counted something costs, on
	// average (moving, in 1/1024ths): what a denied check that counts
	// nothing (the gateway's question before a metered request) asks for.
	hitCost   atomic.Int64
	usedEpoch atomic.Int64 // the window used is about, µs since the epoch / window
	used      atomic.Int64 // the most any counter used in it, millionths
	prevUsed  atomic.Int64 // the same of the window before, or -1: unknown
}

func newGlobalState(region string, cfg GlobalConfig) (*globalState, error) {
	g := &globalState{budget: cfg.Budget, staleAfter: cfg.StaleAfter, lag: cfg.Lag.Microseconds(), heard: map[string]time.Time{}}
	if g.staleAfter <= 0 {
		g.staleAfter = DefaultStaleAfter
	}
	if g.lag <= 0 {
		g.lag = DefaultLag.Microseconds()
	}
	if g.budget == (budget.Config{}) {
		g.budget = budget.DefaultConfig()
	}
	regions := cfg.Regions
	switch {
	case len(regions) == 0 && cfg.UnknownPeers:
		g.unknownPeers, g.floor = true, g.budget.Floor(1)
		regions = []string{region}
	case len(regions) == 0 || (len(regions) == 1 && regions[0] == region):
		g.alone, g.floor = true, 1
		regions = []string{region}
	default:
		g.floor = g.budget.Floor(len(regions))
	}
	u, err := newCounters(region, regions)
	if err != nil {
		return nil, err
	}
	g.usage, g.regions, g.known = u, u.c.Regions(), map[string]bool{}
	g.self = slices.Index(g.regions, region)
	for _, r := range g.regions {
		g.known[r] = true
	}
	for _, r := range regions {
		if r != region {
			g.peers = append(g.peers, r)
		}
	}
	g.leases.Store(new(map[string]*heldLease))
	g.shards.Store(new(map[string]int))
	g.budgets.held.Store(new(map[string]*heldCounter))
	g.budgets.demand = newShardMap[*counterDemand]()
	g.budgets.docSeq, g.budgets.docUntil = map[string]uint64{}, map[string]time.Time{}
	return g, nil
}

// counters is this replica's copy of the global counters: the region's
// own slots, as its store reports them after every check, and the other
// regions' slots as gossip brings them. Safe for concurrent use.
type counters struct {
	mu sync.Mutex
	c  *crdt.Counters
}

func newCounters(region string, regions []string) (*counters, error) {
	c, err := crdt.NewCounters(region, regions)
	if err != nil {
		return nil, err
	}
	return &counters{c: c}, nil
}

// with runs f with the counters, alone.
func (u *counters) with(f func(*crdt.Counters)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f(u.c)
}

// The engine's API for global usage, as the gossip (transport/gossip) and
// the simulator drive it. Every method is safe for concurrent use, with
// each other and with checks.

// GlobalRegions returns the regions whose usage the engine counts, this
// one included, sorted: --regions, or this region alone.
func (e *Engine) GlobalRegions() []string { return slices.Clone(e.global.regions) }

// OwnDeltas returns this region's slots of the global counters changed
// after version since (0: every one), in deltas of at most max entries,
// each covering a range of the copy's versions: what the region gossips
// to the others (crdt.Counters.OwnDeltas).
func (e *Engine) OwnDeltas(since uint64, max int) []crdt.Delta {
	var ds []crdt.Delta
	e.global.usage.with(func(c *crdt.Counters) { ds = c.OwnDeltas(since, max) })
	return ds
}

// RegionState returns every slot of one region that the engine's copy of
// the global counters holds: what is sent back to a region that lost its
// own.
func (e *Engine) RegionState(region string) crdt.Delta {
	var d crdt.Delta
	e.global.usage.with(func(c *crdt.Counters) { d = c.RegionState(region) })
	return d
}

// ObserveOwn takes in this region's own slots as a sibling replica saw its
// store count them: the store has them already, and the engine's copy
// takes them for anti-entropy. Other regions' slots in d are ignored.
func (e *Engine) ObserveOwn(d crdt.Delta) {
	self := e.cfg.Region
	e.global.usage.with(func(c *crdt.Counters) {
		for _, en := range d.Entries {
			for _, s := range en.Slots {
				if s.Region == self {
					c.Observe(en.ID, s.P, s.N)
				}
			}
		}
	})
}

// GlobalCounter returns the engine's copy of one global counter's window.
func (e *Engine) GlobalCounter(id crdt.ID) crdt.PNCounter {
	var pn crdt.PNCounter
	e.global.usage.with(func(c *crdt.Counters) { pn = c.Get(id) })
	return pn
}

// Alone reports whether this region enforces global limits by itself.
func (e *Engine) Alone() bool { return e.global.alone }

// Floor is the fraction of every global limit the region may use without
// a lease.
func (e *Engine) Floor() float64 { return e.global.floor }

// SetLease puts a budget lease in force. A lease older (by Seq) than the
// one held is ignored while the one held holds; one for another region is
// only noted, for usage reports. A lease holds no longer than leaseCap.
func (e *Engine) SetLease(l budget.Lease) bool {
	g := e.global
	if l.Region != e.cfg.Region {
		if l.Shard == 0 {
			g.others.Store(l.Rule+"\x00"+l.Region, l)
		}
		return false
	}
	if g.alone {
		return false
	}
	now := e.now()
	if c := e.leaseCap(now); l.Expires.After(c) {
		l.Expires = c
	}
	g.leaseMu.Lock()
	defer g.leaseMu.Unlock()
	cur := *g.leases.Load()
	key := leaseKey(l.Rule, l.Shard)
	old := cur[key]
	if old != nil && l.Seq <= old.lease.Seq && old.lease.Holds(now) {
		return false
	}
	next := make(map[string]*heldLease, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	h := &heldLease{lease: l}
	if old != nil {
		h.recent = old.recent.kept(now, e.cfg.Timeout)
	}
	h.recent = append(h.recent, adoption{seq: l.Seq, at: now})
	next[key] = h
	g.leases.Store(&next)
	return true
}

// leaseKey is where a rule's lease of one slice of its counters is held:
// the rule's id for slice 0, the only one when globalsync is not sharded.
func leaseKey(rule string, shard int) string {
	if shard == 0 {
		return rule
	}
	return rule + "\x00" + strconv.Itoa(shard)
}

// ruleLease is the rule's lease held for the slice of a counter (its key;
// nil: slice 0), or nil.
func (g *globalState) ruleLease(rule string, key []byte) *heldLease {
	leases := *g.leases.Load()
	if shards := *g.shards.Load(); len(shards) > 0 && key != nil {
		if s := budget.ShardOf(key, shards[rule]); s != 0 {
			return leases[leaseKey(rule, s)]
		}
	}
	return leases[rule]
}

// acks are the Seqs the region may acknowledge of each slice's lease of a
// rule cut in slices (nil for one that is not).
func (e *Engine) acks(rule string, now time.Time) []uint64 {
	g := e.global
	n := (*g.shards.Load())[rule]
	if n <= 1 {
		return nil
	}
	leases := *g.leases.Load()
	out := make([]uint64, n)
	for i := range out {
		if h := leases[leaseKey(rule, i)]; h != nil {
			out[i] = h.recent.ackable(now, e.cfg.Timeout)
		}
	}
	return out
}

// leaseCap is the latest a lease taken at now may hold, so that a lease
// forged to expire far ahead holds no longer than a real one could: a
// lease's time (the budget configuration's, if given; else the longest
// globalsync issues, budget.MaxLeaseTTL) and the clock-skew allowance.
func (e *Engine) leaseCap(now time.Time) time.Time {
	c := e.cfg.Global.Budget
	if c == (budget.Config{}) {
		c = budget.DefaultConfig()
		c.LeaseTTL = budget.MaxLeaseTTL
	}
	return now.Add(c.LeaseTTL + c.Skew)
}

// HeardFrom tells the engine that a message from another region arrived
// now, by the engine's clock (the gossip calls it for every message it
// accepts). Elastic mode borrows only while every other region has been
// heard from lately. Names of no other region are ignored.
func (e *Engine) HeardFrom(region string) {
	g := e.global
	if region == e.cfg.Region || g.alone || g.unknownPeers {
		return
	}
	if !slices.Contains(g.peers, region) {
		return
	}
	at := e.now()
	g.heardMu.Lock()
	defer g.heardMu.Unlock()
	g.heard[region] = at // the latest arrival, even if the clock went back
	until := int64(math.MaxInt64)
	for _, r := range g.peers {
		h, ok := g.heard[r]
		if !ok {
			until = 0
			break
		}
		until = min(until, h.Add(g.staleAfter).UnixMicro())
	}
	g.freshUntil.Store(until)
}

// LastHeard returns when another region was last heard from (HeardFrom),
// by the engine's clock.
func (e *Engine) LastHeard(region string) (time.Time, bool) {
	g := e.global
	g.heardMu.Lock()
	defer g.heardMu.Unlock()
	at, ok := g.heard[region]
	return at, ok
}

// StaleAfter is how long another region may go unheard before its part of
// global usage counts as stale (GlobalConfig.StaleAfter).
func (e *Engine) StaleAfter() time.Duration { return e.global.staleAfter }

// otherAllowance is what another region may admit of a rule now, as its
// last lease known here says, or -1 if none is known.
func (e *Engine) otherAllowance(rule, region string, now time.Time) float64 {
	v, ok := e.global.others.Load(rule + "\x00" + region)
	if !ok {
		return -1
	}
	l := v.(budget.Lease)
	return budget.Allowance(&l, l.Floor, now)
}

// ackDelay is how long a lease must have been in force before the region
// acknowledges it: two store timeouts, so that no check made under an
// older lease is still in flight.
func ackDelay(timeout time.Duration) time.Duration { return 2 * timeout }

// adoptions are the leases a region took lately, oldest first.
type adoptions []adoption

// ackable is the Seq the region may acknowledge at now: that of the
// newest lease taken more than ackDelay ago.
func (as adoptions) ackable(now time.Time, timeout time.Duration) uint64 {
	var seq uint64
	for _, a := range as {
		if now.Sub(a.at) > ackDelay(timeout) {
			seq = a.seq
		}
	}
	return seq
}

// kept is what is still needed to tell the newest ackable lease: the
// newest adoption older than the ack delay, and all after; a copy.
func (as adoptions) kept(now time.Time, timeout time.Duration) adoptions {
	keep := 0
	for i, a := range as {
		if now.Sub(a.at) > ackDelay(timeout) {
			keep = i
		}
	}
	return slices.Clone(as[keep:])
}

// Lease returns the lease held for a rule, and the Seq the region may
// acknowledge.
func (e *Engine) Lease(rule string) (budget.Lease, uint64, bool) {
	h := (*e.global.leases.Load())[rule]
	if h == nil {
		return budget.Lease{}, 0, false
	}
	return h.lease, h.recent.ackable(e.now(), e.cfg.Timeout), true
}

// GlobalAllowance is the fraction of a global rule's limit the region may
// admit in a window now, as its checks apply it (its lease's allowance,
// or its floor), and whether a lease is in force; 0 and false for a rule
// that is not global.
func (e *Engine) GlobalAllowance(rule string) (float64, bool) {
	r := e.rules.Load().Rule(rule)
	if r == nil || r.Scope != ScopeGlobal {
		return 0, false
	}
	now := e.now()
	frac, _, _ := e.allowance(r, nil, now)
	h := (*e.global.leases.Load())[rule]
	return frac, h != nil && h.lease.Holds(now)
}

// allowance is the fraction of a global rule's limit the region may admit
// of a counter (key; nil: one with no budget of its own) at now, the part
// of it withheld as debt, and whether it is the counter's own budget's.
func (e *Engine) allowance(r *Rule, key []byte, now time.Time) (frac, debt float64, own bool) {
	var h *heldCounter
	if key != nil && !e.global.alone {
		h = e.global.counter(key, now)
	}
	return e.allowanceOf(r, key, h, now)
}

// allowanceOf is allowance of a counter (key) whose budget of its own at
// now is h (nil: none).
func (e *Engine) allowanceOf(r *Rule, key []byte, h *heldCounter, now time.Time) (frac, debt float64, own bool) {
	g := e.global
	if g.alone {
		return 1, 0, false
	}
	if h != nil {
		return e.counterAllowance(h, r, now), 0, true
	}
	var l *budget.Lease
	if h := g.ruleLease(r.ID, key); h != nil {
		l = &h.lease
	}
	if l != nil && l.Holds(now) {
		return l.Allowance(), l.Debt, false
	}
	if l != nil {
		// The floor globalsync last set, if lower than ours: it counts
		// the regions it knows, which may be more than we were told.
		return min(g.floor, l.Floor), 0, false
	}
	return g.floor, 0, false
}

// globalOp fills in a global limit's op: its allowance, and for elastic
// mode its ceiling: the limit less the headroom, and less any debt the
// region owes (an over-admitting region borrows less). A region that has
// not heard from every other lately does not borrow: it keeps to its
// allowance, as in strict mode.
func (e *Engine) globalOp(op *Op, r *Rule, held *heldCounter, now time.Time) {
	limit := float64(op.Params.Limit)
	frac, debt, own := e.allowanceOf(r, op.Key, held, now)
	op.Global = true
	op.Allowance = int64(math.Floor(frac*limit + 1e-9))
	op.Ceiling = -1
	op.KnownStart, op.KnownP, op.KnownN = 0, 0, 0
	// Elastic mode borrows while the region has heard from every other
	// lately, and its store has every region's slots (one coming back
	// after an outage, the breaker's probe included, may have lost the
	// others': no borrowing until Maintain has given them back).
	elastic := r.Mode == ModeElastic && !e.global.alone
	borrows := elastic && !own && !e.global.unknownPeers && now.UnixMicro() < e.global.freshUntil.Load() &&
		e.breaker.State() == BreakerClosed && e.breaker.recoveries.Load() == e.reseeded.Load()
	if elastic && own {
		// A counter with a budget of its own borrows nothing: its
		// leases follow its own demand, and room moves to it inside the
		// window. It got one because it asked for more than its share:
		// every region wants more of it, and the slack one sees, a
		// gossip round late, the others are taking too. It keeps to
		// its allowance within the limit as the region sees it (a
		// ceiling of 0), less its part of what regions admitted beyond
		// their leases (overrun): what the others borrowed before it had
		// a budget of its own is not in its leases.
		op.Ceiling = 0
		if held.has && op.Params.Algorithm == FixedWindow {
			op.Allowance = max(0, op.Allowance-e.overrun(op, held, now))
		}
	}
	if !e.shared && !borrows {
		return // the engine's own memory decides against the copy itself
	}
	// What this replica knows the region counted in the window: in case
	// a shared store lost it (the engine's own memory cannot), and the
	// pace at which the region admits the counter.
	us, window := now.UnixMicro(), op.Params.Window
	start := us / window * window
	var t crdt.Tally
	e.global.usage.with(func(c *crdt.Counters) { t = c.Tally(op.Key, start/1000) })
	p, n := t.P, t.N
	if e.shared {
		op.KnownStart, op.KnownP, op.KnownN = start/1000, p, n
	}
	if borrows {
		ceiling := op.Params.Limit - int64(math.Ceil((e.global.budget.Headroom+debt)*limit-1e-9))
		op.Ceiling = max(0, ceiling)
		if op.Params.Algorithm == SlidingWindowCounter || p-min(p, n)+uint64(op.Cost) > uint64(max(0, op.Allowance)) {
			// It would borrow (a sliding window's estimate carries the
			// window before: it may borrow on it, whatever it counted
			// in this one).
			op.Ceiling = max(0, ceiling-e.inFlight(op, p, n, us, start))
		}
	}
}

// overrun is how much of its lease of a counter with a budget of its own
// (held) an elastic region gives up at now, in units of the counter's
// limit, for what regions admitted of it in the window beyond their leases.
// The leases were shared out on usage a gossip round and more old: a region
// that was borrowing until it took its lease may have admitted more than
// its lease already, and the others' leases do not leave it that. Of what
// the regions may admit in all (each its lease, or what it admitted if
// more, as this region's copy shows it), the part over the limit is given
// up by the regions still within their leases, each in proportion to its
// lease: every region reads the same leases and, a gossip round apart, the
// same counts, so together they give up about that part, no more. A
// region that has used its lease gives up nothing (it admits no more), and
// what such a region would have given up stays over.
func (e *Engine) overrun(op *Op, held *heldCounter, now time.Time) int64 {
	g := e.global
	if len(held.leases) != len(g.regions) || g.self < 0 {
		return 0
	}
	window := op.Params.Window
	start := now.UnixMicro() / window * window
	var buf [16]int64
	counts := buf[:0]
	g.usage.mu.Lock()
	counts = g.usage.c.AppendCounts(counts, op.Key, start/1000)
	g.usage.mu.Unlock()
	if len(counts) != len(held.leases) {
		return 0 // nothing counted in the window yet
	}
	limit := float64(op.Params.Limit)
	committed, within := 0.0, 0.0
	for i, f := range held.leases {
		lease, n := f*limit, float64(counts[i])
		committed += max(lease, n)
		if n < lease {
			within += lease
		}
	}
	mine := held.leases[g.self] * limit
	excess := committed - limit
	if excess <= 0 || float64(counts[g.self]) >= mine || within <= 0 {
		return 0
	}
	return int64(math.Ceil(min(mine, excess*mine/within) - 1e-9))
}

// inFlight is what the other regions may have admitted of an op's counter
// that this region's copy does not show yet: over the copy's lag, each as
// much as this region is asked for at its pace. The pace is what the
// region admitted in the window so far (p - n since start, µs), or, for a
// counter it tracks since it first denied it, what it counted of it since
// (its denials, and what it admitted while pressed or on a budget of its
// own), if more: a region denied for a while admitted less than it was
// asked for. The busier the counter, the less is borrowed: one that takes
// its whole limit within a gossip round borrows nothing.
func (e *Engine) inFlight(op *Op, p, n uint64, now, start int64) int64 {
	pace := 0.0 // per µs
	if p > n && now > start {
		pace = float64(p-n) / float64(now-start)
	}
	if d, ok := e.global.budgets.demand.load(op.Key); ok {
		if el := now - d.since; el > 0 && d.since != 0 {
			asked := float64(d.admitted.Load()+d.denied.Load()) / 1e6 * float64(op.Params.Limit)
			pace = max(pace, asked/float64(el))
		}
	}
	others := float64(len(e.global.regions) - 1)
	return int64(min(pace*others*float64(e.global.lag), math.MaxInt64/2))
}

// noteGlobal records a global limit's answer, given at now (µs, the
// engine's clock): the region's slot for the gossip, and the demand for the
// budget.
func (e *Engine) noteGlobal(it *item, allowed bool, now int64) {
	r := &it.result
	window := it.params.Window
	start := it.storeNow / window * window
	// A shared store's count of this region's slot, for the gossip (the
	// engine's own memory counts in the copy); a limit decided without
	// the store reports, for the budgets, the most the region may have
	// used (degraded.go), which is not a count.
	if e.shared && !it.degraded && (r.OwnP != 0 || r.OwnN != 0) {
		e.global.usage.with(func(c *crdt.Counters) { c.ObserveKey(it.key, start/1000, r.OwnP, r.OwnN) })
	}
	if e.shared && !it.degraded && (r.PrevP != 0 || r.PrevN != 0) {
		// A concurrency limit's window before, as the store has it: its
		// slots are in flight still (the region's siblings' too).
		e.global.usage.with(func(c *crdt.Counters) { c.ObserveKey(it.key, (start-window)/1000, r.PrevP, r.PrevN) })
	}
	d := e.ruleDemand(it.rule.ID)
	units := d.asked(it) * 1e6 / max(1, it.params.Limit)
	admitted, denied := r.Allowed && allowed, !r.Allowed
	held := e.heldFor(it, now) != nil
	if held {
		// A budget of its own: its demand is its own, not the rule's.
		e.trackCounter(it, units, admitted, denied, now)
	} else {
		switch {
		case admitted:
			d.admitted.Add(units)
			if it.rule.Mode == ModeStrict && pressed(it, start) {
				e.trackCounter(it, units, true, false, now) // a candidate, before it is denied
			}
		case denied:
			d.denied.Add(units)
			e.trackCounter(it, units, false, true, now) // a candidate
		}
	}
	if it.cached || it.storeNow == 0 {
		return // answered without the store: no slot, no window
	}
	ep := start / window
	if old := d.usedEpoch.Load(); old != ep && d.usedEpoch.CompareAndSwap(old, ep) {
		prev := int64(-1)
		if old == ep-1 {
			prev = d.used.Load()
		}
		d.prevUsed.Store(prev)
		d.used.Store(0)
	}
	if held {
		// What the rule's lease bounds is the most used of a counter on
		// it: a counter with a budget of its own is reported apart (it
		// went over to its own lease inside a window, having used no
		// more than the rule's lease; it goes back at a window's start).
		return
	}
	// In flight, for a concurrency limit: what it took in this window and
	// the one before, less what was released (global.go), as the store
	// answered.
	n := int64(r.OwnP) - int64(r.OwnN) + int64(r.PrevP) - int64(r.PrevN)
	own := int64(float64(n) * 1e6 / float64(max(1, it.params.Limit)))
	for {
		cur := d.used.Load()
		if own <= cur || d.used.CompareAndSwap(cur, own) {
			break
		}
	}
}

// minPressed is the least a region must have admitted of a counter in a
// window for it to be pressed: a few checks say little of a pace.
const minPressed = 10

// pressed says whether a counter on its rule's lease, admitted by the
// store in the window that began at start (µs), is on course to use up
// the region's allowance before the window ends: it has used half of it
// at least, at a pace that reaches all of it. Such a counter is reported
// on its own before it is denied, so that a budget of its own, from its
// own demand, comes while it still has room. (In elastic mode a counter
// borrows what the others leave, and is reported once it is denied; so is
// a sliding window's, whose estimate carries the window before.)
func pressed(it *item, start int64) bool {
	r := &it.result
	if it.cached || it.storeNow == 0 || it.params.Algorithm != FixedWindow || r.OwnP < r.OwnN+minPressed {
		return false
	}
	own := float64(r.OwnP - r.OwnN)
	a := float64(it.allowance)
	elapsed := float64(it.storeNow - start)
	return 2*own >= a && own*float64(it.params.Window) >= a*elapsed
}

// asked is the cost a check asks for, as demand: its own, or for a
// denied check that counts nothing, what a hit of the rule costs on
// average — a metered rule's gateway asks before each request and reports
// its cost after, and only a denied question says the region wants more.
func (d *ruleDemand) asked(it *item) int64 {
	if it.cost > 0 {
		c := it.cost << 10
		for { // a moving average over about 16 hits, in 1/1024ths
			old := d.hitCost.Load()
			avg := c
			if old > 0 {
				avg = old + (c-old)/16
			}
			if avg == old || d.hitCost.CompareAndSwap(old, avg) {
				break
			}
		}
		return it.cost
	}
	if it.result.Allowed {
		return 0
	}
	return d.hitCost.Load() >> 10
}

func (e *Engine) ruleDemand(id string) *ruleDemand {
	if d, ok := e.global.demand.Load(id); ok {
		return d.(*ruleDemand)
	}
	nd := &ruleDemand{since: e.now().UnixMicro()}
	nd.prevUsed.Store(-1)
	d, _ := e.global.demand.LoadOrStore(id, nd)
	return d.(*ruleDemand)
}

// Demand is what a region was asked for under a global rule since the
// engine started, in limits (1: once the limit of the counter asked).
type Demand struct {
	Admitted, Denied float64
	// Counted is how long the region has counted them.
	Counted time.Duration
	// Used is the most the region used of any counter of the rule on the
	// rule's lease (not of one with a budget of its own) in window
	// UsedEpoch (window start / window length), as a fraction of its
	// limit; PrevUsed, with HasPrev, in the window before.
	Used      float64
	UsedEpoch int64
	PrevUsed  float64
	HasPrev   bool
}

// RuleReport is what a replica reports of one global rule, for globalsync
// to share the limit out by: its demand, the lease it may acknowledge, and
// the rule as it enforces it.
type RuleReport struct {
	Rule string
	Demand
	// Acked is the Seq of the lease the replica may acknowledge (see
	// Lease), 0 for none; Acks, of a rule globalsync cuts in slices, the
	// Seq of each slice's lease, by slice (Acked is slice 0's).
	Acked     uint64
	Acks      []uint64
	Window    time.Duration
	Algorithm Algorithm
	// Limit is the rule's limit as this replica enforces it, 0 for a rule
	// limited by tier: a region that has not yet heard of a lower limit
	// still allows itself its floor of the higher one.
	Limit int64
	// Counters reports the rule's counters on their own: those with
	// budgets of their own, and those denied under the rule's lease.
	Counters []CounterReport
}

// GlobalReport reports every global rule in force.
func (e *Engine) GlobalReport() []RuleReport {
	var out []RuleReport
	now := e.now()
	for _, r := range e.GlobalRules() {
		rep := RuleReport{Rule: r.ID, Demand: e.Demand(r.ID), Window: time.Duration(r.Base.Window) * time.Microsecond,
			Algorithm: r.Base.Algorithm, Limit: r.Base.Limit}
		if _, acked, ok := e.Lease(r.ID); ok {
			rep.Acked = acked
		}
		rep.Acks = e.acks(r.ID, now)
		if !e.global.alone {
			rep.Counters = e.counterReports(r, now)
		}
		out = append(out, rep)
	}
	return out
}

// Demand returns the demand counted for a global rule.
func (e *Engine) Demand(rule string) Demand {
	d := e.ruleDemand(rule)
	out := Demand{Admitted: float64(d.admitted.Load()) / 1e6, Denied: float64(d.denied.Load()) / 1e6,
		Counted: counted(d.since, e.now()), Used: float64(d.used.Load()) / 1e6, UsedEpoch: d.usedEpoch.Load()}
	if p := d.prevUsed.Load(); p >= 0 {
		out.PrevUsed, out.HasPrev = float64(p)/1e6, true
	}
	return out
}

// counted is how long a count begun at since (µs) has run at now.
func counted(since int64, now time.Time) time.Duration {
	return max(0, time.Duration(now.UnixMicro()-since)*time.Microsecond)
}

// MaxAhead is how far after a receiver's clock a window of another
// region's delta may start: no region's clock runs that far ahead of
// another's (NTP keeps them within milliseconds). A later one is refused
// (counted as ahead): its keys would be kept until long after its end (a
// window of the year 2100 for 73 years).
const MaxAhead = 5 * time.Second

// MergeRemote takes in another region's delta: into the engine's copy of
// the counters and, for every slot of a known region, into a shared store,
// so that the region's checks see it (the engine's own memory decides
// against the copy itself). It returns what the copy made of the
// delta; a delta from an unknown origin changes nothing, the windows the
// store no longer keeps are left out (counted as stale), and so are those
// that start more than MaxAhead after the engine's clock (counted as
// ahead).
func (e *Engine) MergeRemote(ctx context.Context, d crdt.Delta) (crdt.MergeReport, error) {
	rs, now := e.rules.Load(), e.now()
	d, ahead, unknown, stale := mergeable(rs, d, now)
	var rep crdt.MergeReport
	e.global.usage.with(func(c *crdt.Counters) { rep = c.Merge(d) })
	rep.Stale, rep.Ahead, rep.UnknownRule = rep.Stale+stale, ahead, unknown
	if !e.global.known[d.Origin] {
		return rep, nil
	}
	gs, ok := e.store.(GlobalStore)
	if !ok || !e.shared {
		// The engine's own memory keeps global counters in the copy
		// alone, and decides against it.
		return rep, nil
	}
	windows, _ := globalWindowsOf(rs, d, e.global.known, now)
	_, err := gs.MergeGlobal(ctx, windows)
	return rep, err
}

// mergeable leaves out of d, in one pass, the windows that start more
// than MaxAhead after now (ahead), those of no global rule in force
// (unknown), and those over and done with (stale: the copy may have
// dropped them in Maintain, and they are not brought back, or they would
// be gossiped again), and says how many slots it left out for each
// reason. It copies d's entries only if it leaves one out.
func mergeable(rs *RuleSet, d crdt.Delta, now time.Time) (out crdt.Delta, ahead, unknown, stale int) {
	last := now.Add(MaxAhead).UnixMilli()
	var kept []crdt.Entry
	for i := range d.Entries {
		en := &d.Entries[i]
		var r *Rule
		if en.Epoch <= last {
			r = rs.globalRuleOf(en.Key)
		}
		switch {
		case en.Epoch > last:
			ahead += len(en.Slots)
		case r == nil:
			unknown += len(en.Slots)
		case ruleKeep(r, en.Epoch, now) <= 0:
			stale += len(en.Slots)
		default:
			if kept != nil {
				kept = append(kept, *en)
			}
			continue
		}
		if kept == nil {
			kept = append(make([]crdt.Entry, 0, len(d.Entries)-1), d.Entries[:i]...)
		}
	}
	if kept != nil {
		d.Entries = kept
	}
	return d, ahead, unknown, stale
}

// OfGlobalRules reports whether a counter key (CounterKey, or a rule's
// overflow counter's) is of a global rule in force: a region keeps no
// counter it cannot use, however many a message names. (A rule just published may reach the regions a
// moment apart; what one counted of it before another had it is not
// repaired, which strict leases do not need, and an elastic window may
// borrow that much too many once.)
func (rs *RuleSet) OfGlobalRules(key string) bool { return rs.globalRuleOf(key) != nil }

// globalRuleOf returns the global rule a counter key is of, or nil.
func (rs *RuleSet) globalRuleOf(key string) *Rule {
	id, _, _, _ := parseKey(key)
	if r := rs.Rule(id); r != nil && r.Scope == ScopeGlobal {
		return r
	}
	return nil
}

// globalWindowsOf turns a delta into the store's windows: the slots of
// the known regions, of the windows still kept. It also says how many of
// the delta's windows are over and done with. The windows' keys share one
// buffer, and their slots are the delta's where every region is known:
// the store reads them before the delta changes.
func globalWindowsOf(rs *RuleSet, d crdt.Delta, known map[string]bool, now time.Time) (windows []GlobalWindow, expired int) {
	windows = make([]GlobalWindow, 0, len(d.Entries))
	size := 0
	for _, en := range d.Entries {
		size += len(en.Key)
	}
	keys := make([]byte, 0, size)
	for _, en := range d.Entries {
		keep := globalKeep(rs, en.Key, en.Epoch, now)
		if keep <= 0 {
			expired++
			continue
		}
		slots := en.Slots
		for i, s := range en.Slots {
			if !known[s.Region] {
				slots = slices.Clone(en.Slots[:i])
				for _, s := range en.Slots[i+1:] {
					if known[s.Region] {
						slots = append(slots, s)
					}
				}
				break
			}
		}
		if len(slots) == 0 {
			continue
		}
		at := len(keys)
		keys = append(keys, en.Key...)
		windows = append(windows, GlobalWindow{Key: keys[at:len(keys):len(keys)], StartMillis: en.Epoch, TTL: keep, Slots: slots})
	}
	return windows, expired
}

// reseedStore gives the store back every window of the engine's copy of
// the global counters, every region's slots: a store that comes back
// after an outage may have lost them (a Redis restarted without
// persistence), and without the others' slots an elastic region would
// borrow slack that is not there until anti-entropy repairs them.
func (e *Engine) reseedStore(ctx context.Context) error {
	gs, ok := e.store.(GlobalStore)
	if !ok || !e.shared {
		return nil
	}
	var d crdt.Delta
	e.global.usage.with(func(c *crdt.Counters) { d = c.DeltaSince(0) })
	windows, _ := globalWindowsOf(e.rules.Load(), d, e.global.known, e.now())
	for len(windows) > 0 {
		n := min(len(windows), reseedBatch)
		if _, err := gs.MergeGlobal(ctx, windows[:n]); err != nil {
			return err
		}
		windows = windows[n:]
	}
	return nil
}

// reseedBatch bounds the windows of one call when a store is given its
// counters back, so that each call fits in its timeout.
const reseedBatch = 1000

// globalKeep is how long from now a window is kept: as long as the
// region's own checks would keep it, or two minutes from its start for a
// rule it does not know; 0 once that is over.
func globalKeep(rs *RuleSet, key string, startMillis int64, now time.Time) time.Duration {
	if r := rs.globalRuleOf(key); r != nil {
		return ruleKeep(r, startMillis, now)
	}
	start, t := float64(startMillis*1000), float64(now.UnixMicro())
	return max(0, time.Duration(start+2*60e6-t)*time.Microsecond)
}

// ruleKeep is globalKeep of a window of a global rule r.
func ruleKeep(r *Rule, startMillis int64, now time.Time) time.Duration {
	start, t := float64(startMillis*1000), float64(now.UnixMicro())
	return max(0, time.Duration(globalUntil(&r.Base, start)-t)*time.Microsecond)
}

// expireGlobalEvery is how often Maintain drops the windows the store no
// longer keeps from the engine's copy: a window is kept a minute at least
// after it ends, so a few seconds late changes nothing.
const expireGlobalEvery = 10 * time.Second

// expireGlobal drops from the engine's copy of the global counters the
// windows the store no longer keeps, at most once every expireGlobalEvery,
// and returns how many.
func (e *Engine) expireGlobal(now time.Time) int {
	if last := e.global.expired.Load(); last != 0 && now.UnixMicro()-last < expireGlobalEvery.Microseconds() {
		return 0
	}
	e.global.expired.Store(now.UnixMicro())
	rs := e.rules.Load()
	n := 0
	e.global.usage.with(func(c *crdt.Counters) {
		n = c.Expire(func(id crdt.ID) bool {
			return globalKeep(rs, id.Key, id.Epoch, now) <= 0
		})
	})
	return n
}

// GlobalRules returns the ids and windows of the global rules in force.
func (e *Engine) GlobalRules() []*Rule {
	var out []*Rule
	for _, r := range e.rules.Load().Rules() {
		if r.Scope == ScopeGlobal {
			out = append(out, r)
		}
	}
	return out
}

// GlobalLimitOf returns the global rule a counter key (CounterKey, or a
// rule's overflow counter's) belongs to and the limit the regions apply to
// it; ok is false for a key of no global rule, or one whose limit depends
// on a tier the key does not carry.
func (rs *RuleSet) GlobalLimitOf(key string) (r *Rule, limit int64, ok bool) {
	id, values, overflow, found := parseKey(key)
	if !found {
		return nil, 0, false
	}
	if r = rs.Rule(id); r == nil || r.Scope != ScopeGlobal {
		return nil, 0, false
	}
	if overflow {
		return r, r.overflow.Limit, r.overflow.Limit > 0
	}
	if n, ok := r.Overrides[values]; ok {
		return r, n, true
	}
	if len(r.Tiers) > 0 || r.Base.Limit == 0 {
		return r, 0, false
	}
	return r, r.Base.Limit, true
}
