package regional

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
)

// TestConcurrencyLimits follows a concurrency limit of 3 in memory and on
// Redis: three requests in flight, the fourth denied (briefly: a slot may
// be freed any moment), a release that frees one, the same release again
// changing nothing, a commit that frees one whatever it charges, and
// slots never released freeing themselves at their ttl; a check that
// counts nothing takes no slot (and, as for every limit, is denied only
// past the limit, not at it), and the other limits a request meets are
// counted as usual.
func TestConcurrencyLimits(t *testing.T) {
	ctx := t.Context()
	rules := mustParse(t, `
rules:
  - { id: streams, by: [api_key], algorithm: concurrency, limit: 3, ttl: 30s }
  - { id: calls, by: [api_key], algorithm: fixed_window, limit: 100, window: 1h }
`)
	rs, clock := newVirtualRedisStore(t, RedisOptions{})
	for _, s := range []struct {
		name  string
		store Store
	}{{"memory", NewMemoryStore(clock.Now)}, {"redis", rs}} {
		t.Run(s.name, func(t *testing.T) {
			e := New(Config{Region: "us", Replica: "us-1", Store: s.store, Clock: clock.Now, Timeout: time.Second}, rules)
			key := "k-" + s.name
			var d Decision
			check := func(what string, allowed bool) Reserved {
				t.Helper()
				if err := e.Check(ctx, &Request{APIKey: key}, &d); err != nil || d.Allowed != allowed {
					t.Fatalf("%s: %+v (%v), want allowed %v", what, d, err, allowed)
				}
				if allowed != (d.Held.ID != "") {
					t.Fatalf("%s: held %+v", what, d.Held)
				}
				return d.Held
			}
			var held []Reserved
			for i := range 3 {
				held = append(held, check("a request in flight", true))
				if l := d.Limits[0]; l.Rule.ID != "streams" || l.Remaining != int64(2-i) || l.Limit != 3 {
					t.Fatalf("request %d: %+v", i+1, d.Limits)
				}
			}
			if !held[0].Expires.Equal(clock.Now().Add(30 * time.Second)) {
				t.Fatalf("slots end at %v, want 30 s from now", held[0].Expires)
			}
			check("a fourth in flight", false)
			if d.Code != CodeOverLimit || d.Limits[0].Rule.ID != "streams" || d.Limits[0].RetryAfter != slotRetry {
				t.Fatalf("a fourth in flight: %+v, want over the concurrency limit, retry in %v", d, slotRetry)
			}
			// Full is not over: a check that counts nothing goes ahead, and
			// says none is left.
			if err := e.Check(ctx, &Request{APIKey: key, CountNothing: true}, &d); err != nil || !d.Allowed || d.Held.ID != "" || d.Limits[0].Remaining != 0 {
				t.Fatalf("a check that counts nothing, 3 in flight: %+v (%v)", d, err)
			}
			// A release frees a slot; the same release again changes nothing.
			for i := range 2 {
				st, err := e.Settle(ctx, held[0].ID, -1)
				if err != nil || st.Again != (i == 1) || st.Charged != 0 || st.Limits[0].Remaining != 1 {
					t.Fatalf("release %d: %+v (%v), want one slot free", i+1, st, err)
				}
			}
			held[0] = check("in flight after a release", true)
			check("a fourth, again", false)
			// A commit frees its slot too, whatever it charges.
			if st, err := e.Settle(ctx, held[1].ID, 730); err != nil || st.Charged != 0 || st.Limits[0].Remaining != 1 {
				t.Fatalf("a commit: %+v (%v)", st, err)
			}
			if err := e.Check(ctx, &Request{APIKey: key, CountNothing: true}, &d); err != nil || !d.Allowed || d.Held.ID != "" || d.Limits[0].Remaining != 1 {
				t.Fatalf("a check that counts nothing, 2 in flight: %+v (%v)", d, err)
			}
			check("in flight after a commit", true)
			// Slots never released free themselves at their ttl; their ids
			// are then unknown.
			clock.AdvanceBy(30*time.Second + time.Millisecond) // slots of one µs go a µs apart
			held[2] = check("in flight once the others' ttl has passed", true)
			if _, err := e.Settle(ctx, held[0].ID, -1); !errors.Is(err, ErrReservationNotFound) {
				t.Fatalf("a release past the slot's ttl: %v, want ErrReservationNotFound", err)
			}
			for rule, want := range map[string]int64{"streams": 2, "calls": 94} {
				if l, err := e.Inspect(ctx, rule, &Request{APIKey: key}); err != nil || l.Remaining != want {
					t.Fatalf("at the end, %s: %+v (%v), want %d left", rule, l, err, want)
				}
			}
		})
	}
}

// TestConcurrencyRules holds what a concurrency rule may say.
func TestConcurrencyRules(t *testing.T) {
	rs := mustParse(t, `
rules:
  - { id: s, by: [api_key], algorithm: concurrency, limit: 5 }
  - { id: t, by: [api_key], algorithm: concurrency, limit: 5, ttl: 250ms, tiers: { pro: 50 } }
`)
	if p := rs.Rule("s").Base; p != (Params{Algorithm: Concurrency, Limit: 5, Window: DefaultSlotTTL.Microseconds()}) {
		t.Fatalf("default ttl: %+v", p)
	}
	if p := rs.Rule("t").Base; p.Window != 250e3 {
		t.Fatalf("ttl 250ms: %+v", p)
	}
	// A global one is strict, and admits nothing without its store.
	g := mustParse(t, "rules:\n  - { id: g, algorithm: concurrency, limit: 5, scope: global, ttl: 30s }\n").Rule("g")
	if g.Scope != ScopeGlobal || g.Mode != ModeStrict || g.Fallback != FailClosed || g.Base.Window != 30e6 {
		t.Fatalf("a global concurrency limit: %+v", g)
	}
	for field, rule := range map[string]string{
		"ttl":              "{ id: x, algorithm: concurrency, limit: 5, ttl: 25h }",
		"limit":            "{ id: x, algorithm: concurrency, limit: 100001 }",
		"window":           "{ id: x, algorithm: concurrency, limit: 5, window: 1m }",
		"cost":             "{ id: x, algorithm: concurrency, limit: 5, cost: 2 }",
		"count_over_limit": "{ id: x, algorithm: concurrency, limit: 5, count_over_limit: true }",
		"mode":             "{ id: x, algorithm: concurrency, limit: 5, scope: global, mode: elastic }",
		"carry_debt":       "{ id: x, algorithm: concurrency, limit: 5, scope: global, carry_debt: true }",
		"fallback":         "{ id: x, algorithm: concurrency, limit: 5, scope: global, fallback: local_only }",
		"ttl ":             "{ id: x, algorithm: concurrency, limit: 5, scope: global, ttl: 500ms }",
		"batch":            "{ id: x, by: [api_key], algorithm: concurrency, limit: 5, batch: 2 }",
		"penalty":          "{ id: x, algorithm: concurrency, limit: 5, penalty: { base: 1s, max: 1m } }",
		"on_expiry":        "{ id: x, algorithm: concurrency, limit: 5, on_expiry: refund }",
	} {
		_, err := Parse("", []byte("rules:\n  - "+rule+"\n"))
		var re *RuleError
		if !errors.As(err, &re) || re.Field != strings.TrimSpace(field) {
			t.Errorf("%s: %v, want an error naming %s", rule, err, field)
		}
	}
}

// eachStore runs a test of an engine on a store, in memory and on a
// redis-server, both at a virtual clock.
func eachStore(t *testing.T, yaml string, test func(t *testing.T, e *Engine, clock *virtualClock)) {
	rs, clock := newVirtualRedisStore(t, RedisOptions{})
	rules := mustParse(t, yaml)
	for _, s := range []struct {
		name  string
		store Store
	}{{"memory", NewMemoryStore(clock.Now)}, {"redis", rs}} {
		t.Run(s.name, func(t *testing.T) {
			rs.Client().FlushDB(t.Context())
			test(t, New(Config{Region: "us", Replica: "us-1", Store: s.store, Clock: clock.Now, Timeout: slowOK}, rules), clock)
		})
	}
}

// settlementsKept is how many settlements each counter of a reservation
// keeps of reservations that end in its minute, by rule.
func settlementsKept(t *testing.T, e *Engine, id string) map[string]int {
	t.Helper()
	r, err := openReservation(id)
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]int{}
	for _, op := range r.ops {
		rule, _, _, _ := parseKey(string(op.Key))
		k := settledKey(string(op.Key), r.until)
		switch st := e.settleStore().(type) {
		case *RedisStore:
			n, err := st.Client().HLen(t.Context(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			kept[rule] = int(n)
		case *MemoryStore:
			sh := &st.shards[st.shard(op.Key)]
			sh.mu.Lock()
			if mk := sh.settled[k]; mk != nil {
				kept[rule] = len(mk.charged)
			}
			sh.mu.Unlock()
		default:
			t.Fatalf("store %T", st)
		}
	}
	return kept
}

// Slots taken in the same microsecond are each their own: a release frees
// its own, once, however often it is sent.
func TestSlotsOfOneMicrosecond(t *testing.T) {
	eachStore(t, `
rules:
  - { id: streams, by: [api_key], algorithm: concurrency, limit: 3, ttl: 1m }
`, func(t *testing.T, e *Engine, _ *virtualClock) {
		ctx := t.Context()
		var d Decision
		var ids []string
		for range 3 {
			if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil || !d.Allowed {
				t.Fatalf("%+v (%v)", d, err)
			}
			ids = append(ids, d.Held.ID)
		}
		for i := range 3 {
			st, err := e.Settle(ctx, ids[0], -1)
			if err != nil || st.Again != (i > 0) || st.Limits[0].Remaining != 1 {
				t.Fatalf("release %d of the first of three taken at once: %+v (%v), want one slot free", i+1, st, err)
			}
		}
		if st, err := e.Settle(ctx, ids[2], -1); err != nil || st.Again || st.Limits[0].Remaining != 2 {
			t.Fatalf("release of the third: %+v (%v)", st, err)
		}
	})
}

// Slots are freed however many were: a slot keeps no settlement, so a
// counter's releases are never capped as reservations' settlements are.
func TestSlotsKeepNoSettlement(t *testing.T) {
	rs, clock := newVirtualRedisStore(t, RedisOptions{})
	mem := NewMemoryStore(clock.Now)
	rules := mustParse(t, `
rules:
  - { id: streams, by: [api_key], algorithm: concurrency, limit: 1, ttl: 5m }
`)
	for name, store := range map[string]Store{"memory": mem, "redis": rs} {
		e := New(Config{Region: "us", Replica: "us-1", Store: store, Clock: clock.Now, Timeout: slowOK}, rules)
		var d Decision
		for i := range 200 {
			clock.Advance(1000) // a request a millisecond, each over at once
			if err := e.Check(t.Context(), &Request{APIKey: "k"}, &d); err != nil || !d.Allowed {
				t.Fatalf("%s: request %d, nothing in flight: %+v (%v)", name, i+1, d, err)
			}
			if st, err := e.Settle(t.Context(), d.Held.ID, -1); err != nil || st.Again {
				t.Fatalf("%s: release %d: %+v (%v)", name, i+1, st, err)
			}
		}
	}
	if keys, err := rs.Client().Keys(t.Context(), "*:settled:*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("redis keeps settlements of slots: %v (%v)", keys, err)
	}
	for i := range mem.shards {
		if n := len(mem.shards[i].settled); n != 0 {
			t.Fatalf("memory keeps %d settlements of slots", n)
		}
	}
}

// Rules that change while slots are held: a limit raised frees them all
// the same; a rule that was a sliding window log starts afresh as a
// concurrency limit, alike in both stores.
func TestSlotsThroughRuleChanges(t *testing.T) {
	eachStore(t, `
rules:
  - { id: streams, by: [api_key], algorithm: concurrency, limit: 3, ttl: 10m }
  - { id: log, by: [api_key], algorithm: sliding_window_log, limit: 5, window: 1h }
`, func(t *testing.T, e *Engine, clock *virtualClock) {
		ctx := t.Context()
		var d Decision
		var ids []string
		for range 3 {
			e.Check(ctx, &Request{APIKey: "k"}, &d)
			ids = append(ids, d.Held.ID)
		}
		e.SetRules(mustParse(t, `
rules:
  - { id: streams, by: [api_key], algorithm: concurrency, limit: 5, ttl: 5m }
  - { id: log, by: [api_key], algorithm: concurrency, limit: 2, ttl: 1m }
`))
		for _, id := range ids {
			if st, err := e.Settle(ctx, id, -1); err != nil || st.Again {
				t.Fatalf("a release after the limit changed: %+v (%v)", st, err)
			}
		}
		admitted := map[string]int{}
		for range 10 {
			if e.Check(ctx, &Request{APIKey: "k"}, &d); d.Allowed {
				admitted["both"]++
			}
		}
		// The log's five entries are not slots: the new limit of 2 admits 2.
		if admitted["both"] != 2 {
			t.Fatalf("in flight after the change: %d, want 2 (the former log's limit)", admitted["both"])
		}
		if l, err := e.Inspect(ctx, "streams", &Request{APIKey: "k"}); err != nil || l.Remaining != 3 {
			t.Fatalf("streams after its three were released and two taken: %+v (%v)", l, err)
		}
	})
}

// A request split over Redis Cluster slots, each decided at its own
// clock: a release frees the slot it took, and a request another slot
// denied gives its slot back.
func TestSlotsAcrossClusterSlots(t *testing.T) {
	ctx := t.Context()
	rs, _ := newTestRedisStore(t, RedisOptions{Region: "us", Timeout: slowOK})
	rs.cluster = true // a script a slot, on one server (as TestAbandonedSplitCallsGiveBack)
	if keySlot([]byte("gq:{streams:k}")) == keySlot([]byte("gq:{calls:k}")) {
		t.Fatal("the two counters share a slot: the test splits nothing")
	}
	e := New(Config{Region: "us", Replica: "us-1", Store: rs, Timeout: slowOK}, mustParse(t, `
rules:
  - { id: streams, by: [api_key], algorithm: concurrency, limit: 1, ttl: 1m }
  - { id: calls, by: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
`))
	free := func() int64 {
		l, err := e.Inspect(ctx, "streams", &Request{APIKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		return l.Remaining
	}
	var d Decision
	if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil || !d.Allowed || d.Held.ID == "" {
		t.Fatalf("the first: %+v (%v)", d, err)
	}
	if st, err := e.Settle(ctx, d.Held.ID, -1); err != nil || st.Again || free() != 1 {
		t.Fatalf("its release: %+v (%v), %d free", st, err, free())
	}
	if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil || !d.Allowed {
		t.Fatalf("the second: %+v (%v)", d, err)
	}
	e.Settle(ctx, d.Held.ID, -1)
	// calls has had its 2: denied there, the slot taken on the other
	// Cluster slot is given back (after the answer).
	for range 3 {
		if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil || d.Allowed {
			t.Fatalf("past calls' limit: %+v (%v)", d, err)
		}
	}
	harness.WaitFor(t, 5*time.Second, "the denied requests' slots given back", func() bool { return free() == 1 })
}

// Reservations that end unsettled: charged their estimate, or refunded
// where the rule says on_expiry: refund — once, at the first maintenance
// after their end, not after a commit, and not when found too late.
func TestReservationsEndingUnsettled(t *testing.T) {
	eachStore(t, `
rules:
  - { id: refunded, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h, on_expiry: refund }
  - { id: charged, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`, func(t *testing.T, e *Engine, clock *virtualClock) {
		ctx := t.Context()
		left := func() (int64, int64) {
			r, err1 := e.Inspect(ctx, "refunded", &Request{APIKey: "k"})
			c, err2 := e.Inspect(ctx, "charged", &Request{APIKey: "k"})
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			return r.Remaining, c.Remaining
		}
		var d Decision
		reserve := func(cost int64) string {
			t.Helper()
			res, err := e.Reserve(ctx, &Request{APIKey: "k", Cost: cost}, time.Minute, &d)
			if err != nil || res.ID == "" {
				t.Fatalf("reserve %d: %+v (%v)", cost, res, err)
			}
			return res.ID
		}
		maintain := func() {
			t.Helper()
			if err := e.Maintain(ctx); err != nil {
				t.Fatal(err)
			}
		}
		abandoned := reserve(100)
		committed := reserve(100)
		if _, err := e.Settle(ctx, committed, 30); err != nil {
			t.Fatal(err)
		}
		maintain() // before their end: nothing
		if r, c := left(); r != 870 || c != 870 {
			t.Fatalf("100 held, 30 committed: %d and %d left, want 870", r, c)
		}
		// An expiry a store sees before the end (its clock behind the
		// index's) does nothing yet, and is kept for later.
		if refunded, again, err := e.refundOne(ctx, abandoned); refunded || !again || err != nil {
			t.Fatalf("an expiry before the end: refunded %v, again %v (%v)", refunded, again, err)
		}
		if r, _ := left(); r != 870 {
			t.Fatalf("after an expiry before the end: %d left, want 870", r)
		}
		clock.AdvanceBy(time.Minute + time.Second)
		maintain()
		maintain() // once
		if r, c := left(); r != 970 || c != 870 {
			t.Fatalf("after the end, refunded %d left (want 970), charged %d (want 870)", r, c)
		}
		// Of the refund, only the limit that refunds keeps a settlement
		// (beside the commit's, on both).
		if kept := settlementsKept(t, e, abandoned); kept["refunded"] != 2 || kept["charged"] != 1 {
			t.Fatalf("settlements kept after the commit and the refund: %v, want refunded 2, charged 1", kept)
		}
		if _, err := e.Settle(ctx, abandoned, -1); !errors.Is(err, ErrReservationNotFound) {
			t.Fatalf("a release after the end: %v, want not found", err)
		}
		// Found too late (its settlements no longer kept): charged.
		reserve(100)
		clock.AdvanceBy(time.Minute + expiryLate + time.Second)
		maintain()
		if r, _ := left(); r != 870 || e.Stats().ReservationsRefunded.Load() != 1 || e.Stats().ReservationsExpiredLate.Load() != 1 {
			t.Fatalf("a reservation found too late: %d left, want 870 (refunded %d, late %d)", r, e.Stats().ReservationsRefunded.Load(), e.Stats().ReservationsExpiredLate.Load())
		}
		// The rules stop refunding: what the index kept is dropped all the
		// same, not kept for ever.
		reserve(100)
		e.SetRules(mustParse(t, `
rules:
  - { id: refunded, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`))
		clock.AdvanceBy(2 * time.Minute)
		maintain()
		if ids, err := e.settleStore().(expiryIndex).dueExpiries(ctx, 10); err != nil || len(ids) != 0 {
			t.Fatalf("the index once no rule refunds: %d ids (%v)", len(ids), err)
		}
	})
}

// eachGlobalEngine runs a test of an engine of region us (of us, eu and
// ap) under rules, on a store in memory and on a redis-server, both at
// one virtual clock.
func eachGlobalEngine(t *testing.T, rules string, test func(t *testing.T, name string, e *Engine, clock *virtualClock)) {
	rs, clock := newVirtualRedisStore(t, RedisOptions{Region: "us"})
	global := GlobalConfig{Regions: []string{"us", "eu", "ap"}}
	for _, s := range []struct {
		name string
		cfg  Config
	}{
		{"memory", Config{Region: "us", Replica: "us-1", Clock: clock.Now, Global: global}},
		{"redis", Config{Region: "us", Replica: "us-1", Store: rs, Clock: clock.Now, Timeout: slowOK, Global: global}},
	} {
		t.Run(s.name, func(t *testing.T) { test(t, s.name, New(s.cfg, mustParse(t, rules)), clock) })
	}
}

// TestGlobalConcurrency: a global concurrency limit, on a region's share
// of it (its floor: no budget yet), in memory and on a redis-server. Its
// slots are counted in windows of its ttl: a slot counts in the window it
// was taken in and the next, so it frees itself between one ttl and two
// after it was taken; a release frees it at once while it counts, once,
// into the window it was taken in (the region's slot of which the gossip
// carries), and after that is not found.
func TestGlobalConcurrency(t *testing.T) {
	const rules = `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: concurrency, limit: 90, ttl: 10s }
`
	eachGlobalEngine(t, rules, func(t *testing.T, name string, e *Engine, clock *virtualClock) {
		ctx := t.Context()
		frac, _ := e.GlobalAllowance("g")
		n := int(math.Floor(frac*90 + 1e-9))
		if n < 2 {
			t.Fatalf("the region's share: %v of 90", frac)
		}
		take := func() Decision {
			t.Helper()
			var d Decision
			if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (d.Held.ID != "") {
				t.Fatalf("allowed %v with reservation %q", d.Allowed, d.Held.ID)
			}
			return d
		}
		fill := func(what string, want int) []string {
			t.Helper()
			var ids []string
			for range want {
				d := take()
				if !d.Allowed {
					t.Fatalf("%s: %d in flight, want %d", what, len(ids), want)
				}
				ids = append(ids, d.Held.ID)
			}
			if d := take(); d.Allowed {
				t.Fatalf("%s: %d in flight and one more, past the share of %d", what, want, want)
			}
			return ids
		}
		release := func(id string) Settled {
			t.Helper()
			st, err := e.Settle(ctx, id, -1)
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		// Window 1: the share, then one released (once) and taken again.
		w1 := fill("window 1", n)
		if st := release(w1[0]); st.Again || st.Charged != 0 {
			t.Fatalf("a release: %+v", st)
		}
		if st := release(w1[0]); !st.Again {
			t.Fatalf("the same release again: %+v", st)
		}
		w1[0] = fill("after a release", 1)[0]
		// Window 2: window 1's slots are in flight still; one
		// released goes back into window 1.
		clock.AdvanceBy(10 * time.Second)
		fill("window 2, window 1's held", 0)
		release(w1[1])
		if name == "redis" {
			r, _ := openReservation(w1[1])
			start := r.ops[0].At / 10e6 * 10e6
			var tl crdt.Tally
			e.global.usage.with(func(c *crdt.Counters) { tl = c.Tally(r.ops[0].Key, start/1000) })
			if tl.P != uint64(n)+1 || tl.N != 2 {
				t.Fatalf("window 1 after a release in window 2: %+v, want %d taken and both releases in the region's N", tl, n+1)
			}
		}
		w2 := fill("window 2, one released", 1)
		// Usage says what is in flight: window 1's and window 2's.
		if u, err := e.Usage(ctx, "g", &Request{APIKey: "k"}); err != nil || u.GlobalUsed != int64(n) || u.Regions[2].Region != "us" || u.Regions[2].Used != int64(n) {
			t.Fatalf("usage with %d in flight: %+v (%v)", n, u, err)
		}
		// Window 3: window 1's slots have freed themselves; a release
		// of one is not found (it has ended). Window 2's counts.
		clock.AdvanceBy(10 * time.Second)
		if _, err := e.Settle(ctx, w1[2], -1); !errors.Is(err, ErrReservationNotFound) {
			t.Fatalf("a release of a slot freed by itself: %v, want not found", err)
		}
		fill("window 3", n-1)
		release(w2[0])
		fill("window 3, window 2's released", 1)
	})
}

// A reservation that takes a global slot runs its ttl from when it was
// made, not from the start of the window its slot counts in.
func TestGlobalSlotReservations(t *testing.T) {
	const rules = `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: concurrency, limit: 90, ttl: 10m }
  - { id: tokens, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`
	eachGlobalEngine(t, rules, func(t *testing.T, name string, e *Engine, clock *virtualClock) {
		ctx := t.Context()
		// Eight minutes into a window of the slots.
		clock.Advance((10*60e6 - clock.micros()%(10*60e6)) + 8*60e6)
		var d Decision
		res, err := e.Reserve(ctx, &Request{APIKey: "k", Cost: 100}, 5*time.Minute, &d)
		if err != nil || res.ID == "" {
			t.Fatalf("reserve: %+v %+v (%v)", res, d, err)
		}
		clock.AdvanceBy(3 * time.Minute) // past the window's start + 5 min, within the ttl
		st, err := e.Settle(ctx, res.ID, 10)
		if err != nil || st.Charged != 10 {
			t.Fatalf("a commit within the reservation's ttl: %+v (%v)", st, err)
		}
	})
}

// A region reports what it has in flight of a global concurrency limit,
// for the rule and for a counter reported on its own: the window before's
// slots as well as this one's, not this window's alone.
func TestGlobalSlotsReportInFlight(t *testing.T) {
	clock := newVirtualClock()
	eu := New(Config{Region: "eu", Clock: clock.Now, Global: GlobalConfig{Regions: []string{"eu", "us"}}}, mustParse(t, `
rules:
  - { id: g-slots, match: { endpoint: /x }, by: [api_key], scope: global, algorithm: concurrency, limit: 1000, ttl: 10s }
`))
	if !eu.SetBudget(budget.Document{Rule: "g-slots", Seq: 1, Issued: clock.Now(),
		Leases: map[string]budget.LeaseDoc{"eu": {Floor: 0.05, Share: 0.15, Expires: clock.Now().Add(time.Minute)}}}) {
		t.Fatal("the document was not taken")
	}
	if got := countAllowed(t, eu, "s_acme", 250); got != 200 {
		t.Fatalf("s_acme took %d slots, want its region's 200", got)
	}
	clock.AdvanceBy(10 * time.Second) // the next window: the 200 are in flight still
	if got := countAllowed(t, eu, "s_acme", 10); got != 0 {
		t.Fatalf("s_acme took %d more slots with 200 in flight", got)
	}
	for _, r := range eu.GlobalReport() {
		if r.Rule != "g-slots" {
			continue
		}
		if math.Abs(r.Used-0.2) > 1e-9 {
			t.Errorf("the rule's report says %v used, want 0.2 in flight", r.Used)
		}
		if len(r.Counters) != 1 || r.Counters[0].Key != "s_acme" || math.Abs(r.Counters[0].Used-0.2) > 1e-9 {
			t.Errorf("counters reported: %+v, want s_acme with 0.2 in flight", r.Counters)
		}
		return
	}
	t.Fatal("no report of g-slots")
}

// A replica reports the slots its region has in flight as its store has
// them, its siblings' of the window before included, which its own copy
// may not have heard of yet.
func TestGlobalSlotsInFlightOfSiblings(t *testing.T) {
	rs, clock := newVirtualRedisStore(t, RedisOptions{Region: "us"})
	rules := mustParse(t, `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: concurrency, limit: 1000, ttl: 10s }
`)
	global := GlobalConfig{Regions: []string{"us", "eu"}}
	us1 := New(Config{Region: "us", Replica: "us-1", Store: rs, Clock: clock.Now, Timeout: slowOK, Global: global}, rules)
	us2 := New(Config{Region: "us", Replica: "us-2", Store: rs, Clock: clock.Now, Timeout: slowOK, Global: global}, rules)
	if got := countAllowed(t, us2, "k", 5); got != 5 {
		t.Fatalf("us-2 took %d slots, want 5", got)
	}
	clock.AdvanceBy(10 * time.Second) // the next window: us-2's 5 are in flight still
	if got := countAllowed(t, us1, "k", 1); got != 1 {
		t.Fatalf("us-1 took %d slots, want 1", got)
	}
	if d := us1.Demand("g"); math.Abs(d.Used-0.006) > 1e-9 {
		t.Fatalf("us-1 reports %v used, want 0.006: 6 in flight in its region", d.Used)
	}
}

// A global slot's release keeps no settlement: it takes the slot out of
// its window's slots in flight, once. So releases are not capped as
// reservations' settlements are (maxSettled a minute): a counter that
// takes and releases more than that in one window of its slots keeps
// releasing them.
func TestGlobalSlotsReleaseUncapped(t *testing.T) {
	eachGlobalEngine(t, `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: concurrency, limit: 90, ttl: 10m }
`, func(t *testing.T, _ string, e *Engine, _ *virtualClock) {
		ctx := t.Context()
		for i := range maxSettled + 50 {
			var d Decision
			if err := e.Check(ctx, &Request{APIKey: "k"}, &d); err != nil || !d.Allowed {
				t.Fatalf("take %d: %+v (%v)", i, d, err)
			}
			if st, err := e.Settle(ctx, d.Held.ID, -1); err != nil || st.Again {
				t.Fatalf("release %d: %+v (%v)", i, st, err)
			}
		}
		if u, err := e.Usage(ctx, "g", &Request{APIKey: "k"}); err != nil || u.GlobalUsed != 0 {
			t.Fatalf("after %d takes and releases: %+v (%v), want none in flight", maxSettled+50, u, err)
		}
	})
}

// A settlement refused whole (another counter of the reservation keeps as
// many settlements as it may) releases no global slot either: nothing is
// settled, and the slot stays in flight.
func TestGlobalSlotsRefusedWhole(t *testing.T) {
	eachGlobalEngine(t, `
rules:
  - { id: g, match: { endpoint: /both }, by: [api_key], scope: global, algorithm: concurrency, limit: 90, ttl: 10m }
  - { id: tokens, by: [ip], algorithm: fixed_window, limit: 1000, window: 1h }
`, func(t *testing.T, _ string, e *Engine, _ *virtualClock) {
		ctx := t.Context()
		// Fill the tokens counter's settlements of reservations ending in
		// this minute (reservations that do not meet g).
		for i := range maxSettled {
			var d Decision
			res, err := e.Reserve(ctx, &Request{IP: "10.0.0.1", Endpoint: "/fill", Cost: 1}, time.Minute, &d)
			if err != nil || res.ID == "" {
				t.Fatalf("reserve %d: %+v (%v)", i, d, err)
			}
			if _, err := e.Settle(ctx, res.ID, -1); err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
		}
		var d Decision
		res, err := e.Reserve(ctx, &Request{APIKey: "k", IP: "10.0.0.1", Endpoint: "/both", Cost: 1}, time.Minute, &d)
		if err != nil || res.ID == "" {
			t.Fatalf("reserve over both: %+v (%v)", d, err)
		}
		if _, err := e.Settle(ctx, res.ID, -1); !errors.Is(err, ErrTooManySettlements) {
			t.Fatalf("a settlement with the tokens counter full: %v, want too many settlements", err)
		}
		if u, err := e.Usage(ctx, "g", &Request{APIKey: "k", Endpoint: "/both"}); err != nil || u.GlobalUsed != 1 {
			t.Fatalf("after a refused release: %+v (%v), want its slot in flight", u, err)
		}
	})
}
