package transport

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLeasesCatchUpAfterAHeal: region ap watches its leases in a bucket
// that lives in eu's NATS cluster, across a gateway. The gateway is cut
// for several seconds and a new lease is published meanwhile; within a
// few seconds of the heal ap holds it (its watch is made again when it
// hears eu again).
func TestLeasesCatchUpAfterAHeal(t *testing.T) {
	const partitionFor = 8 * time.Second // longer than JetStream's 5s request timeout
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
	time.Sleep(partitionFor) // the partition
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

// TestGlobalSyncDigestsAreNoRejoin: globalsync sends its digest once an
// anti-entropy round, silent in between; its digests do not count as a
// region heard again after a silence, which would remake every KV watch
// each round.
func TestGlobalSyncDigestsAreNoRejoin(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{})
	resync := new(Resync)
	cfg := gossipConfig("eu")
	cfg.Resync = resync
	eu := startGossipRegionWith(t, "eu", ns.ClientURL(), cfg)
	fired := resync.C()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	digest := func(seq int) {
		t.Helper()
		var dg crdt.Digest
		var derr error
		eu.engine.GlobalUsage().With(func(c *crdt.Counters) { dg, derr = c.Digest(crdt.DefaultDigestBuckets) })
		if derr != nil {
			t.Fatal(derr)
		}
		dg.Origin = "globalsync"
		b, err := crdt.AppendDigest(nil, dg)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg("geoquota.digest.globalsync")
		m.Data = b
		m.Header.Set(HeaderReplica, "globalsync-gs")
		m.Header.Set(HeaderSeq, strconv.Itoa(seq))
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
	}
	before := eu.gossip.Stats().Received.Load()
	digest(1)
	waitFor(t, 5*time.Second, "the first digest heard", func() bool { _, ok := eu.gossip.LastHeard("globalsync"); return ok })
	time.Sleep(2 * eu.gossip.StaleAfter()) // globalsync's silence between two rounds
	digest(2)
	waitFor(t, 5*time.Second, "the second digest heard", func() bool { return eu.gossip.Stats().Received.Load() >= before+2 })
	select {
	case <-fired:
		t.Fatal("a digest from globalsync after its usual silence remade the KV watches")
	default:
	}
}
