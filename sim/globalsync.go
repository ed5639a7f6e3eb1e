package sim

import (
	"slices"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/transport"
)

// coordinator is globalsync: it hears the regions' heartbeats, turns
// their demand into leases with the real allocator every rebalance, keeps
// a copy of all usage from the gossip, and closes the books of every
// window. Its published documents stand for the budgets bucket: a leader
// that starts restores its allocator from them, as globalsync does.
type coordinator struct {
	s        *sim
	cfg      budget.Config
	alive    bool
	alloc    *budget.Allocator
	rates    map[string]*budget.DemandRate
	last     map[string]heartbeat
	heardAt  map[string]time.Duration
	history  []transport.BudgetDoc // the bucket's revisions, oldest first
	usage    *crdt.Counters
	closed   map[crdt.ID]bool // by this leader
	lastBook time.Time
	// booksClosed: every window that ended by then is reconciled;
	// inherited is the same of the leaders before this one
	// (BudgetDoc.BooksClosed).
	booksClosed, inherited time.Time
	// closedThrough is the end of the last window whose books were
	// closed, true virtual time.
	closedThrough time.Duration
	found         []OverAdmission
}

// OverAdmission is one region's part of a window that admitted more than
// its limit, as globalsync found it when it closed the window's books.
type OverAdmission struct {
	Key         string
	Region      string
	WindowStart time.Duration // true virtual time
	Amount      int64
}

func newCoordinator(s *sim, cfg budget.Config) (*coordinator, error) {
	c := &coordinator{s: s, cfg: cfg}
	usage, err := crdt.NewCounters(gsName, append(slices.Clone(s.sc.Regions), gsName))
	if err != nil {
		return nil, err
	}
	c.usage = usage
	c.up()
	return c, nil
}

// now is globalsync's clock: the true time (its skew is the regions').
func (c *coordinator) now() time.Time { return c.s.clock(c.s.now, 0) }

func (c *coordinator) start() {
	s := c.s
	me := len(s.regions)
	s.every(me, s.sc.Budget.Rebalance, s.sc.Budget.Rebalance, c.rebalance)
	s.every(me, 0, s.sc.Gossip.AntiEntropy, c.publishDigest)
}

// down stops globalsync (every instance) until the given time: it hears
// nothing and publishes nothing, and forgets all it held.
func (c *coordinator) down(until time.Duration) {
	c.alive = false
	c.alloc, c.rates, c.last, c.heardAt = nil, nil, nil, nil
	c.s.rec.note(c.s.now, "globalsync down until %s", clockString(until))
}

// up starts a leader afresh: its allocator restored from the bucket.
func (c *coordinator) up() {
	alloc, err := budget.NewAllocator(c.cfg)
	if err != nil {
		panic(err) // checked in newSim
	}
	transport.RestoreAllocator(alloc, c.history, c.cfg.Skew)
	c.alive, c.alloc = true, alloc
	c.closed, c.lastBook, c.booksClosed, c.inherited = map[crdt.ID]bool{}, time.Time{}, time.Time{}, time.Time{}
	if n := len(c.history); n > 0 {
		c.inherited = c.history[n-1].BooksClosed
	}
	c.rates, c.last, c.heardAt = map[string]*budget.DemandRate{}, map[string]heartbeat{}, map[string]time.Duration{}
	if c.s.now > 0 {
		c.s.rec.note(c.s.now, "globalsync leads again")
	}
}

func (c *coordinator) heartbeat(hb heartbeat) {
	if !c.alive {
		return
	}
	r := c.rates[hb.region]
	if r == nil {
		r = &budget.DemandRate{}
		c.rates[hb.region] = r
	}
	r.Add(hb.total, c.s.sc.Rule.Window, c.now())
	c.last[hb.region], c.heardAt[hb.region] = hb, c.s.now
}

// silence is how long a region may be silent and still be reported: it
// may hold a lease it got after its last heartbeat.
func (c *coordinator) silence() time.Duration { return c.cfg.LeaseTTL + c.cfg.Skew + 2*time.Second }

func (c *coordinator) rebalance() {
	if !c.alive {
		return
	}
	c.closeBooks()
	now := c.now()
	for _, region := range c.s.sc.Regions {
		at, ok := c.heardAt[region]
		if !ok || c.s.now-at > c.silence() {
			continue
		}
		hb := c.last[region]
		rep := budget.Report{Region: region, Acked: hb.acked, Used: hb.used, UsedEpoch: hb.usedEpoch, HasUsed: hb.acked > 0}
		if c.s.now-at <= max(3*c.s.sc.Budget.Rebalance, 2*time.Second) { // globalsync's demandSilence
			rep.Demand = c.rates[region].Rate()
		}
		c.alloc.Report(ruleID, rep)
	}
	leases, err := c.alloc.Rebalance(now, c.s.rule, c.s.sc.Regions)
	if err != nil {
		panic(err) // the rule and regions are checked in newSim
	}
	doc := transport.NewBudgetDoc("sim", leases)
	doc.SetSnapshot(c.alloc.Snapshot(ruleID))
	doc.BooksClosed = c.booksClosed
	if c.inherited.After(doc.BooksClosed) {
		doc.BooksClosed = c.inherited
	}
	c.history = append(c.history, doc)
	if len(c.history) > transport.BudgetHistory {
		c.history = c.history[1:]
	}
	c.publish(leases, nil)
}

// publish sends leases to the regions (only those named, if any): the
// budgets bucket does not lose them, but a region cut off sees none until
// the links heal.
func (c *coordinator) publish(leases []budget.Lease, only map[string]bool) {
	for _, r := range c.s.regions {
		if only == nil || only[r.name] {
			c.s.net.send(gsName, r.name, false, func(to endpoint) { to.leases(leases) })
		}
	}
}

// healed hands the latest leases to every region at once, as a KV watch
// catches up when its connection comes back.
func (c *coordinator) healed() {
	if !c.alive || len(c.history) == 0 {
		return
	}
	c.publish(c.history[len(c.history)-1].All(), nil)
}

func (c *coordinator) leases([]budget.Lease) {}

func (c *coordinator) delta(from string, d crdt.Delta, repair bool) {
	if c.alive {
		c.usage.Merge(d)
	}
}

func (c *coordinator) digest(string, crdt.Digest) {}

func (c *coordinator) publishDigest() {
	if !c.alive {
		return
	}
	dg, err := c.usage.Digest(crdt.DefaultDigestBuckets)
	if err != nil {
		return
	}
	c.s.net.broadcast(gsName, true, func(to endpoint) { to.digest(gsName, dg) })
}

// closeBooks reconciles every window that ended long enough ago for the
// last deltas and an anti-entropy round to have come in: a counter whose
// regions admitted more than its limit is over-admission, put on the
// regions beyond their grants (budget.Attribute) and, with carry_debt,
// charged to their next windows.
func (c *coordinator) closeBooks() {
	s := c.s
	now := c.now()
	if now.Sub(c.lastBook) < s.sc.Gossip.AntiEntropy/2 {
		return
	}
	c.lastBook = now
	settle := s.sc.Gossip.AntiEntropy + 2*s.sc.Budget.Rebalance
	limit := s.sc.Rule.Limit
	window := s.sc.Rule.Window
	c.booksClosed = now.Add(-settle)
	for _, e := range c.usage.DeltaSince(0).Entries {
		end := time.UnixMilli(e.Epoch).Add(window)
		if c.closed[e.ID] || now.Before(end.Add(settle)) {
			continue
		}
		c.closed[e.ID] = true
		c.closedThrough = max(c.closedThrough, end.Sub(epoch0))
		if !end.After(c.inherited) {
			continue // an earlier leader closed these books
		}
		pn := c.usage.Get(e.ID)
		total := pn.Value()
		if total <= limit {
			continue
		}
		used := pn.ByRegion()
		granted := c.alloc.Granted(ruleID, e.Epoch*1000/window.Microseconds())
		parts := budget.Attribute(total-limit, limit, used, granted)
		for _, r := range sortedNames(parts) {
			c.found = append(c.found, OverAdmission{Key: e.ID.Key, Region: r, WindowStart: time.UnixMilli(e.Epoch).Sub(epoch0), Amount: parts[r]})
			if s.sc.Rule.CarryDebt {
				c.alloc.Charge(ruleID, r, float64(parts[r])/float64(limit))
			}
		}
	}
}
