package coord_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// TestShardsServeTheirSlices: globalsync as two instances, each the
// leader of the counters whose keys hash to it, gives every counter the
// leases one instance would (a counter's budget is its own, and the
// rule's lease the same fraction of every counter's limit), each in its
// own document, which names its slice; each keeps only its slice's usage;
// each counts a region's acknowledgement of its own slice's lease.
func TestShardsServeTheirSlices(t *testing.T) {
	const (
		tenants = 200
		window  = time.Minute
	)
	regions := []string{"eu", "us"}
	start := tenantStart
	newCoord := func(shard, shards int) *coord.Coordinator {
		return newTenantLeader(t, coord.Config{ID: fmt.Sprintf("gs%d", shard), Regions: regions, Shard: shard, Shards: shards}, 1000)
	}
	whole, shards := newCoord(0, 0), []*coord.Coordinator{newCoord(0, 2), newCoord(1, 2)}
	all := append([]*coord.Coordinator{whole}, shards...)
	key := func(i int) string { return fmt.Sprintf("tenant-%03d", i) }
	rate := func(i int) float64 { return (0.5 + float64(i)/tenants) / window.Seconds() }
	var acked uint64
	var last []budget.Document // whole's, then each shard's
	for sec := range 20 {
		now := start.Add(time.Duration(sec) * time.Second)
		elapsed := now.Sub(start).Seconds()
		for _, r := range regions {
			part := 0.8
			if r == "us" {
				part = 0.2
			}
			counters := map[string]gossip.CounterReport{}
			for i := range tenants {
				counters[key(i)] = gossip.CounterReport{Admitted: part * rate(i) * elapsed, Acked: acked, UsedEpoch: now.UnixMilli() / window.Milliseconds()}
			}
			hb := gossip.Heartbeat{Region: r, Replica: r, Regions: regions,
				Rules: map[string]gossip.RuleReport{"g": {Admitted: part * 10 * elapsed / window.Seconds(), Acked: acked, Acks: []uint64{acked, acked},
					UsedEpoch: now.UnixMilli() / window.Milliseconds(), WindowMillis: window.Milliseconds(),
					Algorithm: "fixed_window", Limit: 1000, Counters: counters}}}
			for _, c := range all {
				c.Heartbeat(now, hb)
			}
		}
		last = last[:0]
		for _, c := range all {
			docs, _, err := c.Rebalance(now)
			if err != nil || len(docs) != 1 {
				t.Fatalf("rebalance at %v: %d documents, %v", now, len(docs), err)
			}
			last = append(last, docs[0])
		}
		acked = last[0].Seq
	}

	if n := len(last[0].Counters); n < tenants/2 {
		t.Fatalf("one instance gave %d counters budgets of their own, want most of the %d", n, tenants)
	}
	union := map[string]map[string]budget.CounterLeaseDoc{}
	for i, d := range last[1:] {
		if d.Shard != i || d.Shards != 2 {
			t.Errorf("instance %d's document names slice %d of %d", i, d.Shard, d.Shards)
		}
		if len(d.Counters) == 0 {
			t.Errorf("instance %d gave no counter a budget of its own", i)
		}
		for k, byRegion := range d.Counters {
			if s := budget.ShardOf(regional.CounterKey("g", k), 2); s != i {
				t.Errorf("instance %d's document holds %s, of slice %d", i, k, s)
			}
			union[k] = byRegion
		}
		if !reflect.DeepEqual(d.Leases, last[0].Leases) {
			t.Errorf("instance %d's lease of the rule %+v, one instance's %+v", i, d.Leases, last[0].Leases)
		}
	}
	if !reflect.DeepEqual(union, last[0].Counters) {
		t.Errorf("the instances' counters' leases differ from one instance's: %d and %d counters", len(union), len(last[0].Counters))
	}

	// Each instance keeps its slice's usage, and no other.
	epoch := start.UnixMilli() / window.Milliseconds() * window.Milliseconds()
	var d crdt.Delta
	d.Origin, d.To = "eu", 1
	for i := range 20 {
		d.Entries = append(d.Entries, crdt.Entry{ID: crdt.ID{Key: regional.CounterKey("g", key(i)), Epoch: epoch},
			Slots: []crdt.Slot{{Region: "eu", P: uint64(i + 1)}}})
	}
	slices.SortFunc(d.Entries, func(a, b crdt.Entry) int { return a.Compare(b.ID) })
	for i, c := range shards {
		if _, err := c.MergeRemote(context.Background(), d); err != nil {
			t.Fatal(err)
		}
		for j, e := range d.Entries {
			got := c.GlobalUsage(e.Key, time.UnixMilli(epoch))["eu"]
			want := int64(0)
			if budget.ShardOf(e.Key, 2) == i {
				want = int64(e.Slots[0].P)
			}
			if got != want {
				t.Errorf("instance %d holds %d of entry %d (%s), want %d", i, got, j, e.Key, want)
			}
		}
	}
}

// TestSliceCountsItsOwnAcknowledgements: each slice's leader counts a
// region's acknowledgement of its own slice's lease (RuleReport.Acks),
// not another slice's; one that does not say how many slices it holds
// acknowledges nothing to a sliced leader, and one that does, nothing to
// a leader of one slice.
func TestSliceCountsItsOwnAcknowledgements(t *testing.T) {
	const window = time.Minute
	regions := []string{"eu", "us"}
	start := tenantStart
	newCoord := func(shard, shards int) *coord.Coordinator {
		return newTenantLeader(t, coord.Config{ID: fmt.Sprintf("gs%d", shard), Regions: regions, Shard: shard, Shards: shards}, 1000)
	}
	whole, s0, s1 := newCoord(0, 0), newCoord(0, 2), newCoord(1, 2)
	all := []*coord.Coordinator{whole, s0, s1}
	heartbeat := func(now time.Time, acked uint64, acks []uint64) {
		for _, r := range regions {
			hb := gossip.Heartbeat{Region: r, Replica: r, Regions: regions,
				Rules: map[string]gossip.RuleReport{"g": {Admitted: 1, Acked: acked, Acks: acks, WindowMillis: window.Milliseconds(),
					UsedEpoch: now.UnixMilli() / window.Milliseconds(), Algorithm: "fixed_window", Limit: 1000}}}
			for _, c := range all {
				c.Heartbeat(now, hb)
			}
		}
	}
	var seqs []uint64
	for sec := range 3 {
		now := start.Add(time.Duration(sec) * time.Second)
		heartbeat(now, 0, nil)
		seqs = seqs[:0]
		for _, c := range all {
			docs, _, err := c.Rebalance(now)
			if err != nil || len(docs) != 1 {
				t.Fatalf("rebalance: %d documents, %v", len(docs), err)
			}
			seqs = append(seqs, docs[0].Seq)
		}
	}
	// The regions hold every lease given: they acknowledge slice 0's
	// and not slice 1's, and say so as a region that holds slices does;
	// the whole leader hears the same acknowledgement of its own Seq.
	now := start.Add(3 * time.Second)
	heartbeat(now, seqs[0], []uint64{seqs[1], 0})
	acked := map[*coord.Coordinator]uint64{}
	for _, c := range all {
		docs, _, err := c.Rebalance(now)
		if err != nil || len(docs) != 1 {
			t.Fatalf("rebalance: %d documents, %v", len(docs), err)
		}
		acked[c] = docs[0].Acked["eu"]
	}
	if acked[s0] != seqs[1] {
		t.Errorf("slice 0 counts eu's acknowledgement as %d, want its own lease's %d", acked[s0], seqs[1])
	}
	if acked[s1] != 0 {
		t.Errorf("slice 1 counts eu's acknowledgement as %d, want none (eu acknowledged only slice 0's)", acked[s1])
	}
	if acked[whole] != 0 {
		t.Errorf("the leader of one slice counts %d from a region that holds slices, want none", acked[whole])
	}
}
