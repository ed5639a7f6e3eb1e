package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/redis/go-redis/v9"
)

// A report far past a slowly refilling bucket's limit is answered at once,
// by both stores, and the debt the bucket keeps is capped (debtCap): what
// a year of refill pays back. An unbounded debt's wait would go past what
// float64 counts in whole microseconds.
func TestHugeReportsAreAnsweredAndCapped(t *testing.T) {
	rules := mustParse(t, "rules:\n  - { id: bytes, by: [api_key], capacity: 1000, refill_per_second: 0.0116, count_over_limit: true }\n")
	rs, srv := newTestRedisStore(t, RedisOptions{Timeout: 5 * time.Second})
	for name, e := range map[string]*Engine{
		"memory": New(Config{}, rules),
		"redis":  New(Config{Store: rs, Timeout: 5 * time.Second}, rules),
	} {
		done := make(chan Decision, 1)
		go func() {
			var d Decision
			e.Check(context.Background(), &Request{APIKey: "k", Cost: 200_000_000}, &d)
			done <- d
		}()
		select {
		case d := <-done:
			l := d.Limit()
			if d.Allowed || d.Degraded || l.Charged != 200_000_000 {
				t.Fatalf("%s: %+v, want denied by the store and charged 2e8", name, l)
			}
			// 0.0116 a second for 366 days: 366,825 tokens of debt at most.
			if l.Debt < 366_000 || l.Debt > 367_000 || l.RetryAfter < 365*24*time.Hour || l.RetryAfter > 367*24*time.Hour {
				t.Fatalf("%s: debt %d, retry after %v: want the debt capped at a year's refill", name, l.Debt, l.RetryAfter)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: a report of 2e8 has not been answered in 20 s", name)
		}
	}
	if err := redis.NewClient(&redis.Options{Addr: srv.Addr()}).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("redis after the report: %v", err)
	}
	// More than 2^40 at once is bad input.
	var d Decision
	err := New(Config{}, rules).Check(t.Context(), &Request{APIKey: "k", Cost: 1<<40 + 1}, &d)
	if re := (*RequestError)(nil); !errors.As(err, &re) || re.Field != "cost" {
		t.Fatalf("a report of 2^40+1: %v, want an error naming cost", err)
	}
}

// A key beyond its rule's max_keys is refused, and a client sent away is
// penalised, when the request also meets a rule that counts every hit.
func TestKeyCapsAndPenaltiesHoldBesideDebt(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Clock: clock.Now}, mustParse(t, `
rules:
  - { id: capped, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h, max_keys: 1, count_over_limit: true }
`))
	mustCheck(t, e, Request{APIKey: "k1", Cost: 5})
	if d := mustCheck(t, e, Request{APIKey: "k2", Cost: 5}); d.Allowed || d.Code != CodeKeyLimit {
		t.Fatalf("a second key past max_keys 1: %+v, want KEY_LIMIT", d)
	}
	if u, err := e.Usage(t.Context(), "capped", &Request{APIKey: "k2"}); err != nil || u.Remaining != 1000 {
		t.Fatalf("the refused key's counter: %+v (%v), want nothing counted", u, err)
	}

	e = New(Config{Clock: clock.Now}, mustParse(t, `
rules:
  - { id: p, by: [api_key], capacity: 1, refill_per_second: 1, penalty: { base: 8s, max: 8s } }
  - { id: tokens, by: [api_key], algorithm: fixed_window, limit: 100000, window: 1h, count_over_limit: true }
`))
	mustCheck(t, e, Request{APIKey: "k"})
	mustCheck(t, e, Request{APIKey: "k"}) // denied, and remembered
	clock.AdvanceBy(100 * time.Millisecond)
	mustCheck(t, e, Request{APIKey: "k"}) // sent while told to wait: penalised
	clock.AdvanceBy(2 * time.Second)      // the bucket is full again; the penalty runs 8 s
	if d := mustCheck(t, e, Request{APIKey: "k"}); d.Allowed {
		t.Fatal("allowed 2 s into an 8 s penalty")
	}
	// Every hit counted by the rule that counts them, the denied ones too.
	if u, err := e.Usage(t.Context(), "tokens", &Request{APIKey: "k"}); err != nil || u.Remaining != 100000-4 {
		t.Fatalf("tokens: %+v (%v), want 4 hits counted", u, err)
	}
}

// A request a global limit denies in memory, while the region's store is
// being recovered from, still counts its hit in a regional rule that
// counts every hit.
func TestDebtCountedWhenAGlobalLimitDeniesInMemory(t *testing.T) {
	ctx := t.Context()
	e, _, srv := oneReplicaRegion(t, `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 3000, window: 1h }
  - { id: tokens, by: [api_key], algorithm: fixed_window, limit: 100000, window: 1h, count_over_limit: true }
`)
	check := func(cost int64) Decision {
		t.Helper()
		var d Decision
		if err := e.Check(ctx, &Request{APIKey: "t", Cost: cost}, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	check(1)
	stallRedis(t, srv.Addr(), 300*time.Millisecond)
	if d := check(1); !d.Degraded {
		t.Fatalf("during the stall: %+v, want a degraded decision", d)
	}
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer probe.Close()
	for deadline := time.Now().Add(10 * time.Second); probe.Ping(ctx).Err() != nil; {
		if time.Now().After(deadline) {
			t.Fatal("redis did not come back")
		}
	}
	// The global limit, still decided in memory (the episode lasts until
	// its write-back), has no room for 500; the regional rule counts it.
	if d := check(500); d.Allowed {
		t.Fatalf("500 past the region's part of the global limit: %+v", d)
	}
	if u, err := e.Usage(ctx, "tokens", &Request{APIKey: "t"}); err != nil || u.Remaining != 100000-501 {
		t.Fatalf("tokens: remaining %d (%v), want 501 counted (1 and 500; the stalled 1 fell open)", u.Remaining, err)
	}
}

// A call its caller gave up on, and decided without (a global limit then
// counts in memory and writes back), gives back what the store took of a
// global limit, as debt or not: counted once. A regional limit's debt
// stays: no fallback counts it again.
func TestAbandonedCallsGiveBackGlobalDebt(t *testing.T) {
	ctx := t.Context()
	rs, _ := newTestRedisStore(t, RedisOptions{Region: "us"})
	p := Params{Algorithm: FixedWindow, Limit: 3000, Window: 3600e6}
	for i, debt := range []bool{false, true} {
		for _, cost := range []int64{50, 150} { // within the allowance of 100, and past it
			key := []byte(fmt.Sprintf("gq:{ab%d-%d}", i, cost))
			op := Op{Key: key, Params: p, Cost: cost, Global: true, Allowance: 100, Ceiling: -1, Debt: debt}
			c := rs.newCall([]Op{op}, "check", 0, -1)
			c.state.Store(callAbandoned)
			runBatch(t, rs, []*redisCall{c})
			slots, err := rs.ReadGlobal(ctx, key, time.Now().UnixMicro()/p.Window*p.Window/1000)
			var want []crdt.Slot
			if cost <= 100 || debt {
				want = []crdt.Slot{{Region: "us", P: uint64(cost), N: uint64(cost)}}
			}
			if err != nil || fmt.Sprint(slots) != fmt.Sprint(want) {
				t.Fatalf("debt %v, cost %d: the region's slot after an abandoned call %v (%v), want %v", debt, cost, slots, err, want)
			}
		}
	}
	// Regional debt stays.
	key := []byte("gq:{ab-regional}")
	fw := Params{Algorithm: FixedWindow, Limit: 10, Window: 3600e6}
	c := rs.newCall([]Op{{Key: key, Params: fw, Cost: 30, Debt: true}}, "check", 0, -1)
	c.state.Store(callAbandoned)
	runBatch(t, rs, []*redisCall{c})
	if r, err := rs.Inspect(ctx, key, fw); err != nil || r.Remaining != -20 {
		t.Fatalf("a regional limit's debt after an abandoned call: remaining %d (%v), want -20", r.Remaining, err)
	}
}

// An abandoned call split over two slots, one allowing and one denying,
// gives back what the allowing slot took: its caller decided without the
// store.
func TestAbandonedSplitCallsGiveBack(t *testing.T) {
	ctx := t.Context()
	rs, _ := newTestRedisStore(t, RedisOptions{Region: "us"})
	rs.cluster = true // a script per slot, on one server
	p := Params{Algorithm: FixedWindow, Limit: 10, Window: 3600e6}
	full := Params{Algorithm: FixedWindow, Limit: 1, Window: 3600e6}
	ka, kb := []byte("gq:{ra}x"), []byte("gq:{rb}y")
	if keySlot(ka) == keySlot(kb) {
		t.Fatal("the keys share a slot")
	}
	runBatch(t, rs, []*redisCall{rs.newCall([]Op{{Key: kb, Params: full, Cost: 1}}, "check", 0, -1)})
	c := rs.newCall([]Op{{Key: ka, Params: p, Cost: 3}, {Key: kb, Params: full, Cost: 1}}, "check", 0, -1)
	c.state.Store(callAbandoned)
	runBatch(t, rs, []*redisCall{c})
	if r, err := rs.Inspect(ctx, ka, p); err != nil || r.Remaining != 10 {
		t.Fatalf("the allowing slot after an abandoned split call: remaining %d (%v), want 10", r.Remaining, err)
	}
}

// A shadow rule that counts every hit is not audited when the request
// beside it is denied from the denial cache, as it is not otherwise (that
// such a request allocates nothing: TestCheckMemoryAllocatesNothing).
func TestCachedDenialsBesideDebt(t *testing.T) {
	vlog := NewMemoryViolations(10)
	e := New(Config{Region: "us", Violations: vlog}, mustParse(t, `
rules:
  - { id: a, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h }
  - { id: s, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h, shadow: true, count_over_limit: true }
`))
	mustCheck(t, e, Request{APIKey: "k"})
	mustCheck(t, e, Request{APIKey: "k"}) // a denied by the store, and remembered
	d := mustCheck(t, e, Request{APIKey: "k"})
	if d.Allowed || !slices.ContainsFunc(d.Limits, func(l LimitStatus) bool { return l.Cached }) {
		t.Fatalf("want a denial from the cache: %+v", d.Limits)
	}
	if err := e.Maintain(t.Context()); err != nil {
		t.Fatal(err)
	}
	vs, _ := vlog.Recent(t.Context(), 10)
	for _, v := range vs {
		if v.Rule == "s" {
			t.Fatalf("the shadow rule was audited: %+v", vs)
		}
	}
	if u, err := e.Usage(t.Context(), "s", &Request{APIKey: "k"}); err != nil || u.Debt != 2 {
		t.Fatalf("the shadow rule's counter: %+v (%v), want every hit counted (debt 2)", u, err)
	}
}

// A global rule that counts every hit and fails closed counts a report
// made while its store cannot answer, in memory, to be written back: the
// store gives back what it took of a call its caller gave up on.
func TestFailClosedGlobalDebtIsCountedInMemory(t *testing.T) {
	ctx := t.Context()
	e, store, srv := oneReplicaRegion(t, `
rules:
  - { id: tokens, by: [api_key], scope: global, algorithm: fixed_window, limit: 3000, window: 1h, count_over_limit: true, fallback: fail_closed }
`)
	var d Decision
	if err := e.Check(ctx, &Request{APIKey: "t", Cost: 10}, &d); err != nil || !d.Allowed {
		t.Fatalf("with the store up: %+v (%v)", d, err)
	}
	stallRedis(t, srv.Addr(), 500*time.Millisecond)
	if err := e.Check(ctx, &Request{APIKey: "t", Cost: 40}, &d); err != nil || d.Allowed || d.Code != CodeUnavailable || d.Limits[0].Charged != 40 {
		t.Fatalf("the store stalled, fail_closed: %+v (%v), want unavailable and 40 charged", d, err)
	}
	waitWrittenBack(t, e, store, "gq:{tokens:t}", "50 counted once (10, and 40 written back)",
		func(s crdt.Slot) bool { return s.P-s.N == 50 })
}

// A report to a global rule with count_over_limit while the store cannot
// answer is counted in memory, past the region's allowance, and written
// to the region's slot once the store is back: usage reported after the
// response is not lost to a store's fault.
func TestGlobalReportsSurviveAStalledStore(t *testing.T) {
	e, store, srv := oneReplicaRegion(t, `
rules:
  - { id: tokens, by: [api_key], scope: global, algorithm: fixed_window, limit: 3000, window: 1h, count_over_limit: true }
`)
	report := func(cost int64) LimitStatus {
		t.Helper()
		var d Decision
		if err := e.Check(t.Context(), &Request{APIKey: "tenant", Cost: cost}, &d); err != nil {
			t.Fatal(err)
		}
		return d.Limits[0]
	}
	if l := report(10); !l.Allowed || l.Degraded || l.Charged != 10 {
		t.Fatalf("with the store up: %+v", l)
	}
	stallRedis(t, srv.Addr(), 700*time.Millisecond)
	if l := report(200); l.Allowed || !l.Degraded || l.Charged != 200 {
		t.Fatalf("200 past the floor, the store stalled: %+v, want denied in memory and charged 200", l)
	}
	waitWrittenBack(t, e, store, "gq:{tokens:tenant}", "210 written back", func(s crdt.Slot) bool { return s.P == 210 })
}

// oneReplicaRegion is region us of three (eu and ap heard of, not run),
// one replica on a redis-server of its own, its calls timing out after
// 50 ms; before any lease it keeps to its floor, 10% of a global limit
// over 3 regions.
func oneReplicaRegion(t *testing.T, rules string) (*Engine, *RedisStore, *harness.Redis) {
	t.Helper()
	store, srv := newTestRedisStore(t, RedisOptions{Region: "us", Timeout: 50 * time.Millisecond})
	e := New(Config{Region: "us", Replica: "us-1", Store: store, Timeout: 50 * time.Millisecond,
		Global: GlobalConfig{Regions: []string{"us", "eu", "ap"}}}, mustParse(t, rules))
	return e, store, srv
}

// waitWrittenBack runs e's maintenance until the region's slot of key's
// window of this hour, in the store, is as ok wants: what the replica
// counted in memory is written back once the store answers again (real
// time). want says what ok wants, for the failure.
func waitWrittenBack(t *testing.T, e *Engine, store *RedisStore, key, want string, ok func(crdt.Slot) bool) {
	t.Helper()
	ctx := t.Context()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := e.Maintain(ctx); err == nil {
			slots, err := store.ReadGlobal(ctx, []byte(key), time.Now().Truncate(time.Hour).UnixMilli())
			if err == nil && len(slots) == 1 && ok(slots[0]) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the region's slot: %v (%v), want %s", slots, err, want)
			}
		}
		time.Sleep(20 * time.Millisecond) // the store's recovery is real time
	}
}

// A denied check that counts nothing — the gateway's question before a
// metered request — asks the budgets for what a hit of the rule costs on
// average, not for nothing: a region whose tenant is over its share there
// shows the demand it turns away, and its share can grow.
func TestDeniedQuestionsAskForATypicalHit(t *testing.T) {
	e, _, _ := oneReplicaRegion(t, `
rules:
  - { id: tokens, by: [api_key], scope: global, algorithm: fixed_window, limit: 3000, window: 1h, count_over_limit: true }
`)
	var d Decision
	for range 40 { // reports of 100 tokens: past the region's share (its floor)
		if err := e.Check(t.Context(), &Request{APIKey: "t", Cost: 100}, &d); err != nil {
			t.Fatal(err)
		}
	}
	before := e.Demand("tokens")
	for range 10 {
		if err := e.Check(t.Context(), &Request{APIKey: "t", CountNothing: true}, &d); err != nil || d.Allowed {
			t.Fatalf("a question past the share: %+v (%v), want denied", d, err)
		}
	}
	after := e.Demand("tokens")
	if got, want := after.Denied-before.Denied, 10*100.0/3000; math.Abs(got-want) > 1e-4 { // demand is kept in millionths of the limit
		t.Fatalf("ten denied questions asked for %.4f of the limit, want %.4f (ten hits of 100)", got, want)
	}
	if after.Admitted != before.Admitted {
		t.Fatalf("denied questions counted as admitted: %.4f -> %.4f", before.Admitted, after.Admitted)
	}
}
