package main

import (
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/control"
)

// TestShardsOverNATS: globalsync as two slices, with a standby for slice
// 1: each slice has its own leader (its own claim), each publishes its
// documents under its own keys, and the region holds and acknowledges
// both slices' leases; when slice 1's leader goes away the standby leads
// it from its key's history, and slice 0 leads on; an instance of another
// number of slices does not lead beside them.
func TestShardsOverNATS(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"eu", "us"}
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	cfg := Config{Regions: regions, Rebalance: 200 * time.Millisecond, LeaderTTL: time.Second, Shards: 2}
	a := w.service("a", ns.ClientURL(), cfg)
	cfg.Shard = 1
	b := w.service("b", ns.ClientURL(), cfg)
	w.waitFor(100*time.Millisecond, "both slices led", func() bool { return a.Leader() && b.Leader() })
	c := w.service("c", ns.ClientURL(), cfg)
	report := func() regional.RuleReport {
		for _, r := range eu.engine.GlobalReport() {
			if r.Rule == "g" {
				return r
			}
		}
		return regional.RuleReport{}
	}
	w.waitFor(100*time.Millisecond, "eu acknowledges both slices' leases", func() bool {
		acks := report().Acks
		return len(acks) == 2 && acks[0] > 0 && acks[1] > 0
	})
	if c.Leader() {
		t.Fatal("the standby leads slice 1 beside its leader")
	}
	w.waitFor(100*time.Millisecond, "the standby shows slice 1's leases, as its leader pushes them", func() bool {
		docs := c.Budgets()
		return len(docs) == 1 && docs[0].Shard == 1 && docs[0].Leader == "b"
	})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), w.names.BudgetsBucket())
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{control.ShardBudgetKey("g", 0), control.ShardBudgetKey("g", 1)}; !slices.Equal(keys, want) {
		t.Fatalf("budget keys %v, want %v", keys, want)
	}
	for i, s := range []*Service{a, b} {
		for _, d := range s.Budgets() {
			if d.Shard != i || d.Shards != 2 {
				t.Errorf("slice %d's leader published a document of slice %d of %d", i, d.Shard, d.Shards)
			}
		}
	}

	before := report().Acks[1]
	b.Close()
	w.waitFor(100*time.Millisecond, "the standby leads slice 1", c.Leader)
	w.waitFor(100*time.Millisecond, "eu acknowledges the new leader's lease of slice 1", func() bool {
		acks := report().Acks
		return len(acks) == 2 && acks[1] > before
	})
	for _, d := range c.Budgets() {
		if d.Shard != 1 || d.Leader != "c" {
			t.Errorf("after the takeover: a document of slice %d by %q", d.Shard, d.Leader)
		}
	}
	if !a.Leader() {
		t.Error("slice 0's leader lost the lead when slice 1's went away")
	}

	// An instance started with another number of slices does not lead
	// beside slice 0's leader, which cuts the counters otherwise.
	other := cfg
	other.Shards, other.Shard = 3, 2
	d := w.service("d", ns.ClientURL(), other)
	for range 20 {
		w.step(100 * time.Millisecond)
		if d.Leader() {
			t.Fatal("slice 2 of 3 leads beside slice 0 of 2")
		}
	}
}
