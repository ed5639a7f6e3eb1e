package control

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/transport/namespace"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLeasesCatchUpAfterAHeal: region ap watches its leases in a bucket
// that lives in eu's NATS cluster, across a gateway. The gateway is cut
// for several seconds and a new lease is published meanwhile; within a
// few seconds of the heal ap holds it (its watch is made again when its
// gossip hears eu again).
func TestLeasesCatchUpAfterAHeal(t *testing.T) {
	const partitionFor = 8 * time.Second // longer than JetStream's 5s request timeout
	sc := harness.NewSupercluster(t, harness.SuperclusterOptions{Clusters: []string{"eu", "ap"}, JetStream: true, Links: true})
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	startGossipRegion(t, "eu", sc.Cluster("eu").ClientURLs(), nil)
	resync := new(Resync)
	cfg := gossipConfig("ap")
	cfg.OnRejoin = func(string) { resync.Fire() }
	b := startGossipRegionWith(t, "ap", sc.Cluster("ap").ClientURLs(), cfg, GossipOptions{Logger: discardLogger()})

	anc, err := nats.Connect(sc.Cluster("eu").ClientURLs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	ajs, _ := jetstream.New(anc)
	kv, err := ajs.CreateKeyValue(ctx, BudgetsBucketConfig(namespace.Names{}))
	if err != nil {
		t.Fatal(err)
	}
	publish := func(seq uint64) {
		t.Helper()
		now := time.Now()
		doc := budget.NewDocument("gs", []budget.Lease{{Rule: "tenant-global", Region: "ap", Seq: seq, Floor: 0.03, Share: 0.5,
			Issued: now, Expires: now.Add(time.Minute)}})
		js, _ := json.Marshal(doc)
		if _, err := kv.Put(ctx, BudgetKey("tenant-global"), js); err != nil {
			t.Fatal(err)
		}
	}
	bjs, _ := jetstream.New(b.nc)
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); WatchBudgets(wctx, bjs, subjects, b.engine, discardLogger(), resync) }()
	t.Cleanup(func() { stop(); <-done })

	seqOf := func() uint64 { l, _, ok := b.engine.Lease("tenant-global"); return map[bool]uint64{true: l.Seq}[ok] }
	publish(1)
	waitFor(t, 20*time.Second, "ap holds lease 1", func() bool { return seqOf() == 1 })

	cut := append(sc.Link("eu", "ap"), sc.Link("ap", "eu")...)
	for _, l := range cut {
		l.Cut()
	}
	time.Sleep(partitionFor) // the fault: the partition lasts this long
	publish(2)
	for _, l := range cut {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	healed := time.Now()
	waitFor(t, 30*time.Second, "ap holds lease 2", func() bool { return seqOf() == 2 })
	took := time.Since(healed)
	t.Logf("ap held the lease published during the partition %v after the heal", took)
	if took > 4*time.Second {
		t.Errorf("ap held the new lease %v after the heal, want within 4s (a gateway redial and a heartbeat)", took)
	}
}

// fakeClock is the nodes' time in a test that drives it.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestHealOneWayAtATime: a partition between two regions on real NATS
// gateway links heals one direction first, the nodes' time driven by the
// test (the gateways' is not). The region that hears the other again sends
// its digest at once, and it is lost on the way still cut; once the other
// way heals too, both regions hold what the other counted while cut off,
// with no anti-entropy round (an hour away). (The protocol's side of the
// story, message by message: transport/gossip/testdata/rejoin.txt.)
func TestHealOneWayAtATime(t *testing.T) {
	sc := harness.NewSupercluster(t, harness.SuperclusterOptions{Clusters: []string{"eu", "ap"}, Links: true})
	clock := &fakeClock{t: time.Now()}
	start := func(region string) *gossipRegion {
		c := gossipConfig(region)
		c.AntiEntropy = time.Hour // repairs come from digests sent on hearing a region again, or not at all
		return startGossipRegionWith(t, region, sc.Cluster(region).ClientURLs(), c,
			GossipOptions{Clock: clock.now, Manual: true, Logger: discardLogger()})
	}
	eu, ap := start("eu"), start("ap")
	// step moves the nodes' time on by a heartbeat, and ticks both.
	step := func() {
		clock.advance(100 * time.Millisecond)
		eu.gossip.Tick()
		ap.gossip.Tick()
	}
	heardWithin := func(r *gossipRegion, from string, d time.Duration) bool {
		at, ok := r.gossip.Node().LastHeard(from)
		return ok && clock.now().Sub(at) <= d
	}
	waitFor(t, 20*time.Second, "eu and ap hear each other", func() bool {
		step()
		return heardWithin(eu, "ap", time.Second) && heardWithin(ap, "eu", time.Second)
	})
	for _, l := range append(sc.Link("eu", "ap"), sc.Link("ap", "eu")...) {
		l.Cut()
	}
	clock.advance(2 * eu.gossip.Node().StaleAfter())
	// Within their floors (33 each: a tenth of 1000, split over the three
	// regions): counted by each alone.
	if got := eu.admit(t, "sk_cut", 10) + ap.admit(t, "sk_cut", 20); got != 30 {
		t.Fatalf("admitted %d of 30 while cut off", got)
	}
	step() // their deltas: lost on the cut links
	// ap's messages reach eu again; eu's do not reach ap yet.
	for _, l := range sc.Link("ap", "eu") {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "eu hears ap again", func() bool {
		step()
		return heardWithin(eu, "ap", 200*time.Millisecond)
	})
	if heardWithin(ap, "eu", eu.gossip.Node().StaleAfter()) {
		t.Fatal("ap heard eu through the link still cut")
	}
	for _, l := range sc.Link("eu", "ap") {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	want := []crdt.Slot{{Region: "ap", P: 20}, {Region: "eu", P: 10}}
	var euw, apw []crdt.Slot
	waitFor(t, 10*time.Second, "both hold what the other counted", func() bool {
		step()
		euw, apw = eu.window(t, "sk_cut"), ap.window(t, "sk_cut")
		return slices.Equal(euw, want) && slices.Equal(apw, want)
	})
	if eu.gossip.Node().Stats().Repaired.Load() == 0 || ap.gossip.Node().Stats().Repaired.Load() == 0 {
		t.Fatal("the regions agree without repairs")
	}
}
