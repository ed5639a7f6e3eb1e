package sim

import (
	"encoding/json"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/transport/gossip"
)

// globalsync is the global sync service: the real coordinator
// (budget/coord) and its gossip node, as cmd/globalsync runs them. What is
// the simulator's own is the budgets bucket — the documents published,
// which a leader that starts restores itself from, and which reach the
// regions without loss (a KV watch) but not across a cut link — and the
// service's outages.
type globalsync struct {
	s     *sim
	cfg   budget.Config
	c     *coord.Coordinator // nil while down
	ticks ticker
	// history is the bucket's revisions, oldest first, encoded as the
	// bucket keeps them; latest is the last one published. A leader reads
	// them only when it starts again after globalsync was down: in a run
	// where it never goes down, none are kept (keep false).
	history [][]byte
	keep    bool
	latest  *budget.Document
	found   []OverAdmission
	// closedThrough is the end of the last window whose books were
	// closed, true virtual time.
	closedThrough time.Duration
}

// OverAdmission is one region's part of a window that admitted more than
// its limit, as globalsync found it when it closed the window's books.
type OverAdmission struct {
	Key         string
	Region      string
	WindowStart time.Duration // true virtual time
	Amount      int64
}

// maxPayload is the largest message the simulated NATS servers take, as
// their max_payload's default: 1 MB.
const maxPayload = 1 << 20

func newGlobalSync(s *sim, cfg budget.Config) *globalsync {
	g := &globalsync{s: s, cfg: cfg}
	for _, f := range s.sc.Faults {
		g.keep = g.keep || f.Kind == "globalsync-down"
	}
	g.up()
	return g
}

// now is globalsync's clock: the true time (its skew is the regions').
func (g *globalsync) now() time.Time {
	return g.s.clock(g.s.places[g.s.placeOf[g.index()]].now, 0)
}

func (g *globalsync) index() int { return len(g.s.regions) }

func (g *globalsync) start() {
	g.s.every(g.index(), g.s.sc.Budget.Rebalance, g.s.sc.Budget.Rebalance, g.rebalance)
	g.ticks.schedule()
}

// down stops globalsync (every instance) until the given time: it hears
// nothing, publishes nothing, and loses all it held but the bucket.
func (g *globalsync) down(until time.Duration) {
	g.c = nil
	g.s.rec.note(g.s.now, "globalsync down until %s", clockString(until))
}

// up starts an instance that leads at once: its coordinator restored from
// the bucket, its gossip node asking the regions for what they counted.
func (g *globalsync) up() {
	s := g.s
	c, err := coord.New(coord.Config{ID: "sim", Regions: s.sc.Regions, Rebalance: s.sc.Budget.Rebalance,
		AntiEntropy: s.sc.Gossip.AntiEntropy, Budget: g.cfg})
	if err != nil {
		panic(err) // checked in newSim
	}
	c.SetRules(g.now(), s.rules)
	// A leader that starts reads the bucket's revisions, as
	// cmd/globalsync does.
	history := make([]budget.Document, 0, len(g.history))
	for _, b := range g.history {
		d, err := budget.DecodeDocument(b)
		if err != nil {
			panic(err) // the coordinator's own documents
		}
		history = append(history, d)
	}
	if err := c.Restore([][]budget.Document{history}); err != nil {
		panic(err)
	}
	node, err := gossip.New(gossip.Config{Region: coord.Name, Replica: coord.Name, Instance: clockString(s.now),
		AntiEntropy: s.sc.Gossip.AntiEntropy, Observer: true, Counters: c, Heartbeats: c}, epoch0.Add(s.now))
	if err != nil {
		panic(err)
	}
	g.c = c
	g.ticks = ticker{s: s, target: g.index(), node: node, send: g.send, at: -1, subs: node.Subscriptions()}
	if s.now > 0 {
		g.ticks.schedule()
		s.rec.note(s.now, "globalsync leads again")
	}
}

func (g *globalsync) send(m gossip.Message) {
	if g.c != nil {
		g.s.net.post(coord.Name, m)
	}
}

func (g *globalsync) step(m gossip.Message) {
	if g.c != nil {
		g.ticks.step(m)
	}
}

func (g *globalsync) listens(subject string) bool { return g.ticks.listens(subject) }

func (g *globalsync) budget(budget.Document) {}

// rebalance has the coordinator rebalance: the documents go to the bucket
// and to the regions.
func (g *globalsync) rebalance() {
	if g.c == nil {
		return
	}
	now := g.now()
	g.c.Tick(now)
	docs, found, err := g.c.Rebalance(now)
	if err != nil {
		panic(err) // the rule and regions are checked in newSim
	}
	for _, oa := range found {
		g.found = append(g.found, OverAdmission{Key: oa.Key, Region: oa.Region, WindowStart: oa.WindowStart.Sub(epoch0), Amount: oa.Amount})
	}
	if t := g.c.ClosedThrough(); !t.IsZero() {
		g.closedThrough = max(g.closedThrough, t.Sub(epoch0))
	}
	for _, doc := range docs {
		b, err := json.Marshal(doc)
		if err != nil {
			panic(err) // a document is plain data
		}
		// As cmd/globalsync: the leader is told the document's size,
		// and one too large for a message is not sent (the regions
		// keep their leases until they lapse).
		g.c.Sized(doc.Rule, len(b), maxPayload, now)
		if len(b) > maxPayload {
			g.s.rec.note(g.s.now, "a budget document of %d bytes not sent", len(b))
			continue
		}
		if g.keep {
			g.history = append(g.history, b)
			if len(g.history) > coord.History {
				g.history = g.history[1:]
			}
		}
		g.latest = &doc
		g.publish(doc)
	}
}

// publish sends a document to the regions: the budgets bucket does not
// lose it, but a region cut off sees none until the links heal.
func (g *globalsync) publish(doc budget.Document) {
	for _, r := range g.s.regions {
		g.s.net.send(coord.Name, r.name, false, func(to endpoint) { to.budget(doc) })
	}
}

// healed hands the latest document to every region at once, as a KV watch
// catches up when its connection comes back.
func (g *globalsync) healed() {
	if g.c == nil || g.latest == nil {
		return
	}
	g.publish(*g.latest)
}

// holds reports whether globalsync's copy holds at least p of a region's
// slot of a counter; a globalsync down holds nothing and is not asked.
func (g *globalsync) holds(t target) bool {
	return g.c == nil || g.c.GlobalCounter(t.id).P.Get(t.region) >= t.p
}
