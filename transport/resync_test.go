package transport

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
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
