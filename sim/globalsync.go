package sim

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/transport/gossip"
)

// globalsync is the global sync service: the real coordinator
// (budget/coord) and its gossip node, as cmd/globalsync runs them — one
// per shard when the scenario runs globalsync as several instances, each
// leading its slice of the rule's counters (GlobalSyncSpec.Shards). What
// is the simulator's own is the budgets bucket — the documents published,
// which a leader that starts restores itself from, and which reach the
// regions without loss (a KV watch) but not across a cut link — and the
// service's outages (every instance at once).
type globalsync struct {
	s       *sim
	cfg     budget.Config
	shards  []*gsShard
	running bool // an instance is up (all are, or none)
	// keep says the bucket's revisions are kept: a leader reads them only
	// when it starts again after globalsync was down, and in a run where
	// it never goes down, none are.
	keep  bool
	found []OverAdmission
	// closedThrough is the end of the last window whose books were
	// closed, true virtual time.
	closedThrough time.Duration
}

// gsShard is one globalsync instance: the leader of one slice of the
// rule's counters (all of them, unsharded).
type gsShard struct {
	index int
	c     *coord.Coordinator // nil while down
	ticks ticker
	// history is the bucket's revisions of the instance's key, oldest
	// first, encoded as the bucket keeps them; latest is the last one
	// published.
	history [][]byte
	latest  *budget.Document
	// work is the wall time the instance spent in its rebalances and in
	// taking in the gossip and heartbeats; rebalances how many it ran;
	// largest the largest document it published (bytes).
	work       time.Duration
	rebalances int
	largest    int
	// budgets and copied are the most counters with budgets of their own
	// its documents held, and counter windows its copy held.
	budgets, copied int
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
	for i := range max(1, s.sc.GlobalSync.Shards) {
		g.shards = append(g.shards, &gsShard{index: i})
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
	for _, sh := range g.shards {
		sh.ticks.schedule()
	}
}

// down stops globalsync (every instance) until the given time: it hears
// nothing, publishes nothing, and loses all it held but the bucket.
func (g *globalsync) down(until time.Duration) {
	for _, sh := range g.shards {
		sh.c = nil
	}
	g.running = false
	g.s.rec.note(g.s.now, "globalsync down until %s", clockString(until))
}

// up starts every instance, each leading its slice at once: its
// coordinator restored from its key's revisions in the bucket, its gossip
// node asking the regions for what they counted.
func (g *globalsync) up() {
	s := g.s
	n := len(g.shards)
	for _, sh := range g.shards {
		cfg := coord.Config{ID: "sim", Regions: s.sc.Regions, Rebalance: s.sc.Budget.Rebalance,
			AntiEntropy: s.sc.Gossip.AntiEntropy, Budget: g.cfg}
		replica := coord.Name
		if n > 1 {
			cfg.ID, cfg.Shard, cfg.Shards = fmt.Sprintf("sim-%d", sh.index), sh.index, n
			if sh.index > 0 {
				replica = fmt.Sprintf("%s-%d", coord.Name, sh.index)
			}
		}
		c, err := coord.New(cfg)
		if err != nil {
			panic(err) // checked in newSim
		}
		c.SetRules(g.now(), s.rules)
		// A leader that starts reads the bucket's revisions, as
		// cmd/globalsync does.
		history := make([]budget.Document, 0, len(sh.history))
		for _, b := range sh.history {
			d, err := budget.DecodeDocument(b)
			if err != nil {
				panic(err) // the coordinator's own documents
			}
			history = append(history, d)
		}
		if err := c.Restore([][]budget.Document{history}); err != nil {
			panic(err)
		}
		node, err := gossip.New(gossip.Config{Region: coord.Name, Replica: replica, Instance: clockString(s.now),
			AntiEntropy: s.sc.Gossip.AntiEntropy, Observer: true, Counters: c, Heartbeats: c}, epoch0.Add(s.now))
		if err != nil {
			panic(err)
		}
		sh.c = c
		sh.ticks = ticker{s: s, target: g.index(), node: node, send: g.send, at: -1, subs: node.Subscriptions()}
		if s.now > 0 {
			sh.ticks.schedule()
		}
	}
	g.running = true
	if s.now > 0 {
		s.rec.note(s.now, "globalsync leads again")
	}
}

func (g *globalsync) send(m gossip.Message) {
	if g.running {
		g.s.net.post(coord.Name, m)
	}
}

// step hands a message to every instance: each keeps what is of its
// slice.
func (g *globalsync) step(m gossip.Message) {
	if !g.running {
		return
	}
	for _, sh := range g.shards {
		t := time.Now()
		sh.ticks.step(m)
		sh.work += time.Since(t)
	}
}

func (g *globalsync) listens(subject string) bool { return g.shards[0].ticks.listens(subject) }

func (g *globalsync) budget(budget.Document) {}

// rebalance has every instance rebalance: the documents go to the bucket
// and to the regions.
func (g *globalsync) rebalance() {
	if !g.running {
		return
	}
	for _, sh := range g.shards {
		g.rebalanceShard(sh)
	}
}

func (g *globalsync) rebalanceShard(sh *gsShard) {
	now := g.now()
	t := time.Now()
	sh.c.Tick(now)
	docs, found, err := sh.c.Rebalance(now)
	sh.work += time.Since(t)
	sh.rebalances++
	sh.copied = max(sh.copied, sh.c.Copied())
	if err != nil {
		panic(err) // the rule and regions are checked in newSim
	}
	for _, oa := range found {
		g.found = append(g.found, OverAdmission{Key: oa.Key, Region: oa.Region, WindowStart: oa.WindowStart.Sub(epoch0), Amount: oa.Amount})
	}
	if t := sh.c.ClosedThrough(); !t.IsZero() {
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
		sh.c.Sized(doc.Rule, len(b), maxPayload, now)
		if len(b) > maxPayload {
			g.s.rec.note(g.s.now, "a budget document of %d bytes not sent", len(b))
			continue
		}
		sh.largest = max(sh.largest, len(b))
		sh.budgets = max(sh.budgets, len(doc.Counters))
		if g.keep {
			sh.history = append(sh.history, b)
			if len(sh.history) > coord.History {
				sh.history = sh.history[1:]
			}
		}
		sh.latest = &doc
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

// healed hands each instance's latest document to every region at once,
// as a KV watch catches up when its connection comes back.
func (g *globalsync) healed() {
	if !g.running {
		return
	}
	for _, sh := range g.shards {
		if sh.latest != nil {
			g.publish(*sh.latest)
		}
	}
}

// holds reports whether globalsync's copy holds at least p of a region's
// slot of a counter; a globalsync down holds nothing and is not asked.
func (g *globalsync) holds(t target) bool {
	if !g.running {
		return true
	}
	sh := g.shards[budget.ShardOf(t.id.Key, len(g.shards))]
	return sh.c.GlobalCounter(t.id).P.Get(t.region) >= t.p
}
