package transport

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLeasesCatchUpAfterAHeal: region ap watches its leases in a bucket
// that lives in eu's NATS cluster, across a gateway. The gateway is cut for longer
// than a JetStream consumer outlives its client's silence; a new lease is
// published meanwhile. When the link heals and ap hears eu again, its
// watch starts again from the current values, and ap holds the new lease within
// a few seconds instead of when its old watch notices it is dead.
func TestLeasesCatchUpAfterAHeal(t *testing.T) {
	sc := harness.NewSupercluster(t, harness.SuperclusterOptions{Clusters: []string{"eu", "ap"}, JetStream: true, Links: true})
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	startGossipRegion(t, "eu", sc.Cluster("eu").ClientURLs(), nil)
	resync := new(Resync)
	cfg := gossipConfig("ap")
	cfg.Resync = resync
	b := startGossipRegionWith(t, "ap", sc.Cluster("ap").ClientURLs(), cfg)

	anc, err := nats.Connect(sc.Cluster("eu").ClientURLs())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(anc.Close)
	ajs, _ := jetstream.New(anc)
	kv, err := ajs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BudgetsBucket, History: BudgetHistory})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(seq uint64) {
		t.Helper()
		now := time.Now()
		doc := NewBudgetDoc("gs", []budget.Lease{{Rule: "tenant-global", Region: "ap", Seq: seq, Floor: 0.03, Share: 0.5,
			Issued: now, Expires: now.Add(time.Minute)}})
		js, _ := json.Marshal(doc)
		if _, err := kv.Put(ctx, BudgetKey("tenant-global"), js); err != nil {
			t.Fatal(err)
		}
	}
	bjs, _ := jetstream.New(b.nc)
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); WatchBudgets(wctx, bjs, b.engine, discardLogger(), resync) }()
	t.Cleanup(func() { stop(); <-done })

	seqOf := func() uint64 { l, _, ok := b.engine.Lease("tenant-global"); return map[bool]uint64{true: l.Seq}[ok] }
	publish(1)
	waitFor(t, 20*time.Second, "ap holds lease 1", func() bool { return seqOf() == 1 })

	cut := append(sc.Link("eu", "ap"), sc.Link("ap", "eu")...)
	for _, l := range cut {
		l.Cut()
	}
	time.Sleep(8 * time.Second) // the partition: longer than an idle consumer is kept
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

// TestHealOneWayAtATime: a partition heals one direction first. The
// region that hears the other again sends its digest at once, and it is
// lost on the way still cut; it sends it again, and once the other way
// heals too, both regions hold what the other counted while cut off,
// long before the next anti-entropy round.
func TestHealOneWayAtATime(t *testing.T) {
	sc := harness.NewSupercluster(t, harness.SuperclusterOptions{Clusters: []string{"eu", "ap"}, Links: true})
	cfg := func(region string) GossipConfig {
		c := gossipConfig(region)
		c.AntiEntropy = time.Hour // repairs come from digests sent on hearing a region again, or not at all
		return c
	}
	eu := startGossipRegionWith(t, "eu", sc.Cluster("eu").ClientURLs(), cfg("eu"))
	ap := startGossipRegionWith(t, "ap", sc.Cluster("ap").ClientURLs(), cfg("ap"))
	waitFor(t, 20*time.Second, "eu and ap hear each other", func() bool {
		_, a := eu.gossip.LastHeard("ap")
		_, b := ap.gossip.LastHeard("eu")
		return a && b
	})
	for _, l := range append(sc.Link("eu", "ap"), sc.Link("ap", "eu")...) {
		l.Cut()
	}
	waitFor(t, 10*time.Second, "eu and ap stale to each other", func() bool {
		a, _ := eu.gossip.LastHeard("ap")
		b, _ := ap.gossip.LastHeard("eu")
		return time.Since(a) > 2*eu.gossip.StaleAfter() && time.Since(b) > 2*ap.gossip.StaleAfter()
	})
	// Within their floors (a third each, since neither hears the third
	// region): counted by each alone.
	if got := eu.admit(t, "sk_cut", 10) + ap.admit(t, "sk_cut", 20); got != 30 {
		t.Fatalf("admitted %d of 30 while cut off", got)
	}
	// ap's messages reach eu again; eu's do not reach ap yet.
	for _, l := range sc.Link("ap", "eu") {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "eu hears ap again", func() bool {
		a, _ := eu.gossip.LastHeard("ap")
		return time.Since(a) < eu.gossip.StaleAfter()
	})
	for _, l := range sc.Link("eu", "ap") {
		if err := l.Heal(); err != nil {
			t.Fatal(err)
		}
	}
	want := []crdt.Slot{{Region: "ap", P: 20}, {Region: "eu", P: 10}}
	var euw, apw []crdt.Slot
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the stores
		euw, apw = eu.window(t, "sk_cut"), ap.window(t, "sk_cut")
		if slices.Equal(euw, want) && slices.Equal(apw, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the heal, eu holds %v and ap %v; want both %v", euw, apw, want)
		}
	}
}
