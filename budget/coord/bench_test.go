package coord_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// BenchmarkLeaderTenants is one second of the leading globalsync's work
// with 100,000 active tenants under one strict global rule (10,000 a
// minute each) in five regions: each region's gossip (four rounds a
// second, every tenant changed in every region once in five seconds)
// merged into its copy, two heartbeats per region naming the 440 busiest
// tenants (those over their limit, with budgets of their own), the
// housekeeping, one rebalance, and the books of every window closed as it
// settles. An op is one second; heap-MB is what the coordinator holds in
// steady state (its copy of two to three windows of every counter, the
// books, the reports).
//
//	go test ./budget/coord -run '^$' -bench LeaderTenants -benchtime 120x
func BenchmarkLeaderTenants(b *testing.B) {
	benchLeader(b, leaderLoad{tenants: 100_000, regions: []string{"af", "ap", "eu", "sa", "us"},
		changed: 100_000 / 20, busy: 440, busyScale: 1, limit: 10000})
}

// BenchmarkLeaderMillion is the same at 1,000,000 tenants over ten regions
// limited to 1,000 a minute each (the simulator's tenants-million): each
// region's gossip changes 8,000 tenants a round (as many distinct tenants
// as 25,000 calls a round, a region's part of a million a second, draw
// by Zipf's law of exponent 1.1 over a million), taken in turn, so that
// the copy holds every tenant of every region; and 12,000 tenants with
// budgets of their own (DefaultMaxCounters), each named by every region.
//
//	go test ./budget/coord -run '^$' -bench LeaderMillion -benchtime 20x
func BenchmarkLeaderMillion(b *testing.B) {
	benchLeader(b, leaderLoad{tenants: 1_000_000, regions: []string{"af", "ap", "au", "ca", "eu", "in", "jp", "me", "sa", "us"},
		changed: 8000, busy: budget.DefaultMaxCounters, busyScale: 4, limit: 1000})
}

// BenchmarkLeaderMillionSliced is BenchmarkLeaderMillion's load on the
// leader of one slice of four (Config.Shards): it takes in every region's
// gossip and heartbeats, and keeps, counts and closes the books of the
// quarter of the counters whose keys hash to it.
//
//	go test ./budget/coord -run '^$' -bench LeaderMillionSliced -benchtime 20x
func BenchmarkLeaderMillionSliced(b *testing.B) {
	benchLeader(b, leaderLoad{tenants: 1_000_000, regions: []string{"af", "ap", "au", "ca", "eu", "in", "jp", "me", "sa", "us"},
		changed: 8000, busy: budget.DefaultMaxCounters, busyScale: 4, limit: 1000, shards: 4})
}

// leaderLoad is what a benchmark's regions send the leader.
type leaderLoad struct {
	tenants int
	regions []string
	changed int // tenants a region's gossip round changes
	busy    int // tenants with budgets of their own
	// busyScale: a busy tenant's calls in a region, in limits, are its
	// part of the region's, times this.
	busyScale float64
	limit     int64
	// shards, if more than 1, makes the leader that of slice 0 of as
	// many.
	shards int
}

func benchLeader(b *testing.B, load leaderLoad) {
	const (
		rounds = 4 // gossip rounds a second
		window = time.Minute
	)
	tenants, busy, regions := load.tenants, load.busy, load.regions
	keys := make([]string, tenants)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	start := tenantStart
	c := newTenantLeader(b, coord.Config{ID: "gs1", Regions: regions, Shards: load.shards}, load.limit)

	slices.Sort(keys) // a delta's entries go in key order
	type region struct {
		name     string
		to       uint64 // the version of its last delta
		held     uint64 // the Seq of the last document it got
		acked    uint64 // what its next heartbeat acknowledges
		admitted float64
	}
	rr := make([]*region, len(regions))
	for i, name := range regions {
		rr[i] = &region{name: name}
	}
	now := start
	sec := 0
	second := func() {
		epoch := now.Truncate(window).UnixMilli()
		for round := range rounds {
			for i, r := range rr {
				// load.changed tenants a round, in turn.
				n := load.changed
				first := ((sec*rounds + round + 4*i) * n) % tenants
				d := crdt.Delta{Origin: r.name, From: r.to, To: r.to + uint64(n), Entries: make([]crdt.Entry, n)}
				for j := range n {
					d.Entries[j] = crdt.Entry{ID: crdt.ID{Key: regional.CounterKey("g", keys[first+j]), Epoch: epoch},
						Slots: []crdt.Slot{{Region: r.name, P: uint64(sec + 1)}}}
				}
				if _, err := c.MergeRemote(context.Background(), d); err != nil {
					b.Fatal(err)
				}
				r.to = d.To
			}
			at := now.Add(time.Duration(round) * time.Second / rounds)
			if round%2 == 0 {
				for _, r := range rr {
					r.admitted += 0.5 * 100 // a region's calls, in limits: 100 a second
					counters := make(map[string]gossip.CounterReport, busy)
					for k := range busy {
						a := r.admitted / float64(busy) * load.busyScale
						counters[keys[k]] = gossip.CounterReport{Admitted: a, Denied: a / 4,
							Acked: r.acked, Used: 0.2, UsedEpoch: epoch / window.Milliseconds()}
					}
					c.Heartbeat(at, gossip.Heartbeat{Region: r.name, Replica: r.name, Regions: regions,
						Rules: map[string]gossip.RuleReport{"g": {Admitted: r.admitted, Acked: r.acked, Acks: acks(r.acked, load.shards), Used: 0.2,
							UsedEpoch: epoch / window.Milliseconds(), WindowMillis: window.Milliseconds(),
							Algorithm: "fixed_window", Limit: load.limit, Counters: counters}}})
					r.acked = r.held
				}
			}
		}
		c.Tick(now)
		docs, _, err := c.Rebalance(now)
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range docs {
			for _, r := range rr {
				r.held = d.Seq
			}
		}
		now = now.Add(time.Second)
		sec++
	}
	// Three windows in, so that books close and old windows go.
	for range 3 * 60 {
		second()
	}
	want := busy / max(1, load.shards) // about, when sliced
	if n := len(c.Budget("g").Counters); load.shards <= 1 && n != want || n < want*9/10 || n > want*11/10 {
		b.Fatalf("%d tenants with budgets of their own, want %d (of %d, over %d slices)", n, want, busy, max(1, load.shards))
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	heap := ms.HeapAlloc
	b.ResetTimer()
	b.ReportAllocs()
	for b.Loop() {
		second()
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(max(heap, ms.HeapAlloc))/1e6, "heap-MB")
	runtime.KeepAlive(c)
}

// acks is a replica's acknowledgement of every slice's lease, all Seq
// (nil when not sliced).
func acks(seq uint64, shards int) []uint64 {
	if shards <= 1 {
		return nil
	}
	out := make([]uint64, shards)
	for i := range out {
		out[i] = seq
	}
	return out
}
