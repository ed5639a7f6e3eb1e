package coord_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

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
	const (
		tenants = 100_000
		busy    = 440 // Zipf 1.1 at 1 M/s: those asking more than 10,000 a minute
		rounds  = 4   // gossip rounds a second
		window  = time.Minute
	)
	regions := []string{"af", "ap", "eu", "sa", "us"}
	rs, err := regional.Parse("rules.yaml", []byte(
		"rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 10000, window: 1m }\n"))
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, tenants)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c, err := coord.New(coord.Config{ID: "gs1", Regions: regions})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Restore(nil); err != nil {
		b.Fatal(err)
	}
	c.SetRules(start, rs)

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
				// Every tenant changes in every region once in five
				// seconds (20 rounds), a twentieth of them a round.
				n := tenants / (5 * rounds)
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
					r.admitted += 0.5 * 100 // 1 M/s over five regions, in limits of 10,000
					counters := make(map[string]gossip.CounterReport, busy)
					for k := range busy {
						counters[keys[k]] = gossip.CounterReport{Admitted: r.admitted / busy, Denied: r.admitted / busy / 4,
							Acked: r.acked, Used: 0.2, UsedEpoch: epoch / window.Milliseconds()}
					}
					c.Heartbeat(at, gossip.Heartbeat{Region: r.name, Replica: r.name, Regions: regions,
						Rules: map[string]gossip.RuleReport{"g": {Admitted: r.admitted, Acked: r.acked, Used: 0.2,
							UsedEpoch: epoch / window.Milliseconds(), WindowMillis: window.Milliseconds(),
							Algorithm: "fixed_window", Limit: 10000, Counters: counters}}})
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
	if n := len(c.Budget("g").Counters); n != busy {
		b.Fatalf("%d tenants with budgets of their own, want %d", n, busy)
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
