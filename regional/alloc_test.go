//go:build !race

// The race detector makes sync.Pool drop what it holds at random, so
// allocations are counted without it: make test runs this file on its own.

package regional

import (
	"context"
	"testing"
)

// TestCheckMemoryAllocatesNothing holds the in-memory path to no
// allocation per decision, on every feature a check can pass through once
// its counters and caches exist.
func TestCheckMemoryAllocatesNothing(t *testing.T) {
	for _, tc := range []struct {
		name, rules string
		req         Request
	}{
		{"token bucket", "rules:\n  - { id: r, by: [api_key], capacity: 100000000, refill_per_second: 1000 }\n", Request{APIKey: "k"}},
		{"three limits and a tier", `
rules:
  - { id: search, match: { endpoint: /search }, by: [api_key], capacity: 100000000, refill_per_second: 1000 }
  - { id: tier-minute, by: [api_key], algorithm: fixed_window, window: 1m, tiers: { pro: 1000000000 } }
  - { id: tenant, match: { api_key: "sk_*" }, by: [api_key], algorithm: sliding_window_counter, limit: 1000000000, window: 1m }
tier_of:
  - { api_key: "sk_prod_*", tier: pro }
`, Request{APIKey: "sk_prod_1", Endpoint: "/search", Method: "GET", IP: "203.0.113.7"}},
		{"gcra and shadow", `
rules:
  - { id: g, by: [api_key], algorithm: gcra, rate: 1000, burst: 100000000 }
  - { id: s, by: [ip], capacity: 1, refill_per_second: 0.001, shadow: true }
`, Request{APIKey: "k", IP: "203.0.113.7"}},
		{"tracked keys", "rules:\n  - { id: r, by: [api_key], capacity: 100000000, refill_per_second: 1000, max_keys: 10 }\n", Request{APIKey: "k"}},
		{"lease", "rules:\n  - { id: r, by: [api_key], capacity: 100000000, refill_per_second: 1000, lease: 1000000 }\n", Request{APIKey: "k"}},
		{"denied from the cache", "rules:\n  - { id: r, by: [api_key], capacity: 1, refill_per_second: 0.001 }\n", Request{APIKey: "k"}},
		{"denied from the cache beside a rule that counts every hit", "rules:\n  - { id: r, by: [api_key], capacity: 1, refill_per_second: 0.001 }\n  - { id: d, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h, count_over_limit: true }\n", Request{APIKey: "k"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(Config{}, mustParse(t, tc.rules))
			ctx := context.Background()
			var d Decision
			check := func() {
				if err := e.Check(ctx, &tc.req, &d); err != nil {
					t.Fatal(err)
				}
			}
			for range 3 { // counters, caches and the decision's slices exist
				check()
			}
			if n := testing.AllocsPerRun(200, check); n != 0 {
				t.Fatalf("%v allocations per decision", n)
			}
		})
	}
}
