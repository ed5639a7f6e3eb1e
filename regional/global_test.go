package regional

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"pgregory.net/rapid"
)

// TestGlobalStoresDecideAlike drives global limits, strict and elastic,
// through the in-memory store and a real redis-server, with other regions'
// slots merged in between, and requires the same decisions, the same own
// slots, and the same windows.
func TestGlobalStoresDecideAlike(t *testing.T) {
	// A generous timeout: on a busy machine a slow round trip is not
	// what this test is about.
	rs, clock := newVirtualRedisStore(t, RedisOptions{Region: "eu", Timeout: 5 * time.Second})
	ctx := t.Context()
	run := 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		mem := NewMemoryStore(clock.Now)
		mem.SetRegion("eu")
		p := Params{
			Algorithm: rapid.SampledFrom([]Algorithm{FixedWindow, SlidingWindowCounter, Concurrency}).Draw(t, "algorithm"),
			Limit:     rapid.Int64Range(1, 100).Draw(t, "limit"),
			Window:    rapid.SampledFrom([]int64{1e6, 7e6, 60e6}).Draw(t, "window"),
		}
		keys := [][]byte{[]byte(fmt.Sprintf("gq:{g%d:a}", run)), []byte(fmt.Sprintf("gq:{g%d:b}", run))}
		remote := map[string]uint64{}
		for range rapid.IntRange(1, 40).Draw(t, "steps") {
			clock.Advance(rapid.SampledFrom([]int64{0, 1, 999, 250e3, 1e6, 7e6, 61e6}).Draw(t, "advance"))
			key := rapid.SampledFrom(keys).Draw(t, "key")
			if rapid.IntRange(0, 3).Draw(t, "merge") == 0 {
				// Another region's slot of this window arrives, or an
				// old copy of it.
				r := rapid.SampledFrom([]string{"us", "ap", "eu"}).Draw(t, "region")
				remote[r] += rapid.Uint64Range(0, 30).Draw(t, "p")
				start := clock.micros() / p.Window * p.Window
				w := GlobalWindow{Key: key, StartMillis: start / 1000, TTL: time.Hour,
					Slots: []crdt.Slot{{Region: r, P: remote[r] - rapid.Uint64Range(0, remote[r]).Draw(t, "older"), N: rapid.Uint64Range(0, 3).Draw(t, "n")}}}
				m1, err1 := mem.MergeGlobal(ctx, []GlobalWindow{w})
				m2, err2 := rs.MergeGlobal(ctx, []GlobalWindow{w})
				if err1 != nil || err2 != nil || m1 != m2 {
					t.Fatalf("merge %+v: memory raised %d (%v), redis %d (%v)", w, m1, err1, m2, err2)
				}
				continue
			}
			allowance := rapid.Int64Range(0, p.Limit).Draw(t, "allowance")
			ceiling := int64(-1)
			if rapid.Bool().Draw(t, "elastic") {
				ceiling = rapid.Int64Range(0, p.Limit).Draw(t, "ceiling")
			}
			ops := []Op{{Key: key, Params: p, Cost: rapid.Int64Range(0, 5).Draw(t, "cost"), Global: true, Allowance: allowance, Ceiling: ceiling,
				Debt: rapid.IntRange(0, 2).Draw(t, "debt") == 0}} // count_over_limit: counted denied or not
			if rapid.IntRange(0, 3).Draw(t, "known") == 0 {
				// The engine remembers more than the store holds (or
				// less, or of another window).
				start := clock.micros() / p.Window * p.Window / 1000
				ops[0].KnownStart = start - rapid.SampledFrom([]int64{0, 0, p.Window / 1000}).Draw(t, "known window")
				ops[0].KnownP, ops[0].KnownN = rapid.Uint64Range(0, 40).Draw(t, "known p"), rapid.Uint64Range(0, 3).Draw(t, "known n")
			}
			if rapid.Bool().Draw(t, "with a regional limit") {
				ops = append(ops, Op{Key: []byte(fmt.Sprintf("gq:{r%d}", run)), Params: Params{Algorithm: FixedWindow, Limit: 3, Window: 1e6}, Cost: 1,
					Debt: rapid.Bool().Draw(t, "regional debt")})
			}
			mres, rres := make([]Result, len(ops)), make([]Result, len(ops))
			if _, err := mem.Apply(ctx, ops, mres); err != nil {
				t.Fatal(err)
			}
			if _, err := rs.Apply(ctx, ops, rres); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(mres, rres) {
				t.Fatalf("%+v: memory %+v, redis %+v", ops, mres, rres)
			}
			for _, k := range keys {
				start := clock.micros() / p.Window * p.Window / 1000
				for _, s := range []int64{start, start - p.Window/1000} {
					ms, _ := mem.ReadGlobal(ctx, k, s)
					rsl, err := rs.ReadGlobal(ctx, k, s)
					if err != nil || !slices.Equal(ms, rsl) {
						t.Fatalf("window %s@%d: memory %v, redis %v (%v)", k, s, ms, rsl, err)
					}
				}
			}
		}
	})
}

// TestGlobalStrictAndElastic spells out the two modes on one window.
func TestGlobalStrictAndElastic(t *testing.T) {
	clock := newVirtualClock()
	mem := NewMemoryStore(clock.Now)
	mem.SetRegion("eu")
	ctx := t.Context()
	p := Params{Algorithm: FixedWindow, Limit: 100, Window: 60e6}
	key := []byte("gq:{tenant-global:sk_1}")
	start := clock.micros() / p.Window * p.Window / 1000
	// us has used 50 of the limit, ap 30.
	if _, err := mem.MergeGlobal(ctx, []GlobalWindow{{Key: key, StartMillis: start, TTL: time.Hour,
		Slots: []crdt.Slot{{Region: "ap", P: 30}, {Region: "us", P: 50}}}}); err != nil {
		t.Fatal(err)
	}
	check := func(ceiling int64) Result {
		var r [1]Result
		mem.Apply(ctx, []Op{{Key: key, Params: p, Cost: 1, Global: true, Allowance: 10, Ceiling: ceiling}}, r[:])
		return r[0]
	}
	// Strict: eu admits its allowance of 10, and not one more.
	for i := range 10 {
		if r := check(-1); !r.Allowed || r.OwnP != uint64(i+1) || r.Remaining != int64(9-i) {
			t.Fatalf("strict request %d: %+v", i, r)
		}
	}
	if r := check(-1); r.Allowed || r.RetryAfter <= 0 {
		t.Fatalf("strict request 11: %+v, want denied until the window ends", r)
	}
	// Elastic with a ceiling of 99: global usage is 90, so 9 more.
	for i := range 9 {
		if r := check(99); !r.Allowed {
			t.Fatalf("elastic request %d: %+v", i, r)
		}
	}
	if r := check(99); r.Allowed {
		t.Fatalf("elastic request beyond the ceiling: %+v", r)
	}
	slots, _ := mem.ReadGlobal(ctx, key, start)
	want := []crdt.Slot{{Region: "ap", P: 30}, {Region: "eu", P: 19}, {Region: "us", P: 50}}
	if !slices.Equal(slots, want) {
		t.Fatalf("slots %v, want %v", slots, want)
	}
}

// countAllowed sends n requests for key and counts those allowed.
func countAllowed(t *testing.T, e *Engine, key string, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		if mustCheck(t, e, Request{APIKey: key, Endpoint: "/x"}).Allowed {
			allowed++
		}
	}
	return allowed
}

// noLag is a lag so short that elastic mode holds back nothing for what
// the others may have admitted meanwhile: tests of the ceiling itself.
const noLag = time.Microsecond

const globalRules = `
rules:
  - id: g-strict
    match: { api_key: "s_*" }
    by: [api_key]
    scope: global
    algorithm: fixed_window
    limit: 1000
    window: 1h
  - id: g-elastic
    match: { api_key: "e_*" }
    by: [api_key]
    scope: global
    mode: elastic
    algorithm: fixed_window
    limit: 1000
    window: 1h
`

// TestEngineGlobalLimits runs two regions' engines, each on its own store
// (memory, and a real redis-server): before a lease a region keeps to its
// floor; a lease raises it; elastic mode borrows global slack that gossip
// shows, and no more; a region alone enforces the whole limit.
func TestEngineGlobalLimits(t *testing.T) {
	// "own" is the engine's own memory (--dev, the simulator), which keeps
	// the other regions' slots in the engine's copy alone.
	for _, kind := range []string{"memory", "redis", "own"} {
		t.Run(kind, func(t *testing.T) {
			clock := newVirtualClock()
			regions := []string{"eu", "us"}
			engine := func(region string) *Engine {
				var store Store
				if kind == "own" {
					return New(Config{Region: region, Clock: clock.Now, Global: GlobalConfig{Regions: regions, Lag: noLag}}, mustParse(t, globalRules))
				}
				if kind == "redis" {
					rs, _ := newTestRedisStore(t, RedisOptions{Region: region, Timeout: slowOK})
					rs.testNow = clock.micros
					store = rs
				} else {
					m := NewMemoryStore(clock.Now)
					m.SetRegion(region)
					store = m
				}
				return New(Config{Region: region, Store: store, Clock: clock.Now, Timeout: slowOK, Global: GlobalConfig{Regions: regions, Lag: noLag}}, mustParse(t, globalRules))
			}
			eu, us := engine("eu"), engine("us")

			// No lease yet: the floor, 10% reserve over 2 regions = 5%.
			if got := countAllowed(t, eu, "s_1", 80); got != 50 {
				t.Fatalf("before a lease eu admitted %d, want its floor of 50", got)
			}
			if d := eu.Demand("g-strict"); d.Admitted != 0.05 || d.Denied != 0.03 || d.Used != 0.05 {
				t.Fatalf("demand %+v: want 0.05 admitted, 0.03 denied, 0.05 used", d)
			}
			// A lease of 40%: 350 more.
			l := budget.Lease{Rule: "g-strict", Region: "eu", Seq: 1, Floor: 0.05, Share: 0.35, Expires: clock.Now().Add(10 * time.Second)}
			if !eu.SetLease(l) || eu.SetLease(l) {
				t.Fatal("SetLease: want the lease taken once, and a repeat ignored")
			}
			clock.AdvanceBy(globalDenialHold * time.Microsecond) // the cached denials lapse
			if got := countAllowed(t, eu, "s_1", 400); got != 350 {
				t.Fatalf("with a 40%% lease eu admitted %d more, want 350", got)
			}
			// The lease lapses: back to the floor, already spent.
			clock.AdvanceBy(11 * time.Second)
			if got := countAllowed(t, eu, "s_1", 5); got != 0 {
				t.Fatalf("after the lease lapsed eu admitted %d, want 0", got)
			}

			// Elastic, before us has heard from eu: it cannot know what
			// eu used, and keeps to its floor.
			if got := countAllowed(t, us, "e_0", 60); got != 50 {
				t.Fatalf("us, not having heard from eu, admitted %d, want its floor of 50", got)
			}
			// Once the regions hear each other, us borrows the slack it
			// sees (all of it), then eu hears of us's 60 by gossip; eu
			// may borrow up to the ceiling (limit less 1% headroom) less
			// what the regions used.
			us.HeardFrom("eu")
			eu.HeardFrom("us")
			if got := countAllowed(t, us, "e_1", 60); got != 60 {
				t.Fatalf("us admitted %d, want all 60 from the slack it sees", got)
			}
			d := us.OwnDeltas(0, 0)[0]
			rep, err := eu.MergeRemote(t.Context(), d)
			if err != nil || rep.Applied == 0 {
				t.Fatalf("merge: %+v, %v", rep, err)
			}
			if got := countAllowed(t, eu, "e_1", 1000); got != 990-60 {
				t.Fatalf("eu admitted %d, want the ceiling 990 less us's 60 = 930", got)
			}
			u, err := eu.Usage(t.Context(), "g-elastic", &Request{APIKey: "e_1", Endpoint: "/x"})
			if err != nil || u.GlobalUsed != 990 || len(u.Regions) != 2 || u.Regions[1].Region != "us" || u.Regions[1].Used != 60 {
				t.Fatalf("eu's usage of e_1: %+v, %v; want 990 used, 60 of them by us", u, err)
			}
			if kind == "own" {
				// The engine's own memory keeps global counters in the
				// copy alone: its store holds no window of them.
				for i := range eu.local.shards {
					if n := len(eu.local.shards[i].globals); n != 0 {
						t.Fatalf("eu's store holds %d windows of global counters besides the copy, want none", n)
					}
				}
			}
			// eu silent for longer than StaleAfter: us stops borrowing
			// (its floor of 50 is spent on e_1), and borrows again once
			// it hears from eu.
			clock.AdvanceBy(DefaultStaleAfter)
			if got := countAllowed(t, us, "e_1", 10); got != 0 {
				t.Fatalf("with eu silent, us admitted %d more, want 0", got)
			}
			us.HeardFrom("eu")
			clock.AdvanceBy(globalDenialHold * time.Microsecond) // the cached denials lapse
			if got := countAllowed(t, us, "e_1", 10); got != 10 {
				t.Fatalf("with eu heard again, us admitted %d of 10, want all", got)
			}
			// A replayed or unknown-origin delta changes nothing.
			if rep, _ := eu.MergeRemote(t.Context(), d); rep.Applied != 0 || rep.Duplicate == 0 {
				t.Fatalf("replayed delta: %+v", rep)
			}
			d.Origin = "mars"
			if rep, _ := eu.MergeRemote(t.Context(), d); rep.UnknownRegion == 0 {
				t.Fatalf("unknown origin: %+v", rep)
			}
		})
	}
	// Alone (--dev): the whole limit.
	solo := New(Config{Region: "eu"}, mustParse(t, globalRules))
	if got := countAllowed(t, solo, "s_2", 1010); got != 1000 || !solo.Alone() {
		t.Fatalf("alone, admitted %d, want the whole limit of 1000", got)
	}
}

// TestGlobalWindowMemory: one window of a global counter with five
// regions' slots takes at most 200 bytes of Redis memory (docs/design.md).
func TestGlobalWindowMemory(t *testing.T) {
	rs, _ := newTestRedisStore(t, RedisOptions{Region: "us-east"})
	ctx := t.Context()
	key := []byte("gq:{tenant-global:sk_prod_000001}")
	start := time.Now().UnixMilli() / 60_000 * 60_000
	var slots []crdt.Slot
	for _, r := range []string{"ap-south", "eu-west", "sa-east", "us-east", "us-west"} {
		slots = append(slots, crdt.Slot{Region: r, P: 1234, N: 0})
	}
	if _, err := rs.MergeGlobal(ctx, []GlobalWindow{{Key: key, StartMillis: start, TTL: time.Hour, Slots: slots}}); err != nil {
		t.Fatal(err)
	}
	n, err := rs.Client().MemoryUsage(ctx, string(GlobalKey(key, start))).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY USAGE of a window with 5 regions: %d bytes", n)
	if n > 200 {
		t.Fatalf("a window with 5 regions takes %d bytes of Redis, want at most 200", n)
	}
}

// TestStrictSurvivesAFlushedRedis: a region's Redis loses its data in the
// middle of a window; the engine remembers what the region counted, so the
// window does not admit its allowance a second time.
func TestStrictSurvivesAFlushedRedis(t *testing.T) {
	rs, _ := newTestRedisStore(t, RedisOptions{Region: "eu", Timeout: slowOK})
	e := New(Config{Region: "eu", Store: rs, Timeout: slowOK, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	if got := countAllowed(t, e, "s_9", 60); got != 50 {
		t.Fatalf("before the flush: %d admitted, want the floor of 50", got)
	}
	if err := rs.Client().FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	e.forgetDenials()
	if got := countAllowed(t, e, "s_9", 60); got != 0 {
		t.Fatalf("after the flush: %d more admitted in the same window, want 0", got)
	}
}

// TestGlobalCountersRefuseAdmin: a global rule's counters are every
// region's usage; reset and grant refuse them, naming the rule, and change
// nothing.
func TestGlobalCountersRefuseAdmin(t *testing.T) {
	e := New(Config{Region: "eu", Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	countAllowed(t, e, "s_5", 3)
	req := &Request{APIKey: "s_5", Endpoint: "/x"}
	var re *RequestError
	if err := e.Reset(t.Context(), "g-strict", req); !errors.As(err, &re) || re.Field != "rule" {
		t.Fatalf("Reset of a global counter: %v, want an error naming rule", err)
	}
	if _, err := e.Grant(t.Context(), "g-strict", req, 5); !errors.As(err, &re) || re.Field != "rule" {
		t.Fatalf("Grant to a global counter: %v, want an error naming rule", err)
	}
	if u, err := e.Usage(t.Context(), "g-strict", req); err != nil || u.GlobalUsed != 3 {
		t.Fatalf("usage after refused admin calls: %+v, %v; want 3 used", u, err)
	}
}

// TestUnknownPeers: a region told of no other region, but not alone (it
// gossips: regiond with --nats and no --regions), takes the whole reserve
// as its floor and never borrows in elastic mode.
func TestUnknownPeers(t *testing.T) {
	e := New(Config{Region: "eu", Global: GlobalConfig{UnknownPeers: true}}, mustParse(t, globalRules))
	if e.Alone() {
		t.Fatal("a region with unknown peers thinks it is alone")
	}
	if got := countAllowed(t, e, "s_6", 200); got != 100 {
		t.Fatalf("strict: %d admitted, want the reserve of 100", got)
	}
	if got := countAllowed(t, e, "e_6", 200); got != 100 {
		t.Fatalf("elastic: %d admitted, want the reserve of 100 and no borrowing", got)
	}
}

// TestStoreGetsGlobalCountersBack: Redis dies and comes back empty (no
// persistence); until Maintain has given the store back every region's
// slots the replica holds, an elastic check does not borrow (the slack it
// would see was spent); after, it borrows what is really left.
func TestStoreGetsGlobalCountersBack(t *testing.T) {
	clock := newVirtualClock()
	rs, srv := newTestRedisStore(t, RedisOptions{Region: "eu", Timeout: slowOK})
	rs.testNow = clock.micros
	regions := []string{"eu", "us"}
	global := GlobalConfig{Regions: regions, StaleAfter: time.Hour, Lag: noLag}
	// Failing closed, a check while Redis is down admits nothing: what
	// eu admits below is what its elastic decisions let through.
	rules := mustParse(t, `
rules:
  - { id: g-elastic, match: { api_key: "e_*" }, by: [api_key], scope: global, mode: elastic,
      algorithm: fixed_window, limit: 1000, window: 1h, fallback: fail_closed }
`)
	eu := New(Config{Region: "eu", Store: rs, Clock: clock.Now, Timeout: slowOK, Breaker: BreakerConfig{Failures: 1, Cooldown: 50 * time.Millisecond},
		Global: global}, rules)
	m := NewMemoryStore(clock.Now)
	m.SetRegion("us")
	us := New(Config{Region: "us", Store: m, Clock: clock.Now, Timeout: slowOK, Global: global}, rules)
	eu.HeardFrom("us")
	us.HeardFrom("eu")
	if got := countAllowed(t, us, "e_7", 600); got != 600 {
		t.Fatalf("us admitted %d of 600", got)
	}
	d := us.OwnDeltas(0, 0)[0]
	if _, err := eu.MergeRemote(t.Context(), d); err != nil {
		t.Fatal(err)
	}
	if got := countAllowed(t, eu, "e_7", 100); got != 100 {
		t.Fatalf("eu admitted %d of 100", got)
	}
	key := []byte("gq:{g-elastic:e_7}")
	start := clock.Now().UnixMilli() / 3_600_000 * 3_600_000
	want := []crdt.Slot{{Region: "eu", P: 100}, {Region: "us", P: 600}}
	if slots, err := rs.ReadGlobal(t.Context(), key, start); err != nil || !slices.Equal(slots, want) {
		t.Fatalf("before the restart Redis holds %v (%v), want %v", slots, err, want)
	}

	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, eu, Request{APIKey: "e_8", Endpoint: "/x"}) // fails: the breaker opens
	if eu.Breaker() != BreakerOpen {
		t.Fatalf("breaker %v with Redis dead, want open", eu.Breaker())
	}
	if err := srv.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	// While the store failed lately, global limits are decided in memory
	// (fail_closed: nothing); the replica's heartbeat finds the store
	// back, and once it has nothing left to write, checks go to the store
	// again. Those must not borrow: the store has lost us's 600.
	harness.WaitFor(t, 5*time.Second, "the store is used again", func() bool {
		clock.AdvanceBy(60 * time.Millisecond)
		if mustCheck(t, eu, Request{APIKey: "e_7", Endpoint: "/x"}).Allowed {
			t.Fatal("a check borrowed against the store that came back empty")
		}
		eu.heartbeat(t.Context(), rs)
		return eu.Breaker() == BreakerClosed && !eu.global.degraded.episode.Load()
	})
	if slots, _ := rs.ReadGlobal(t.Context(), key, start); slices.Contains(slots, want[1]) {
		t.Fatalf("the restarted Redis holds %v already: the test shows nothing", slots)
	}
	// The store knows eu's 100 (the replica's memory of its own slot) but
	// not us's 600: borrowing now would take 890.
	if got := countAllowed(t, eu, "e_7", 50); got != 0 {
		t.Fatalf("before Maintain eu admitted %d more, want none: it must not borrow what it cannot see", got)
	}
	if err := eu.Maintain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if slots, err := rs.ReadGlobal(t.Context(), key, start); err != nil || !slices.Equal(slots, want) {
		t.Fatalf("after Maintain Redis holds %v (%v), want %v back", slots, err, want)
	}
	clock.AdvanceBy(globalDenialHold * time.Microsecond) // the cached denials lapse
	// The ceiling is 990; 700 are used.
	if got := countAllowed(t, eu, "e_7", 400); got != 290 {
		t.Fatalf("eu admitted %d more, want 290 up to the ceiling", got)
	}
}

// TestMaintainExpiresGlobalCounters: the engine's copy of the global
// counters drops the windows its store no longer keeps when Maintain runs,
// gossip or not: a library user without gossip does not grow it.
func TestMaintainExpiresGlobalCounters(t *testing.T) {
	clock := newVirtualClock()
	m := NewMemoryStore(clock.Now)
	m.SetRegion("eu")
	e := New(Config{Region: "eu", Store: m, Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	if got := countAllowed(t, e, "s_1", 3); got != 3 {
		t.Fatalf("admitted %d of 3", got)
	}
	if n := len(e.OwnDeltas(0, 0)[0].Entries); n != 1 {
		t.Fatalf("the copy holds %d windows, want 1", n)
	}
	if err := e.Maintain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(e.OwnDeltas(0, 0)[0].Entries); n != 1 {
		t.Fatalf("after Maintain in the window the copy holds %d windows, want 1", n)
	}
	start := clock.Now().UnixMilli() / 3_600_000 * 3_600_000
	clock.AdvanceBy(3 * time.Hour) // after the hour's window and its grace (an hour more)
	if err := e.Maintain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(e.OwnDeltas(0, 0)[0].Entries); n != 0 {
		t.Fatalf("after the window's grace, Maintain left %d windows in the copy", n)
	}
	// A peer's repair of that window does not bring it back.
	id := crdt.ID{Key: "gq:{g-strict:s_1}", Epoch: start}
	old := crdt.Delta{Origin: "us", Entries: []crdt.Entry{{ID: id, Slots: []crdt.Slot{{Region: "us", P: 5}}}}}
	rep, err := e.MergeRemote(t.Context(), old)
	if err != nil || rep.Applied != 0 || rep.Stale != 1 {
		t.Fatalf("merging a window over and done with: %+v, %v; want it stale", rep, err)
	}
	if pn := e.GlobalCounter(id); pn.Value() != 0 {
		t.Fatalf("the copy took the window back: %v", pn.ByRegion())
	}
}

// TestGlobalWindowsOfADelta: a delta becomes the store's windows with the
// slots of known regions alone, windows of no known region and windows over
// and done with left out, each key its own (appending to one does not
// touch the next).
func TestGlobalWindowsOfADelta(t *testing.T) {
	rs := mustParse(t, globalRules)
	now := time.UnixMilli(1_800_000_000_000)
	epoch := now.UnixMilli() / 60_000 * 60_000
	known := map[string]bool{"eu": true, "us": true}
	a, b, c := CounterKey("s", "k1"), CounterKey("s", "k2"), CounterKey("s", "k3")
	d := crdt.Delta{Origin: "us", Entries: []crdt.Entry{
		{ID: crdt.ID{Key: a, Epoch: epoch}, Slots: []crdt.Slot{{Region: "eu", P: 1}, {Region: "us", P: 2}}},
		{ID: crdt.ID{Key: b, Epoch: epoch}, Slots: []crdt.Slot{{Region: "ap", P: 3}, {Region: "eu", P: 4}, {Region: "xx", P: 5}, {Region: "us", P: 6}}},
		{ID: crdt.ID{Key: c, Epoch: epoch}, Slots: []crdt.Slot{{Region: "ap", P: 7}}},
		{ID: crdt.ID{Key: c, Epoch: epoch - 3_600_000}, Slots: []crdt.Slot{{Region: "us", P: 8}}},
	}}
	windows, expired := globalWindowsOf(rs, d, known, now)
	if expired != 1 {
		t.Errorf("expired %d, want 1 (an hour ago)", expired)
	}
	if len(windows) != 2 {
		t.Fatalf("%d windows, want 2: %+v", len(windows), windows)
	}
	want := []struct {
		key   string
		slots []crdt.Slot
	}{
		{a, []crdt.Slot{{Region: "eu", P: 1}, {Region: "us", P: 2}}},
		{b, []crdt.Slot{{Region: "eu", P: 4}, {Region: "us", P: 6}}},
	}
	for i, w := range want {
		if string(windows[i].Key) != w.key || windows[i].StartMillis != epoch || !slices.Equal(windows[i].Slots, w.slots) {
			t.Errorf("window %d: %s@%d %v, want %s@%d %v", i, windows[i].Key, windows[i].StartMillis, windows[i].Slots, w.key, epoch, w.slots)
		}
		if windows[i].TTL <= 0 {
			t.Errorf("window %d: TTL %v, want it kept", i, windows[i].TTL)
		}
	}
	_ = append(windows[0].Key, "xxxx"...)
	if string(windows[1].Key) != b {
		t.Errorf("appending to the first key changed the second: %s", windows[1].Key)
	}
	if d.Entries[1].Slots[0].Region != "ap" {
		t.Error("the delta's slots were changed")
	}
}

// TestWindowsAheadOfTimeAreRefused: a delta's window that starts more than
// MaxAhead after the engine's clock is refused and counted as ahead: not
// in the copy, not in the store (whose keys it would keep for decades);
// the rest of the delta is taken.
func TestWindowsAheadOfTimeAreRefused(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules))
	key := CounterKey("g-strict", "s_1")
	now := clock.Now().UnixMilli()
	later := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	rep, err := e.MergeRemote(t.Context(), crdt.Delta{Origin: "us", To: 2, Entries: []crdt.Entry{
		{ID: crdt.ID{Key: key, Epoch: now / 60_000 * 60_000}, Slots: []crdt.Slot{{Region: "us", P: 5}}},
		{ID: crdt.ID{Key: key, Epoch: later}, Slots: []crdt.Slot{{Region: "us", P: 7}}},
	}})
	if err != nil || rep.Applied != 1 || rep.Ahead != 1 {
		t.Fatalf("merge: %+v %v; want one slot applied, one ahead", rep, err)
	}
	if got := e.GlobalCounter(crdt.ID{Key: key, Epoch: later}).Value(); got != 0 {
		t.Errorf("the copy holds %d of the window of 2100", got)
	}
	slots, err := e.store.(GlobalStore).ReadGlobal(t.Context(), []byte(key), later)
	if err != nil || len(slots) != 0 {
		t.Errorf("the store holds %v of the window of 2100 (%v)", slots, err)
	}
}

// TestKeysOfUnknownRulesAreRefused: a delta's counters of no global rule
// in force (an unknown rule, a local one) are refused and counted; the
// copy and the store hold none of them, and the rest merges.
func TestKeysOfUnknownRulesAreRefused(t *testing.T) {
	clock := newVirtualClock()
	e := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, globalRules+
		"  - { id: local, match: { api_key: \"l_*\" }, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m }\n"))
	epoch := clock.Now().UnixMilli() / 60_000 * 60_000
	known, unknown, local := CounterKey("g-strict", "s_1"), CounterKey("nope", "x"), CounterKey("local", "l_1")
	rep, err := e.MergeRemote(t.Context(), crdt.Delta{Origin: "us", To: 3, Entries: []crdt.Entry{
		{ID: crdt.ID{Key: unknown, Epoch: epoch}, Slots: []crdt.Slot{{Region: "us", P: 9}}},
		{ID: crdt.ID{Key: known, Epoch: epoch}, Slots: []crdt.Slot{{Region: "us", P: 5}}},
		{ID: crdt.ID{Key: local, Epoch: epoch}, Slots: []crdt.Slot{{Region: "us", P: 3}}},
	}})
	if err != nil || rep.Applied != 1 || rep.UnknownRule != 2 || rep.Rejected() != 2 {
		t.Fatalf("merge: %+v %v; want one slot applied, two of unknown rules", rep, err)
	}
	for _, key := range []string{unknown, local} {
		if got := e.GlobalCounter(crdt.ID{Key: key, Epoch: epoch}).Value(); got != 0 {
			t.Errorf("the copy holds %d of %s", got, key)
		}
		if slots, err := e.store.(GlobalStore).ReadGlobal(t.Context(), []byte(key), epoch); err != nil || len(slots) != 0 {
			t.Errorf("the store holds %v of %s (%v)", slots, key, err)
		}
	}
	if got := e.GlobalCounter(crdt.ID{Key: known, Epoch: epoch}).Value(); got != 5 {
		t.Errorf("the copy holds %d of %s, want 5", got, known)
	}
}

// TestOverflowCounterKeepsItsWindow: the counter that a global rule's keys
// beyond max_keys share (on_key_overflow: fold) is a counter of the rule:
// its window is kept as long as the rule's, and gossip carries it. It was
// read as a counter of no rule, kept two minutes from its window's start;
// with the copy the only place an engine on its own memory counts, an hour
// window admitted its limit again every few minutes.
func TestOverflowCounterKeepsItsWindow(t *testing.T) {
	clock := newVirtualClock()
	rules := mustParse(t, `
rules:
  - { id: g, match: { endpoint: /g }, by: [api_key], algorithm: fixed_window, limit: 5, window: 1h, scope: global, max_keys: 1, on_key_overflow: fold }
`)
	e := New(Config{Clock: clock.Now}, rules)
	mustCheck(t, e, Request{APIKey: "a", Endpoint: "/g"})
	admitted := 0
	for round := range 3 {
		for i := range 10 {
			if d := mustCheck(t, e, Request{APIKey: fmt.Sprintf("k%d-%d", round, i), Endpoint: "/g"}); d.Allowed {
				admitted++
			}
		}
		clock.AdvanceBy(3 * time.Minute)
		if err := e.Maintain(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if admitted != 5 {
		t.Fatalf("the overflow counter admitted %d in one hour window, want its limit, 5", admitted)
	}
	key := string(overflowKey(nil, "g"))
	if r, limit, ok := rules.GlobalLimitOf(key); !ok || r.ID != "g" || limit != 5 || !rules.OfGlobalRules(key) {
		t.Fatalf("GlobalLimitOf(%q) = %v, %d, %v", key, r, limit, ok)
	}
	if rules.OfGlobalRules("gq:{g:x}:overflow") || rules.OfGlobalRules("gq:{h}:overflow") {
		t.Fatal("a key that is no overflow counter of a global rule passes for one")
	}
}

// A global rule with count_over_limit counts every report in the region's
// slot, past its share as debt: the region denies the tenant's checks
// while its slot is past its allowance, a check that counts nothing
// counts nothing, and what it counted reaches the other regions (their
// view of the tenant's global use) as any admitted cost does.
func TestGlobalReportsPastTheShareAreCounted(t *testing.T) {
	const rules = `
rules:
  - { id: tokens, by: [api_key], scope: global, algorithm: fixed_window, limit: 1000, window: 1h, count_over_limit: true }
`
	for _, kind := range []string{"memory", "redis", "own"} {
		t.Run(kind, func(t *testing.T) {
			clock := newVirtualClock()
			regions := []string{"eu", "us"}
			cfg := Config{Region: "eu", Clock: clock.Now, Timeout: slowOK, Global: GlobalConfig{Regions: regions, Lag: noLag}}
			switch kind {
			case "redis":
				rs, _ := newTestRedisStore(t, RedisOptions{Region: "eu", Timeout: slowOK})
				rs.testNow = clock.micros
				cfg.Store = rs
			case "memory":
				m := NewMemoryStore(clock.Now)
				m.SetRegion("eu")
				cfg.Store = m
			}
			eu := New(cfg, mustParse(t, rules))
			check := func(cost int64, nothing bool) LimitStatus {
				t.Helper()
				d := mustCheck(t, eu, Request{APIKey: "sk_1", Cost: cost, CountNothing: nothing})
				if len(d.Limits) != 1 {
					t.Fatalf("limits %+v", d.Limits)
				}
				return d.Limits[0]
			}
			used := func() int64 {
				t.Helper()
				u, err := eu.Usage(t.Context(), "tokens", &Request{APIKey: "sk_1"})
				if err != nil {
					t.Fatal(err)
				}
				return u.GlobalUsed
			}
			// Before a lease eu holds its floor: 5% of 1000.
			if l := check(30, false); !l.Allowed || l.Charged != 30 {
				t.Fatalf("30 of a floor of 50: %+v", l)
			}
			if l := check(40, false); l.Allowed || l.Charged != 40 {
				t.Fatalf("40 more, past the floor: %+v, want denied and charged 40", l)
			}
			if l := check(0, true); l.Allowed || l.Charged != 0 {
				t.Fatalf("a check counting nothing past the share: %+v", l)
			}
			if l := check(1, false); l.Allowed || l.Charged != 1 {
				t.Fatalf("a check past the share: %+v, want denied and counted", l)
			}
			if got := used(); got != 71 {
				t.Fatalf("eu's use of the tenant: %d, want 71 (30 + 40 + 1)", got)
			}
			var d crdt.Delta
			eu.global.usage.with(func(c *crdt.Counters) { d = c.OwnDeltaSince(0) })
			if len(d.Entries) != 1 || len(d.Entries[0].Slots) != 1 || d.Entries[0].Slots[0].P != 71 {
				t.Fatalf("what eu gossips: %+v, want its slot at 71", d)
			}
		})
	}
}

// TestGlobalStoresSettleAlike holds the two stores' settlements of global
// limits alike: estimates reserved as checks, committed under, at and over
// them, released, settled twice, after their window or their end, of
// limits changed since, with other regions' slots merged in between; the
// same answers, and the same region's slot after.
func TestGlobalStoresSettleAlike(t *testing.T) {
	rs, clock := newVirtualRedisStore(t, RedisOptions{Region: "eu", Timeout: 5 * time.Second})
	ctx := t.Context()
	run := 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		mem := NewMemoryStore(clock.Now)
		mem.SetRegion("eu")
		p := Params{
			Algorithm: rapid.SampledFrom([]Algorithm{FixedWindow, SlidingWindowCounter, Concurrency}).Draw(t, "algorithm"),
			Limit:     rapid.Int64Range(1, 100).Draw(t, "limit"),
			Window:    rapid.SampledFrom([]int64{1e6, 7e6, 60e6}).Draw(t, "window"),
		}
		key := []byte(fmt.Sprintf("gq:{gs%d:a}", run))
		type held struct {
			mark  string
			until int64
			op    SettleOp
		}
		var made []held
		for step := range rapid.IntRange(1, 30).Draw(t, "steps") {
			clock.Advance(rapid.SampledFrom([]int64{0, 1, 999, 250e3, 1e6, 7e6, 61e6}).Draw(t, "advance"))
			allowance := rapid.Int64Range(0, p.Limit).Draw(t, "allowance")
			ceiling := int64(-1)
			if rapid.Bool().Draw(t, "elastic") {
				ceiling = rapid.Int64Range(0, p.Limit).Draw(t, "ceiling")
			}
			switch action := rapid.IntRange(0, 3).Draw(t, "action"); {
			case action == 0:
				r := rapid.SampledFrom([]string{"us", "ap"}).Draw(t, "region")
				start := clock.micros() / p.Window * p.Window
				w := GlobalWindow{Key: key, StartMillis: start / 1000, TTL: time.Hour,
					Slots: []crdt.Slot{{Region: r, P: rapid.Uint64Range(0, 30).Draw(t, "p")}}}
				if _, err := mem.MergeGlobal(ctx, []GlobalWindow{w}); err != nil {
					t.Fatal(err)
				}
				if _, err := rs.MergeGlobal(ctx, []GlobalWindow{w}); err != nil {
					t.Fatal(err)
				}
			case action == 1 || len(made) == 0:
				cost := rapid.Int64Range(1, 5).Draw(t, "cost")
				if p.Algorithm == Concurrency {
					cost = 1 // a slot
				}
				ops := []Op{{Key: key, Params: p, Cost: cost, Global: true, Allowance: allowance, Ceiling: ceiling}}
				mres, rres := make([]Result, 1), make([]Result, 1)
				mnow, err1 := mem.Apply(ctx, ops, mres)
				_, err2 := rs.Apply(ctx, ops, rres)
				if err1 != nil || err2 != nil || mres[0] != rres[0] {
					t.Fatalf("reserve: memory %+v (%v), redis %+v (%v)", mres[0], err1, rres[0], err2)
				}
				if mres[0].Allowed {
					made = append(made, held{mark: fmt.Sprintf("g%d-%d", run, step), until: mnow + rapid.SampledFrom([]int64{1e6, 5e6, 60e6}).Draw(t, "ttl"),
						op: SettleOp{Key: key, Params: p, Estimate: mres[0].Taken, At: mnow, Global: true}})
					if p.Algorithm == Concurrency { // a slot's number in its window (sealSlots)
						made[len(made)-1].op.Estimate = int64(mres[0].OwnP)
					}
				}
			default:
				h := made[rapid.IntRange(0, len(made)-1).Draw(t, "which")]
				op := h.op
				op.Allowance, op.Ceiling, op.Stale = allowance, ceiling, rapid.IntRange(0, 5).Draw(t, "stale") == 0
				actual := rapid.SampledFrom([]int64{settleExpired, -1, 0, 1, op.Estimate - 1, op.Estimate, op.Estimate + 1, 3 * op.Estimate}).Draw(t, "actual")
				mout, rout := make([]Settlement, 1), make([]Settlement, 1)
				_, err1 := mem.Settle(ctx, []SettleOp{op}, h.mark, h.until, actual, mout)
				_, err2 := rs.Settle(ctx, []SettleOp{op}, h.mark, h.until, actual, rout)
				if err1 != nil || err2 != nil || mout[0] != rout[0] {
					t.Fatalf("settle %d of %+v: memory %+v (%v), redis %+v (%v)", actual, op, mout[0], err1, rout[0], err2)
				}
			}
			start := clock.micros() / p.Window * p.Window / 1000
			for _, s := range []int64{start, start - p.Window/1000} {
				ms, _ := mem.ReadGlobal(ctx, key, s)
				rsl, err := rs.ReadGlobal(ctx, key, s)
				if err != nil || !slices.Equal(ms, rsl) {
					t.Fatalf("window %d: memory %v, redis %v (%v)", s, ms, rsl, err)
				}
			}
		}
	})
}
