package regional

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/redis/go-redis/v9"
)

func mustParse(t testing.TB, yaml string) *RuleSet {
	t.Helper()
	rs, err := Parse("", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func mustCheck(t testing.TB, e *Engine, req Request) Decision {
	t.Helper()
	var d Decision
	if err := e.Check(context.Background(), &req, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestFallbacksWhenRedisDies kills Redis under a running engine: each
// rule falls back as it says, the breaker opens, and once Redis is back
// enforcement resumes by itself.
func TestFallbacksWhenRedisDies(t *testing.T) {
	ctx := t.Context()
	store, srv := newTestRedisStore(t, RedisOptions{})
	clock := newVirtualClock()
	e := New(Config{Store: store, Clock: clock.Now, Breaker: BreakerConfig{Failures: 3, Cooldown: time.Second}}, mustParse(t, `
rules:
  - { id: open, match: { endpoint: /open }, by: [api_key], capacity: 100, refill_per_second: 1 }
  - { id: closed, match: { endpoint: /closed }, by: [api_key], capacity: 100, refill_per_second: 1, fallback: fail_closed }
  - { id: local, match: { endpoint: /local }, by: [api_key], algorithm: fixed_window, limit: 3, window: 1h, fallback: local_only }
`))
	for _, ep := range []string{"/open", "/closed", "/local"} {
		if d := mustCheck(t, e, Request{APIKey: "k", Endpoint: ep}); !d.Allowed || d.Degraded {
			t.Fatalf("%s with Redis up: %+v", ep, d)
		}
	}
	// Load runs through the kill and the restart: every decision is one a
	// fallback allows, none is an error, none hangs.
	stop := make(chan struct{})
	var load sync.WaitGroup
	var loadChecks atomic.Int64
	for g := range 8 {
		load.Add(1)
		go func() {
			defer load.Done()
			ep := []string{"/open", "/closed"}[g%2]
			for {
				select {
				case <-stop:
					return
				default:
				}
				var d Decision
				if err := e.Check(ctx, &Request{APIKey: fmt.Sprintf("load%d", g), Endpoint: ep}, &d); err != nil {
					t.Errorf("under load: %v", err)
					return
				}
				if ep == "/open" && !d.Allowed || ep == "/closed" && !d.Allowed && d.Code != CodeUnavailable {
					t.Errorf("%s under load: %+v", ep, d)
					return
				}
				loadChecks.Add(1)
			}
		}()
	}
	defer func() { close(stop); load.Wait() }()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, e, Request{APIKey: "k", Endpoint: "/open"}); !d.Allowed || !d.Degraded || !d.Limit().Degraded {
		t.Fatalf("fail_open without Redis: %+v", d)
	}
	if d := mustCheck(t, e, Request{APIKey: "k", Endpoint: "/closed"}); d.Allowed || d.Code != CodeUnavailable || d.Limit().RetryAfter != time.Second {
		t.Fatalf("fail_closed without Redis: %+v", d)
	}
	// local_only enforces the limit in this replica's memory.
	for i := range 3 {
		if d := mustCheck(t, e, Request{APIKey: "k", Endpoint: "/local"}); !d.Allowed || !d.Degraded {
			t.Fatalf("local_only request %d without Redis: %+v", i+1, d)
		}
	}
	if d := mustCheck(t, e, Request{APIKey: "k", Endpoint: "/local"}); d.Allowed || d.Code != CodeOverLimit || !d.Degraded {
		t.Fatalf("local_only 4th request: %+v", d)
	}
	if e.Breaker() != BreakerOpen {
		t.Fatalf("breaker %v after repeated failures, want open", e.Breaker())
	}
	if e.Stats().StoreErrors.Load() < 3 {
		t.Fatalf("store errors counted: %d", e.Stats().StoreErrors.Load())
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// Still open until the cooldown has passed: no call is tried. (Unless
	// a load call let through before the breaker opened came back with
	// success once Redis was up again, and closed it: on a busy machine
	// a call may wait that long.)
	if open := e.Breaker() == BreakerOpen; open {
		if d := mustCheck(t, e, Request{APIKey: "k", Endpoint: "/open"}); !d.Degraded && e.Breaker() == BreakerOpen {
			t.Fatalf("before the cooldown: %+v", d)
		}
	}
	// After a cooldown one call probes Redis (under this load, any of the
	// callers'); when a probe finds it back, the breaker closes.
	deadline := time.Now().Add(10 * time.Second)
	for {
		clock.AdvanceBy(time.Second)
		if !mustCheck(t, e, Request{APIKey: "k2", Endpoint: "/open"}).Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still degraded 10s after Redis came back; breaker %v", e.Breaker())
		}
	}
	for _, ep := range []string{"/open", "/closed", "/local"} {
		if d := mustCheck(t, e, Request{APIKey: "k2", Endpoint: ep}); !d.Allowed || d.Degraded {
			t.Fatalf("%s after Redis came back: %+v", ep, d)
		}
	}
	if e.Breaker() != BreakerClosed {
		t.Fatalf("breaker %v after recovery", e.Breaker())
	}
	if loadChecks.Load() == 0 {
		t.Fatal("the background load made no checks")
	}
}

func TestSlowRedisTimesOut(t *testing.T) {
	store, srv := newTestRedisStore(t, RedisOptions{})
	e := New(Config{Store: store, Timeout: 50 * time.Millisecond}, mustParse(t, `
rules:
  - { id: closed, by: [api_key], capacity: 100, refill_per_second: 1, fallback: fail_closed }
`))
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	go admin.Do(context.Background(), "DEBUG", "SLEEP", "2") // the server stalls for 2s
	// Wait until it does: a PING goes unanswered.
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ReadTimeout: 20 * time.Millisecond})
	defer probe.Close()
	for deadline := time.Now().Add(5 * time.Second); probe.Ping(context.Background()).Err() == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the server did not stall")
		}
	}
	// Waiting out the stall would take over a second; the timeout ends
	// the wait after about 50ms.
	start := time.Now()
	d := mustCheck(t, e, Request{APIKey: "k"})
	if took := time.Since(start); d.Code != CodeUnavailable || took > time.Second {
		t.Fatalf("check against a stalled Redis: %v after %v, want unavailable after about 50ms", d.Code, took)
	}
}

// TestEngineSurvivesSentinelFailover keeps checking while the primary is
// killed: decisions fall back during the failover and are whole again after.
func TestEngineSurvivesSentinelFailover(t *testing.T) {
	ctx := t.Context()
	sn := harness.NewSentinel(t, harness.SentinelOptions{})
	store := openTestRedisStore(t, sn.URL(), RedisOptions{})
	e := New(Config{Store: store, Breaker: BreakerConfig{Failures: 1, Cooldown: 50 * time.Millisecond}}, mustParse(t, `
rules:
  - { id: r, by: [api_key], capacity: 1000000, refill_per_second: 1000 }
`))
	if d := mustCheck(t, e, Request{APIKey: "k"}); !d.Allowed || d.Degraded {
		t.Fatalf("before failover: %+v", d)
	}
	if err := sn.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	degraded := 0
	deadline := time.Now().Add(30 * time.Second)
	for {
		d := mustCheck(t, e, Request{APIKey: "k"})
		if !d.Allowed {
			t.Fatalf("fail_open rule denied during failover: %+v", d)
		}
		if d.Degraded {
			degraded++
		} else if degraded > 0 {
			break // whole again after the failover
		}
		if time.Now().After(deadline) {
			t.Fatalf("no whole decision within 30s of killing the primary (%d degraded)", degraded)
		}
		time.Sleep(10 * time.Millisecond) // pacing the checks; the loop waits on the outcome above
	}
	// The other sentinels learn of the promotion within a few seconds.
	for {
		p, err := sn.CurrentPrimary(ctx)
		if err == nil && p == sn.Replicas[0].Addr() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("primary after failover: %s, %v; want the replica %s", p, err, sn.Replicas[0].Addr())
		}
		time.Sleep(20 * time.Millisecond) // polling the sentinels' view
	}
}

func TestDenialCacheSparesRedis(t *testing.T) {
	srv := harness.NewRedis(t, harness.RedisOptions{})
	ctx := t.Context()
	newEngine := func(onDenied func(Denial)) (*Engine, *RedisStore) {
		s := openTestRedisStore(t, srv.URL(), RedisOptions{})
		return New(Config{Store: s, OnDenied: onDenied}, mustParse(t, `
rules:
  - { id: hot, by: [api_key], capacity: 5, refill_per_second: 0.01, max_keys: 0 }
`)), s
	}
	var told []Denial
	a, _ := newEngine(func(d Denial) { told = append(told, d) })
	b, _ := newEngine(nil)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer admin.Close()
	for range 5 {
		mustCheck(t, a, Request{APIKey: "hot"})
	}
	if d := mustCheck(t, a, Request{APIKey: "hot"}); d.Allowed || d.Limit().Cached {
		t.Fatalf("6th: %+v, want denied by the store", d)
	}
	if len(told) != 1 || told[0].Key != "gq:{hot:hot}" || told[0].Until.Before(time.Now().Add(99*time.Second)) {
		t.Fatalf("siblings told %+v", told)
	}
	admin.ConfigResetStat(ctx)
	for range 1000 {
		d := mustCheck(t, a, Request{APIKey: "hot"})
		if d.Allowed || !d.Limit().Cached || d.Limit().RetryAfter <= 0 {
			t.Fatalf("flood: %+v", d)
		}
	}
	// The sibling denies from what it was told, without asking Redis either.
	if err := b.NoteDenial(told[0]); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, b, Request{APIKey: "hot"}); d.Allowed || !d.Limit().Cached {
		t.Fatalf("sibling: %+v", d)
	}
	if n := commandCalls(t, admin, "evalsha"); n != 0 {
		t.Fatalf("%d EVALSHA during a flood of cached denials", n)
	}
	if got := a.Stats().DenialCacheHits.Load(); got != 1000 {
		t.Fatalf("cache hits %d", got)
	}
	// Another key is not affected.
	if d := mustCheck(t, a, Request{APIKey: "cold"}); !d.Allowed {
		t.Fatalf("another key: %+v", d)
	}
}

func TestProgressivePenalty(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Clock: clock.Now}, mustParse(t, `
rules:
  - { id: r, by: [api_key], capacity: 1, refill_per_second: 1, penalty: { base: 2s, max: 8s } }
`))
	req := Request{APIKey: "impatient"}
	mustCheck(t, e, req)
	if d := mustCheck(t, e, req); d.Allowed || d.Limit().RetryAfter != time.Second {
		t.Fatalf("first denial: %+v", d.Limit())
	}
	// Each request sent while told to wait doubles the cooldown, up to 8s.
	for _, want := range []time.Duration{2, 4, 8, 8} {
		clock.AdvanceBy(100 * time.Millisecond)
		d := mustCheck(t, e, req)
		if d.Allowed || d.Limit().RetryAfter != want*time.Second {
			t.Fatalf("strike: retry-after %v, want %v", d.Limit().RetryAfter, want*time.Second)
		}
	}
	if e.Stats().Penalties.Load() != 4 {
		t.Fatalf("penalties counted: %d", e.Stats().Penalties.Load())
	}
	// Waiting as told pays: allowed, and the slate is clean.
	clock.AdvanceBy(8 * time.Second)
	if d := mustCheck(t, e, req); !d.Allowed {
		t.Fatalf("after waiting: %+v", d)
	}
	clock.AdvanceBy(time.Second)
	mustCheck(t, e, req)
	if d := mustCheck(t, e, req); d.Limit().RetryAfter != time.Second {
		t.Fatalf("a new denial after behaving: %v", d.Limit().RetryAfter)
	}
}

func TestLeasesServeFromMemory(t *testing.T) {
	store, srv := newTestRedisStore(t, RedisOptions{Timeout: slowOK})
	ctx := t.Context()
	clock := newVirtualClock()
	e := New(Config{Store: store, Clock: clock.Now, BatchTTL: time.Second, Timeout: slowOK}, mustParse(t, `
rules:
  - { id: hot, by: [api_key], capacity: 100, refill_per_second: 0.001, lease: 10, max_keys: 0 }
`))
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer admin.Close()
	admin.ConfigResetStat(ctx)
	for i := range 15 {
		if d := mustCheck(t, e, Request{APIKey: "hot"}); !d.Allowed {
			t.Fatalf("request %d: %+v", i+1, d)
		}
	}
	// 1 round trip took 10, served 10; the 11th took 10 more.
	if n := commandCalls(t, admin, "evalsha"); n != 2 {
		t.Fatalf("%d EVALSHA for 15 requests with leases of 10", n)
	}
	if hits := e.Stats().BatchHits.Load(); hits != 13 {
		t.Fatalf("lease hits %d, want 13", hits)
	}
	st, err := store.Inspect(ctx, []byte("gq:{hot:hot}"), Params{Algorithm: TokenBucket, Limit: 100, Rate: 0.001})
	if err != nil || st.Remaining != 80 {
		t.Fatalf("Redis holds %d (%v), want 80 while 5 sit leased", st.Remaining, err)
	}
	// The lease ends; what is left goes back.
	clock.AdvanceBy(time.Second)
	if err := e.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	st, _ = store.Inspect(ctx, []byte("gq:{hot:hot}"), Params{Algorithm: TokenBucket, Limit: 100, Rate: 0.001})
	if st.Remaining != 85 || e.Stats().BatchReturned.Load() != 5 {
		t.Fatalf("after the lease ended: Redis holds %d, returned %d; want 85 and 5", st.Remaining, e.Stats().BatchReturned.Load())
	}
}

// TestLeaseOverAdmissionBound hammers a leased fixed window from two
// replicas: admitted stays within the limit plus replicas × lease.
func TestLeaseOverAdmissionBound(t *testing.T) {
	srv := harness.NewRedis(t, harness.RedisOptions{})
	rules := mustParse(t, `
rules:
  - { id: w, by: [api_key], algorithm: fixed_window, limit: 200, window: 1h, lease: 10, fallback: fail_closed }
`)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for r := range 2 {
		// A generous timeout, and no admission without the store: on a
		// loaded machine (-race, two cores) a call that times out would
		// otherwise fail open, which is not what this test is about.
		s := openTestRedisStore(t, srv.URL(), RedisOptions{Timeout: slowOK})
		e := New(Config{Store: s, Timeout: slowOK}, rules)
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 60 {
					if mustCheck(t, e, Request{APIKey: "tenant"}).Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		_ = r
	}
	wg.Wait()
	if n := admitted.Load(); n > 200+2*10 || n < 200-2*10 {
		t.Fatalf("admitted %d of 1200 with limit 200 and 2 replicas leasing 10", n)
	}
	t.Logf("admitted %d with limit 200 (bound: 200 + 2 × 10)", admitted.Load())
}

func TestKeyCap(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Clock: clock.Now}, mustParse(t, `
rules:
  - { id: refuse, match: { endpoint: /r }, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m, max_keys: 3 }
  - { id: fold, match: { endpoint: /f }, by: [api_key], algorithm: fixed_window, limit: 2, window: 1m, max_keys: 2, on_key_overflow: fold }
`))
	for _, k := range []string{"a", "b", "c", "a"} {
		if d := mustCheck(t, e, Request{APIKey: k, Endpoint: "/r"}); !d.Allowed {
			t.Fatalf("tracked key %s: %+v", k, d)
		}
	}
	if d := mustCheck(t, e, Request{APIKey: "d", Endpoint: "/r"}); d.Allowed || d.Code != CodeKeyLimit || !d.Limits[0].KeyRefused {
		t.Fatalf("a 4th key past max_keys 3: %+v", d)
	}
	if e.Stats().KeysRefused.Load() != 1 {
		t.Fatalf("refused %d", e.Stats().KeysRefused.Load())
	}
	// Keys idle for a window are no longer tracked.
	clock.AdvanceBy(2 * time.Minute)
	if err := e.Maintain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, e, Request{APIKey: "d", Endpoint: "/r"}); !d.Allowed {
		t.Fatalf("after the old keys went idle: %+v", d)
	}
	// Folding: keys past the cap share one counter.
	for _, k := range []string{"a", "b"} {
		mustCheck(t, e, Request{APIKey: k, Endpoint: "/f"})
	}
	for i, k := range []string{"c", "d", "e"} {
		d := mustCheck(t, e, Request{APIKey: k, Endpoint: "/f"})
		if d.Allowed != (i < 2) {
			t.Fatalf("folded key %s: allowed %v; the shared counter admits 2", k, d.Allowed)
		}
	}
	if e.Stats().KeysFolded.Load() != 3 {
		t.Fatalf("folded %d", e.Stats().KeysFolded.Load())
	}
}

// twoReplicas returns two engines of one region on one Redis, with the
// given rules, and their clock.
func twoReplicas(t *testing.T, rules string) (a, b *Engine, clock *virtualClock) {
	store, srv := newTestRedisStore(t, RedisOptions{Timeout: slowOK})
	clock = newVirtualClock()
	a = New(Config{Store: store, Clock: clock.Now, Timeout: slowOK}, mustParse(t, rules))
	b = New(Config{Store: openTestRedisStore(t, srv.URL(), RedisOptions{Timeout: slowOK}), Clock: clock.Now, Timeout: slowOK}, mustParse(t, rules))
	return a, b, clock
}

// A rule's cap holds for the region: replicas on one Redis count their
// keys together, and a key one replica tracks passes at another.
func TestKeyCapCountsTheRegion(t *testing.T) {
	a, b, clock := twoReplicas(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m, max_keys: 10 }\n")
	for i := range 10 {
		e := a
		if i >= 6 {
			e = b
		}
		if d := mustCheck(t, e, Request{APIKey: fmt.Sprint("k", i)}); !d.Allowed {
			t.Fatalf("key %d of 10: %+v", i, d)
		}
	}
	for name, e := range map[string]*Engine{"a": a, "b": b} {
		if d := mustCheck(t, e, Request{APIKey: "k10"}); d.Allowed || d.Code != CodeKeyLimit {
			t.Fatalf("an 11th key at %s: %+v, want KEY_LIMIT", name, d)
		}
		// A key the other replica tracks is the region's: it passes.
		if d := mustCheck(t, e, Request{APIKey: "k0"}); !d.Allowed {
			t.Fatalf("k0 at %s: %+v", name, d)
		}
		if d := mustCheck(t, e, Request{APIKey: "k9"}); !d.Allowed {
			t.Fatalf("k9 at %s: %+v", name, d)
		}
	}
	if a.Stats().KeysRefused.Load() != 1 || b.Stats().KeysRefused.Load() != 1 {
		t.Fatalf("refused %d and %d, want 1 each", a.Stats().KeysRefused.Load(), b.Stats().KeysRefused.Load())
	}
	// A window later the keys not seen since have lapsed: new ones pass.
	clock.AdvanceBy(2 * time.Minute)
	for _, e := range []*Engine{a, b} {
		if err := e.Maintain(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if d := mustCheck(t, b, Request{APIKey: "k10"}); !d.Allowed {
		t.Fatalf("k10 two windows later: %+v", d)
	}
}

// Keys that stay in use stay counted: each replica counts the keys it
// tracks in the region's every generation, so that the region's count is
// of the keys in use, not of the keys new since the last turn.
func TestKeyCapCountsKeysThatStay(t *testing.T) {
	a, b, clock := twoReplicas(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 100, window: 1m, max_keys: 3 }\n")
	for turn := range 3 {
		for _, k := range []string{"k0", "k1", "k2"} {
			if d := mustCheck(t, a, Request{APIKey: k}); !d.Allowed {
				t.Fatalf("turn %d, %s at a: %+v", turn, k, d)
			}
		}
		if d := mustCheck(t, b, Request{APIKey: "new"}); d.Allowed || d.Code != CodeKeyLimit {
			t.Fatalf("turn %d: a fourth key at b: %+v, want KEY_LIMIT", turn, d)
		}
		clock.AdvanceBy(time.Minute)
	}
}

// A replica asks Redis about a key it tracks once a generation (a minute
// here), not at every check, even when the rule's window is shorter than
// the time between two checks of the key.
func TestKeyCapAsksRedisOnceAGeneration(t *testing.T) {
	calls := map[string]int64{}
	for _, extra := range []string{"", ", max_keys: 0"} {
		store, srv := newTestRedisStore(t, RedisOptions{Timeout: slowOK})
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
		defer admin.Close()
		clock := newVirtualClock()
		e := New(Config{Store: store, Clock: clock.Now, Timeout: slowOK}, mustParse(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 100, window: 1s"+extra+" }\n"))
		for range 20 { // 40 s: one generation's turn at most
			if d := mustCheck(t, e, Request{APIKey: "k"}); !d.Allowed {
				t.Fatalf("%+v", d)
			}
			clock.AdvanceBy(2 * time.Second)
			if err := e.Maintain(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		calls[extra] = commandCalls(t, admin, "evalsha") + commandCalls(t, admin, "eval")
	}
	// EVALSHA of the keys' script is refused once (NOSCRIPT), then EVAL.
	if capped, open := calls[""], calls[", max_keys: 0"]; capped > open+2*2 {
		t.Fatalf("20 checks of one key 2 s apart: %d script calls with the cap, %d without: want at most 2 more asks", capped, open)
	}
}

// Without max_keys a rule keys by descriptors is capped at DefaultMaxKeys;
// max_keys: 0 says no cap, and a rule of one counter needs none.
func TestKeyCapOnByDefault(t *testing.T) {
	rs := mustParse(t, `
rules:
  - { id: keyed, match: { endpoint: /a }, by: [api_key], capacity: 5, refill_per_second: 1 }
  - { id: open, match: { endpoint: /b }, by: [api_key], capacity: 5, refill_per_second: 1, max_keys: 0 }
  - { id: one, match: { endpoint: /c }, capacity: 5, refill_per_second: 1 }
`)
	for id, want := range map[string]int{"keyed": DefaultMaxKeys, "open": 0, "one": 0} {
		if got := rs.Rule(id).MaxKeys; got != want {
			t.Errorf("rule %s: max_keys %d, want %d", id, got, want)
		}
	}
	_, err := Parse("rules.yaml", []byte("rules:\n  - { id: r, by: [api_key], capacity: 5, refill_per_second: 1, max_keys: -1 }\n"))
	if err == nil || !strings.Contains(err.Error(), "max_keys") {
		t.Fatalf("max_keys -1: %v, want an error naming max_keys", err)
	}
}

// The in-memory store holds no more counters of a rule than its cap,
// however many keys are sent.
func TestKeyCapBoundsTheMemoryStore(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Clock: clock.Now}, mustParse(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m, max_keys: 100 }\n"))
	refused := 0
	for i := range 1000 {
		if d := mustCheck(t, e, Request{APIKey: fmt.Sprint("k", i)}); d.Code == CodeKeyLimit {
			refused++
		}
	}
	if refused != 900 {
		t.Fatalf("refused %d of 1,000 keys, want 900", refused)
	}
	n := 0
	for i := range e.local.shards {
		n += len(e.local.shards[i].entries)
	}
	if n != 100 {
		t.Fatalf("the store holds %d counters, want 100", n)
	}
}

func TestAdminOperations(t *testing.T) {
	srv := harness.NewRedis(t, harness.RedisOptions{})
	ctx := t.Context()
	rules := mustParse(t, `
rules:
  - { id: r, by: [api_key], capacity: 10, refill_per_second: 0.001 }
  - { id: w, match: { endpoint: /w }, by: [api_key], algorithm: fixed_window, limit: 3, window: 1h }
`)
	var engines []*Engine
	for range 2 {
		s := openTestRedisStore(t, srv.URL(), RedisOptions{})
		engines = append(engines, New(Config{Store: s}, rules))
	}
	e := engines[0]
	req := Request{APIKey: "acme"}
	for range 4 {
		mustCheck(t, e, req)
	}
	st, err := e.Inspect(ctx, "r", &req)
	if err != nil || st.Remaining != 6 || st.Limit != 10 {
		t.Fatalf("inspect: %+v, %v", st, err)
	}
	if again, _ := e.Inspect(ctx, "r", &req); again.Remaining != 6 {
		t.Fatalf("inspect changed the counter: %d", again.Remaining)
	}
	if st, err = e.Grant(ctx, "r", &req, 3); err != nil || st.Remaining != 9 {
		t.Fatalf("grant 3: %+v, %v", st, err)
	}
	// Grant on a window admits beyond the limit for that window.
	wreq := Request{APIKey: "acme", Endpoint: "/w"}
	for range 3 {
		mustCheck(t, e, wreq)
	}
	if st, err = e.Grant(ctx, "w", &wreq, 2); err != nil || st.Remaining != 2 {
		t.Fatalf("grant 2 on a spent window: %+v, %v", st, err)
	}
	for range 2 {
		if d := mustCheck(t, e, wreq); !d.Allowed {
			t.Fatal("granted quota not admitted")
		}
	}
	if err := e.Reset(ctx, "r", &req); err != nil {
		t.Fatal(err)
	}
	if st, _ = e.Inspect(ctx, "r", &req); st.Remaining != 10 {
		t.Fatalf("after reset: %d", st.Remaining)
	}
	for _, tc := range []struct {
		rule string
		req  Request
		want error
	}{
		{"nope", req, ErrUnknownRule},
		{"r", Request{}, ErrInvalidRequest},
		{"r", Request{APIKey: "acme", IP: "bad"}, ErrInvalidRequest},
	} {
		if _, err := e.Inspect(ctx, tc.rule, &tc.req); !errors.Is(err, tc.want) {
			t.Errorf("Inspect(%s, %+v) = %v, want %v", tc.rule, tc.req, err, tc.want)
		}
	}
	if _, err := e.Grant(ctx, "r", &req, 0); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("grant 0: %v", err)
	}

	// A runtime block on one replica reaches the other through Redis.
	if err := e.Block(ctx, Block{Pattern: "acme*"}); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, e, req); d.Code != CodeBlocked {
		t.Fatalf("blocked here: %+v", d)
	}
	other := engines[1]
	if err := other.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, other, req); d.Code != CodeBlocked {
		t.Fatalf("sibling after maintenance: %+v", d)
	}
	if bl := other.Blocks(); len(bl) != 1 || bl[0].Pattern != "acme*" {
		t.Fatalf("sibling's blocks %+v", bl)
	}
	if err := other.Unblock(ctx, "acme*"); err != nil {
		t.Fatal(err)
	}
	e.Maintain(ctx)
	if d := mustCheck(t, e, req); d.Code == CodeBlocked {
		t.Fatal("still blocked after unblock")
	}
	if err := e.Block(ctx, Block{Pattern: ""}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("empty pattern: %v", err)
	}
	// As the rules file's block list, a pattern of wildcards alone is
	// refused, and so is an end already past: neither changes anything.
	for _, b := range []Block{{Pattern: "*"}, {Pattern: "?*"}, {Pattern: "temp", Until: time.Now().Add(-time.Second)}} {
		if err := e.Block(ctx, b); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("block %+v: %v", b, err)
		}
	}
	if bl := e.Blocks(); len(bl) != 0 {
		t.Fatalf("refused blocks kept: %+v", bl)
	}
	// A block with an end lapses by itself.
	now := time.Now()
	timed := New(Config{Store: openTestRedisStore(t, srv.URL(), RedisOptions{}), Clock: func() time.Time { return now }}, rules)
	if err := timed.Block(ctx, Block{Pattern: "temp", Until: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if d := mustCheck(t, timed, Request{APIKey: "temp"}); d.Code != CodeBlocked {
		t.Fatal("a block with an end to come does not block")
	}
	now = now.Add(2 * time.Minute)
	if d := mustCheck(t, timed, Request{APIKey: "temp"}); d.Code == CodeBlocked {
		t.Fatal("an expired block still blocks")
	}
}

func TestViolationsStream(t *testing.T) {
	store, _ := newTestRedisStore(t, RedisOptions{})
	ctx := t.Context()
	log := NewRedisViolations(store.Client(), "us-east", 100)
	e := New(Config{Region: "us-east", Store: store, Violations: log}, mustParse(t, `
rules:
  - { id: r, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h }
block: ["bad*"]
`))
	mustCheck(t, e, Request{APIKey: "a"})
	for range 5 {
		mustCheck(t, e, Request{APIKey: "a", IP: "203.0.113.9"})
	}
	mustCheck(t, e, Request{APIKey: "bad1"})
	if err := e.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	vs, err := log.Recent(ctx, 10)
	if err != nil || len(vs) != 2 {
		t.Fatalf("violations %+v, %v", vs, err)
	}
	over, blocked := vs[1], vs[0]
	if over.Code != "RATE_LIMIT_EXCEEDED" || over.Rule != "r" || over.Count != 5 || over.Region != "us-east" || over.Limit != 1 || over.IP != "203.0.113.9" || over.RetryAfter <= 0 {
		t.Fatalf("over-limit violation %+v", over)
	}
	if blocked.Code != "KEY_BLOCKED" || blocked.APIKey != "bad1" || blocked.Count != 1 {
		t.Fatalf("block violation %+v", blocked)
	}
	// The stream stays bounded.
	for i := range 1000 {
		mustCheck(t, e, Request{APIKey: fmt.Sprintf("k%d", i)})
		mustCheck(t, e, Request{APIKey: fmt.Sprintf("k%d", i)})
	}
	if err := e.Maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := store.Client().XLen(ctx, log.Key()).Result(); n > 300 {
		t.Fatalf("stream holds %d entries with MAXLEN ~100", n)
	}
}

// TestRedactedKeys: with RedactKeys, the log and the violations recorded
// show a hash of the API key and the counter key, never the keys.
func TestRedactedKeys(t *testing.T) {
	var logged bytes.Buffer
	vlog := NewMemoryViolations(10)
	e := New(Config{Region: "us", Violations: vlog, RedactKeys: true, Logger: slog.New(slog.NewTextHandler(&logged, nil))}, mustParse(t, `
rules:
  - { id: r, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h }
`))
	const key = "sk_live_SECRET123"
	mustCheck(t, e, Request{APIKey: key})
	mustCheck(t, e, Request{APIKey: key})
	if err := e.Maintain(t.Context()); err != nil {
		t.Fatal(err)
	}
	vs, err := vlog.Recent(t.Context(), 10)
	if err != nil || len(vs) != 1 {
		t.Fatalf("violations %+v, %v", vs, err)
	}
	if vs[0].APIKey != RedactKey(key) || !strings.HasPrefix(vs[0].Key, "sha256:") || len(RedactKey(key)) != len("sha256:")+16 {
		t.Fatalf("violation %+v, want the API key as %s and the counter key hashed", vs[0], RedactKey(key))
	}
	if strings.Contains(logged.String(), "SECRET") || !strings.Contains(logged.String(), RedactKey(key)) {
		t.Fatalf("the log shows the key, or not its hash:\n%s", logged.String())
	}
	if RedactKey(key) != RedactKey(key) || RedactKey(key) == RedactKey(key+"x") || RedactKey("") != "" {
		t.Fatal("RedactKey is not a function of the key alone")
	}
}

// TestSiblingDenialsAreBounded: a denial told by a sibling (over the
// network, so perhaps forged) is refused when its key is of no rule in
// force or too long, and holds a key no longer than one of its rule's
// could (and a second for the siblings' clocks): a window for a fixed
// window, two for a sliding one, the longest cooldown of a penalty, a
// moment for a global limit.
func TestSiblingDenialsAreBounded(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Clock: clock.Now}, mustParse(t, `
rules:
  - { id: f, match: { api_key: "f*" }, by: [api_key], algorithm: fixed_window, limit: 10, window: 1m }
  - { id: s, match: { api_key: "s*" }, by: [api_key], algorithm: sliding_window_counter, limit: 10, window: 1m }
  - { id: p, match: { api_key: "p*" }, by: [api_key], capacity: 10, refill_per_second: 1, penalty: { base: 2s, max: 5m } }
  - { id: g, match: { api_key: "g*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 10, window: 1m }
`))
	century := clock.Now().Add(100 * 365 * 24 * time.Hour)
	for _, d := range []Denial{
		{Key: CounterKey("nope", "f1"), Until: century},
		{Key: CounterKey("f", strings.Repeat("x", 5000)), Until: century},
		{Key: "f1", Until: century},
	} {
		if err := e.NoteDenial(d); !errors.Is(err, ErrInvalidDenial) {
			t.Errorf("denial of %.30q: %v, want ErrInvalidDenial", d.Key, err)
		}
	}
	if st := e.Stats(); st.DenialsUnknownRule.Load() != 2 || st.DenialsTooLong.Load() != 1 {
		t.Errorf("refusals counted: unknown rule %d, too long %d; want 2, 1", st.DenialsUnknownRule.Load(), st.DenialsTooLong.Load())
	}
	for _, key := range []string{"f1", "s1", "p1"} {
		r := key[:1]
		if err := e.NoteDenial(Denial{Key: CounterKey(r, key), Until: century, Cost: 1, ResetAt: century}); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
	}
	if got := e.Stats().DenialsCapped.Load(); got != 3 {
		t.Errorf("%d denials capped, want 3", got)
	}
	cached := func(key string) bool {
		d := mustCheck(t, e, Request{APIKey: key})
		return !d.Allowed && d.Limit().Cached
	}
	for _, key := range []string{"f1", "s1", "p1"} {
		if !cached(key) {
			t.Errorf("%s: not denied from a sibling's denial", key)
		}
	}
	clock.Advance(int64(62 * time.Second / time.Microsecond))
	if cached("f1") {
		t.Error("f1 still denied a window later")
	}
	if !cached("s1") || !cached("p1") {
		t.Error("s1 or p1 let through after a window: their denials may last two windows, five minutes")
	}
	clock.Advance(int64(60 * time.Second / time.Microsecond))
	if cached("s1") {
		t.Error("s1 still denied two windows later")
	}
	clock.Advance(int64(180 * time.Second / time.Microsecond))
	if cached("p1") {
		t.Error("p1 still denied past its longest cooldown")
	}
	if h := denialHold(e.rules.Load().Rule("g")); h != globalDenialHold {
		t.Errorf("a global limit's denial held %d µs, want %d", h, globalDenialHold)
	}
	// A global limit's denial, told by a sibling, is held briefly but says
	// to retry at the window's end, as the sibling's own answer did; a
	// forged later end is cut to a window.
	now := clock.Now()
	end := now.Truncate(time.Minute).Add(time.Minute)
	for key, reset := range map[string]time.Time{"g1": end, "g2": century} {
		if err := e.NoteDenial(Denial{Key: CounterKey("g", key), Until: now.Add(time.Second), Cost: 1, ResetAt: reset}); err != nil {
			t.Fatal(err)
		}
		d := mustCheck(t, e, Request{APIKey: key})
		l := d.Limit()
		want := reset
		if reset == century {
			want = now.Add(time.Minute + time.Second)
		}
		if d.Allowed || !l.Cached || !l.ResetAt.Equal(want) || l.RetryAfter != want.Sub(now) {
			t.Errorf("%s, told to wait until %v: reset %v, retry %v; want %v and %v", key, reset, l.ResetAt, l.RetryAfter, want, want.Sub(now))
		}
	}
}

// TestCachedDenialsCountTheirViolation: the checks the denial cache denies
// count in their key's violation as those the store denies do, through
// the denial's reference to it, and a flush starts each key's count anew
// (the reference of an earlier flush counts nothing); another key's
// violation is its own.
func TestCachedDenialsCountTheirViolation(t *testing.T) {
	ctx := t.Context()
	log := NewMemoryViolations(100)
	e := New(Config{Region: "us", Violations: log}, mustParse(t, `
rules:
  - { id: r, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h }
`))
	counts := func() map[string]int64 {
		t.Helper()
		if err := e.Maintain(ctx); err != nil {
			t.Fatal(err)
		}
		vs, err := log.Recent(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, v := range vs {
			got[v.Key] += v.Count
		}
		return got
	}
	mustCheck(t, e, Request{APIKey: "a"})
	mustCheck(t, e, Request{APIKey: "b"})
	for range 7 {
		if d := mustCheck(t, e, Request{APIKey: "a"}); d.Allowed {
			t.Fatalf("a admitted over its limit: %+v", d)
		}
	}
	mustCheck(t, e, Request{APIKey: "b"})
	if hits := e.Stats().DenialCacheHits.Load(); hits != 6 {
		t.Fatalf("%d denials from the cache, want 6 (the store's first, then the cache's)", hits)
	}
	if got := counts(); got["gq:{r:a}"] != 7 || got["gq:{r:b}"] != 1 || len(got) != 2 {
		t.Fatalf("violations after the first flush %v, want a's 7 and b's 1", got)
	}
	for range 3 {
		mustCheck(t, e, Request{APIKey: "a"})
	}
	if got := counts(); got["gq:{r:a}"] != 7+3 || got["gq:{r:b}"] != 1 {
		t.Fatalf("violations after the second flush %v, want a's 3 more in a violation of its own", got)
	}
	vs, _ := log.Recent(ctx, 100)
	if len(vs) != 3 || vs[0].Key != "gq:{r:a}" || vs[0].Count != 3 {
		t.Fatalf("violations %+v, want the second flush's of a alone, with 3", vs)
	}
}
