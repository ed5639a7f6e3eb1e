package regional

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// TestStoresSettleAlike holds the Redis store's settlements to the memory
// store's, to the bit: reservations of one to three limits of every
// algorithm, taken as checks, committed at, under and far over their
// estimates, released, settled twice, settled after they ended, of limits
// changed since, beside plain checks of the same counters, as time goes
// by.
func TestStoresSettleAlike(t *testing.T) {
	ctx := t.Context()
	againstMemory(t, func(t *rapid.T, rs *RedisStore, mem *MemoryStore, clock *virtualClock, run int) {
		limits := rapid.SliceOfN(genParams(), 1, 3).Draw(t, "limits")
		key := func(i int) []byte { return []byte(fmt.Sprintf("gq:{rsv%d:%d}", run, i)) }
		type held struct {
			mark  string
			until int64
			ops   []SettleOp
		}
		var made []held
		for step := range rapid.IntRange(1, 30).Draw(t, "steps") {
			clock.Advance(rapid.SampledFrom([]int64{0, 1, 999, 1e6, 5e6, 61e6}).Draw(t, "advance"))
			if action := rapid.IntRange(0, 2).Draw(t, "action"); action < 2 || len(made) == 0 {
				// A reservation, or a plain check: both a check of a cost.
				var ops []Op
				for i, p := range limits {
					if rapid.IntRange(0, 3).Draw(t, "use") > 0 {
						ops = append(ops, Op{Key: key(i), Params: p, Cost: genCost(t, p)})
					}
				}
				if len(ops) == 0 {
					continue
				}
				mres, rres := make([]Result, len(ops)), make([]Result, len(ops))
				mnow, err1 := mem.Apply(ctx, ops, mres)
				rnow, err2 := rs.Apply(ctx, ops, rres)
				if err1 != nil || err2 != nil || mnow != rnow {
					t.Fatalf("apply: memory at %d (%v), redis at %d (%v)", mnow, err1, rnow, err2)
				}
				for i := range ops {
					if mres[i] != rres[i] {
						t.Fatalf("limit %d (%v, cost %d): memory %+v, redis %+v", i, ops[i].Params, ops[i].Cost, mres[i], rres[i])
					}
				}
				if action == 0 && commits(ops, mres) {
					h := held{mark: fmt.Sprintf("r%d-%d", run, step), until: mnow + rapid.SampledFrom([]int64{1e6, 5e6, 60e6}).Draw(t, "ttl")}
					for i, op := range ops {
						at := mnow
						if op.Params.Algorithm == Concurrency {
							at = slotAt(op.Params, &mres[i])
						}
						h.ops = append(h.ops, SettleOp{Key: op.Key, Params: op.Params, Estimate: mres[i].Taken, At: at})
					}
					made = append(made, h)
				}
				continue
			}
			h := made[rapid.IntRange(0, len(made)-1).Draw(t, "which")]
			est := h.ops[0].Estimate
			actual := rapid.SampledFrom([]int64{settleExpired, -1, 0, 1, est - 1, est, est + 1, 3 * est, 100 * est}).Draw(t, "actual")
			ops := slices.Clone(h.ops)
			for i := range ops { // a limit changed since: its counter is left alone
				ops[i].Stale = rapid.IntRange(0, 5).Draw(t, "stale") == 0
			}
			mout, rout := make([]Settlement, len(ops)), make([]Settlement, len(ops))
			mnow, err1 := mem.Settle(ctx, ops, h.mark, h.until, actual, mout)
			rnow, err2 := rs.Settle(ctx, ops, h.mark, h.until, actual, rout)
			if err1 != nil || err2 != nil || mnow != rnow {
				t.Fatalf("settle: memory at %d (%v), redis at %d (%v)", mnow, err1, rnow, err2)
			}
			for i := range h.ops {
				if mout[i] != rout[i] {
					t.Fatalf("settle %d of %s on %+v: memory %+v, redis %+v", actual, h.mark, h.ops[i], mout[i], rout[i])
				}
			}
		}
	})
}

// TestSettledOnce follows one reservation through both stores: the
// difference given back once on commit, the same commit answered alike and
// counted once, a release after it changing nothing, and another commit
// once the reservation has ended (the engine refuses it before: here the
// stores' own keeping ends) counted anew.
func TestSettledOnce(t *testing.T) {
	ctx := t.Context()
	rs, clock := newVirtualRedisStore(t, RedisOptions{})
	fw := Params{Algorithm: FixedWindow, Limit: 1000, Window: 3600e6}
	for _, s := range []struct {
		name string
		st   Store
	}{{"memory", NewMemoryStore(clock.Now)}, {"redis", rs}} {
		t.Run(s.name, func(t *testing.T) {
			k := []byte("gq:{once:" + s.name + "}")
			res := make([]Result, 1)
			now, err := s.st.Apply(ctx, []Op{{Key: k, Params: fw, Cost: 500}}, res)
			if err != nil || !res[0].Allowed || res[0].Remaining != 500 {
				t.Fatalf("the estimate: %+v, %v", res[0], err)
			}
			ops := []SettleOp{{Key: k, Params: fw, Estimate: 500, At: now}}
			out := make([]Settlement, 1)
			for i := range 2 {
				if _, err := s.st.Settle(ctx, ops, "a", now+30e6, 200, out); err != nil {
					t.Fatal(err)
				}
				if out[0].Charged != 200 || out[0].Result.Remaining != 800 || out[0].Again != (i == 1) {
					t.Fatalf("commit 200 of 500, time %d: %+v", i+1, out[0])
				}
			}
			if _, err := s.st.Settle(ctx, ops, "a", now+30e6, -1, out); err != nil || !out[0].Again || out[0].Charged != 200 || out[0].Result.Remaining != 800 {
				t.Fatalf("release after commit: %+v, %v", out[0], err)
			}
			// Ended by the store's clock: refused, the estimate stays.
			if _, err := s.st.Settle(ctx, ops, "b", now, -1, out); err != nil || !out[0].Ended || out[0].Result.Remaining != 800 {
				t.Fatalf("release of a reservation that has ended: %+v, %v", out[0], err)
			}
		})
	}
}

// TestSettlementsAreCapped makes a counter keep maxSettled settlements of
// reservations ending in one minute, in both stores: the next is refused
// (Full) and changes nothing; one of reservations ending in the next
// minute is kept. A counter that admits more a minute keeps more
// (settledCap).
func TestSettlementsAreCapped(t *testing.T) {
	ctx := t.Context()
	rs, clock := newVirtualRedisStore(t, RedisOptions{})
	fw := Params{Algorithm: FixedWindow, Limit: 1000, Window: 3600e6} // admits far less than maxSettled a minute
	for _, c := range []struct {
		p    Params
		want int
	}{
		{fw, maxSettled},
		{Params{Algorithm: FixedWindow, Limit: 1_000_000, Window: 60e6}, 2_000_000},
		{Params{Algorithm: FixedWindow, Limit: 100_000, Window: 10e6}, 1_200_000},
		{Params{Algorithm: TokenBucket, Limit: 100, Rate: 1000}, 120_200},
		{Params{Algorithm: GCRA, Limit: 1 << 40, Rate: 1e9}, 1 << 40},
	} {
		if got := settledCap(c.p); got != c.want {
			t.Errorf("settledCap(%+v) = %d, want %d", c.p, got, c.want)
		}
	}
	for _, s := range []struct {
		name string
		st   Store
	}{{"memory", NewMemoryStore(clock.Now)}, {"redis", rs}} {
		t.Run(s.name, func(t *testing.T) {
			k := []byte("gq:{cap:" + s.name + "}")
			now := clock.micros()
			until := (now/60e6 + 2) * 60e6 // the end of the minute after next
			ops := []SettleOp{{Key: k, Params: fw, Estimate: 1, At: now}}
			out := make([]Settlement, 1)
			for i := range maxSettled {
				if _, err := s.st.Settle(ctx, ops, fmt.Sprint(i), until, 1, out); err != nil || out[0].Full || out[0].Again {
					t.Fatalf("settlement %d: %+v, %v", i, out[0], err)
				}
			}
			if _, err := s.st.Settle(ctx, ops, "more", until, -1, out); err != nil || !out[0].Full {
				t.Fatalf("a settlement past the cap: %+v, %v", out[0], err)
			}
			// Refused whole: another counter of the same reservation is
			// left unsettled, and settles later on its own.
			k2 := []byte("gq:{cap2:" + s.name + "}")
			if _, err := s.st.Apply(ctx, []Op{{Key: k2, Params: fw, Cost: 7}}, make([]Result, 1)); err != nil {
				t.Fatal(err)
			}
			pair, out2 := []SettleOp{{Key: k2, Params: fw, Estimate: 7, At: now}, ops[0]}, make([]Settlement, 2)
			if _, err := s.st.Settle(ctx, pair, "pair", until, -1, out2); err != nil || !out2[0].Full || !out2[1].Full {
				t.Fatalf("a reservation one of whose counters is full: %+v, %v", out2, err)
			}
			if r, err := s.st.Inspect(ctx, k2, fw); err != nil || r.Remaining != 993 {
				t.Fatalf("the other counter after the refusal: %+v, %v, want its 7 still taken", r, err)
			}
			if _, err := s.st.Settle(ctx, pair[:1], "pair", until, -1, out2[:1]); err != nil || out2[0].Full || out2[0].Again || out2[0].Result.Remaining != 1000 {
				t.Fatalf("the other counter settled alone: %+v, %v", out2[0], err)
			}
			if _, err := s.st.Settle(ctx, ops, "more", until+60e6, 1, out); err != nil || out[0].Full || out[0].Again {
				t.Fatalf("a settlement of a reservation ending the minute after: %+v, %v", out[0], err)
			}
		})
	}
}

// Reservations through the engine, on a region's Redis: a global rule
// refuses them before anything is counted; a store that cannot answer
// reserves nothing, whatever the rules' fallbacks; and an engine on its
// own memory (--dev) holds and settles them too.
func TestEngineReservations(t *testing.T) {
	ctx := t.Context()
	e, store, srv := oneReplicaRegion(t, `
rules:
  - { id: g, match: { endpoint: /global }, by: [api_key], scope: global, algorithm: fixed_window, limit: 3000, window: 1h }
  - { id: open, match: { endpoint: /open }, by: [api_key], algorithm: token_bucket, capacity: 100, refill_per_second: 0.01, fallback: fail_open }
`)
	var d Decision
	keys := func() int64 {
		n, err := store.Client().DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	res, err := e.Reserve(ctx, &Request{APIKey: "t", Endpoint: "/open", Cost: 5}, time.Minute, &d)
	if err != nil || !d.Allowed || res.ID == "" {
		t.Fatalf("a reservation: %+v %+v (%v)", res, d, err)
	}
	_ = keys
	// Any replica of the region settles it: they share the key that
	// seals it, through the store.
	other := New(Config{Region: "us", Replica: "us-2", Store: store, Timeout: 50 * time.Millisecond,
		Global: GlobalConfig{Regions: []string{"us", "eu", "ap"}}}, e.Rules())
	if s, err := other.Settle(ctx, res.ID, 8); err != nil || s.Charged != 8 || s.Limits[0].Remaining != 92 || s.Limits[0].Rule != "open" {
		t.Fatalf("commit 8 of 5 on another replica: %+v (%v)", s, err)
	}
	// A changed id is not the region's: every byte of it is sealed.
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(res.ID, "r1."))
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range []int{5, len(raw) / 2, len(raw) - 20, len(raw) - 1} {
		forged := slices.Clone(raw)
		forged[at] ^= 1
		if _, err := e.Settle(ctx, "r1."+base64.RawURLEncoding.EncodeToString(forged), -1); err == nil {
			t.Fatalf("an id with byte %d changed was settled", at)
		}
	}
	stallRedis(t, srv.Addr(), 300*time.Millisecond)
	res, err = e.Reserve(ctx, &Request{APIKey: "t", Endpoint: "/open", Cost: 5}, time.Minute, &d)
	if err != nil || d.Allowed || d.Code != CodeUnavailable || res.ID != "" {
		t.Fatalf("a reservation while the store stalls (the rule fails open): %+v %+v (%v), want unavailable", res, d, err)
	}

	mem := New(Config{Region: "dev"}, mustParse(t, `
rules:
  - { id: open, by: [api_key], algorithm: fixed_window, limit: 1000000, window: 1h }
`))
	res, err = mem.Reserve(ctx, &Request{APIKey: "t", Cost: 5}, time.Minute, &d)
	if err != nil || res.ID == "" {
		t.Fatalf("a reservation in memory: %+v (%v)", res, err)
	}
	if s, err := mem.Settle(ctx, res.ID, -1); err != nil || s.Charged != 0 || s.Limits[0].Remaining != 1_000_000 {
		t.Fatalf("release in memory: %+v (%v)", s, err)
	}
	if _, err := mem.Settle(ctx, strings.Replace(res.ID, "r1.", "r1.x", 1), -1); err == nil {
		t.Fatal("a mangled id was settled")
	}
	// Rules changed since the reservation (another algorithm): its
	// settlement leaves the counter alone.
	res, err = mem.Reserve(ctx, &Request{APIKey: "r", Cost: 5}, time.Minute, &d)
	if err != nil || res.ID == "" {
		t.Fatalf("a reservation: %+v (%v)", res, err)
	}
	mem.SetRules(mustParse(t, `
rules:
  - { id: open, by: [api_key], capacity: 100, refill_per_second: 0.01 }
`))
	if err := mem.Check(ctx, &Request{APIKey: "r", Cost: 90}, &d); err != nil || !d.Allowed {
		t.Fatalf("a check under the new rules: %+v (%v)", d, err)
	}
	if s, err := mem.Settle(ctx, res.ID, -1); err != nil || len(s.Limits) != 1 || s.Limits[0].Limit != 1_000_000 {
		t.Fatalf("release of a reservation of a limit since changed: %+v (%v), want the limit it was made under", s, err)
	}
	if err := mem.Check(ctx, &Request{APIKey: "r", Cost: 10}, &d); err != nil || !d.Allowed || d.Limits[0].Remaining != 0 {
		t.Fatalf("the bucket after the release: %+v (%v), want it left at 10 (the estimate not given back into it)", d, err)
	}
	// Another engine of the same name, with a key of its own, made none.
	stranger := New(Config{Region: "dev"}, mem.Rules())
	if _, err := stranger.Settle(ctx, res.ID, -1); !errors.Is(err, ErrReservationNotFound) {
		t.Fatalf("an id sealed by another key: %v, want ErrReservationNotFound", err)
	}
}

// TestGlobalReservations follows reservations of a global limit on Redis
// and in the engine's own memory: the estimate counted in the region's
// slot, what a commit gives back counted in its N, what it charges past
// the estimate in its P, a release, the same settlement again counted
// once; the engine's copy of its slot (what the gossip carries) as the
// store has it.
func TestGlobalReservations(t *testing.T) {
	ctx := t.Context()
	const rules = `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 30000, window: 1h }
`
	redisEngine, store, _ := oneReplicaRegion(t, rules)
	memEngine := New(Config{Region: "us", Global: GlobalConfig{Regions: []string{"us", "eu", "ap"}}}, mustParse(t, rules))
	for name, e := range map[string]*Engine{"redis": redisEngine, "memory": memEngine} {
		t.Run(name, func(t *testing.T) {
			key := []byte("gq:{g:t}")
			slot := func() crdt.Slot { // the engine's copy of the region's slot
				start := e.now().UnixMicro() / 3600e6 * 3600e3
				var s crdt.Slot
				e.global.usage.with(func(c *crdt.Counters) {
					for _, x := range c.Slots(crdt.ID{Key: string(key), Epoch: start}) {
						if x.Region == "us" {
							s = x
						}
					}
				})
				if name == "redis" {
					stored, err := store.ReadGlobal(ctx, key, start)
					if err != nil || len(stored) != 1 || stored[0] != s {
						t.Fatalf("the store's slot %v (%v), the engine's %v", stored, err, s)
					}
				}
				return s
			}
			var d Decision
			reserve := func(cost int64) string {
				t.Helper()
				res, err := e.Reserve(ctx, &Request{APIKey: "t", Cost: cost}, time.Minute, &d)
				if err != nil || !d.Allowed || res.ID == "" {
					t.Fatalf("reserve %d: %+v %+v (%v)", cost, res, d, err)
				}
				return res.ID
			}
			id := reserve(50)
			if s := slot(); s.P != 50 || s.N != 0 {
				t.Fatalf("after reserving 50: slot %+v", s)
			}
			for i := range 2 {
				st, err := e.Settle(ctx, id, 20)
				if err != nil || st.Charged != 20 || st.Again != (i == 1) || st.Limits[0].Rule != "g" {
					t.Fatalf("commit 20 of 50, time %d: %+v (%v)", i+1, st, err)
				}
			}
			if s := slot(); s.P != 50 || s.N != 30 {
				t.Fatalf("after a commit of 20 of 50, sent twice: slot %+v, want 30 given back once", s)
			}
			id = reserve(40)
			if _, err := e.Settle(ctx, id, -1); err != nil {
				t.Fatal(err)
			}
			if s := slot(); s.P != 90 || s.N != 70 {
				t.Fatalf("after a release of 40: slot %+v", s)
			}
			id = reserve(10)
			if st, err := e.Settle(ctx, id, 100); err != nil || st.Charged != 100 {
				t.Fatalf("commit 100 of 10: %+v (%v)", st, err)
			}
			if s := slot(); s.P != 190 || s.N != 70 {
				t.Fatalf("after a commit of 100 of 10: slot %+v, want 90 more in P", s)
			}
		})
	}
}

// switchedStore is a memory store whose Apply fails while down.
type switchedStore struct {
	*MemoryStore
	down bool
}

func (s *switchedStore) Apply(ctx context.Context, ops []Op, res []Result) (int64, error) {
	if s.down {
		return 0, errors.New("down")
	}
	return s.MemoryStore.Apply(ctx, ops, res)
}

// A reservation of a global limit waits out a degraded episode: until
// what the replicas admitted in memory while the store was down is
// written back, the store does not hold it, and would take the estimate
// out of room the region has spent.
func TestGlobalReservationsWaitOutAnEpisode(t *testing.T) {
	ctx := t.Context()
	clock := newVirtualClock()
	st := &switchedStore{MemoryStore: NewMemoryStore(clock.Now)}
	st.SetRegion("us")
	e := New(Config{Region: "us", Replica: "us-1", Store: st, Clock: clock.Now, Timeout: 50 * time.Millisecond,
		Global: GlobalConfig{Regions: []string{"us", "eu", "ap"}}}, mustParse(t, `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 3000, window: 1h }
`))
	var d Decision
	check := func(cost int64) {
		if err := e.Check(ctx, &Request{APIKey: "t", Cost: cost}, &d); err != nil {
			t.Fatal(err)
		}
	}
	check(20) // through the store, of an allowance of 100 (the region's floor)
	st.down = true
	for i := 0; i < 200 && (i < 2 || d.Allowed || !d.Degraded); i++ {
		check(1) // admitted in memory until the allowance is spent
		clock.AdvanceBy(time.Millisecond)
	}
	st.down = false
	clock.AdvanceBy(time.Minute) // past the breaker's cooldown, in the same window
	if check(50); d.Allowed {
		t.Fatalf("a check of 50 once the store is back: %+v", d)
	}
	res, err := e.Reserve(ctx, &Request{APIKey: "t", Cost: 50}, time.Minute, &d)
	if err != nil || d.Allowed || d.Code != CodeUnavailable || res.ID != "" {
		t.Fatalf("a reservation of 50 while the episode lasts: %+v %+v (%v), want unavailable", res, d, err)
	}
}

// Settlements of global reservations while the rules change under them:
// a limit changed alone keeps what comes back (the slots are the same), a
// rule gone leaves them alone, and nothing fails.
func TestGlobalSettlementsWhileRulesChange(t *testing.T) {
	ctx := t.Context()
	with := mustParse(t, `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 30000000, window: 1h }
`)
	e := New(Config{Region: "us", Global: GlobalConfig{Regions: []string{"us", "eu", "ap"}}}, with)
	var d Decision
	res, err := e.Reserve(ctx, &Request{APIKey: "t", Cost: 50}, time.Minute, &d)
	if err != nil || res.ID == "" {
		t.Fatal(err)
	}
	e.SetRules(mustParse(t, `
rules:
  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 40000000, window: 1h }
`))
	if _, err := e.Settle(ctx, res.ID, 20); err != nil {
		t.Fatal(err)
	}
	start := e.now().UnixMicro() / 3600e6 * 3600e3
	var p, n uint64
	e.global.usage.with(func(c *crdt.Counters) { p, n = c.Own(crdt.ID{Key: "gq:{g:t}", Epoch: start}) })
	if p != 50 || n != 30 {
		t.Fatalf("slot P=%d N=%d after a commit of 20 of 50 across a change of the limit alone, want 30 back", p, n)
	}
	// Settled while another goroutine takes the rule away and back.
	e.SetRules(with)
	var ids []string
	for range 300 {
		res, err := e.Reserve(ctx, &Request{APIKey: "t", Cost: 1}, time.Hour, &d)
		if err != nil || res.ID == "" {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	without := mustParse(t, `
rules:
  - { id: h, by: [api_key], algorithm: fixed_window, limit: 30000000, window: 1h }
`)
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				e.SetRules(without)
				e.SetRules(with)
			}
		}
	}()
	for _, id := range ids {
		if _, err := e.Settle(ctx, id, 1); err != nil {
			t.Errorf("settle while the rules change: %v", err)
		}
	}
	close(stop)
	<-done
}

// One reservation of a sliding log, a concurrency slot, a global limit and
// a fixed window is settled in one script call: each limit its own part.
func TestMixedReservation(t *testing.T) {
	ctx := t.Context()
	e, store, _ := oneReplicaRegion(t, `
rules:
  - { id: l, by: [api_key], algorithm: sliding_window_log, limit: 1000, window: 1h }
  - { id: c, by: [api_key], algorithm: concurrency, limit: 3, ttl: 30s }
  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 30000, window: 1h }
  - { id: f, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`)
	var d Decision
	res, err := e.Reserve(ctx, &Request{APIKey: "t", Cost: 50}, time.Minute, &d)
	if err != nil || !d.Allowed {
		t.Fatalf("%+v (%v)", d, err)
	}
	st, err := e.Settle(ctx, res.ID, 20)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"l": 980, "c": 3, "f": 980}
	for _, l := range st.Limits {
		if w, ok := want[l.Rule]; ok && l.Remaining != w {
			t.Errorf("%s after a commit of 20 of 50: %+v, want %d left", l.Rule, l, w)
		}
	}
	start := e.now().UnixMicro() / 3600e6 * 3600e3
	if slots, err := store.ReadGlobal(ctx, []byte("gq:{g:t}"), start); err != nil || len(slots) != 1 || slots[0].P != 50 || slots[0].N != 30 {
		t.Fatalf("the global limit's slot: %v (%v)", slots, err)
	}
}

// TestPlainSettlementsShareAScript: settlements of one token bucket or
// one fixed window, unchanged since, run in one settles.lua call a
// pipeline (two keys each: the counter and its settlements), beside the
// pipeline's checks.lua; a settlement of another algorithm, of a changed
// limit, or of several limits runs limits.lua. Each decides as the
// in-memory store settling them one after another, the same counter and
// the same reservation repeated among them.
func TestPlainSettlementsShareAScript(t *testing.T) {
	ctx := t.Context()
	rs, srv := newTestRedisStore(t, RedisOptions{})
	clock := newVirtualClock()
	rs.testNow, rs.testMinTTL = clock.micros, int64(time.Hour/time.Millisecond)
	mem := NewMemoryStore(clock.Now)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer admin.Close()
	admin.Ping(ctx)
	tb := Params{Algorithm: TokenBucket, Limit: 100, Rate: 10}
	fw := Params{Algorithm: FixedWindow, Limit: 100, Window: 60e6}
	gcra := Params{Algorithm: GCRA, Limit: 100, Rate: 10}
	tbKey, fwKey, gKey := []byte("gq:{ps:tb}"), []byte("gq:{ps:fw}"), []byte("gq:{ps:g}")
	// Reservations of 30 each, in both stores.
	reserve := func(key []byte, p Params) SettleOp {
		t.Helper()
		ops := []Op{{Key: key, Params: p, Cost: 30}}
		for _, st := range []Store{mem, rs} {
			if _, err := st.Apply(ctx, ops, make([]Result, 1)); err != nil {
				t.Fatal(err)
			}
		}
		return SettleOp{Key: key, Params: p, Estimate: 30, At: clock.micros()}
	}
	a, b, c, d := reserve(tbKey, tb), reserve(tbKey, tb), reserve(fwKey, fw), reserve(gKey, gcra)
	stale := reserve(fwKey, fw)
	stale.Stale = true
	until := clock.micros() + 30e6
	type settle struct {
		ops    []SettleOp
		mark   string
		actual int64
	}
	settles := []settle{
		{[]SettleOp{a}, "a", 10},    // 20 back
		{[]SettleOp{b}, "b", 45},    // 15 more, as debt if need be
		{[]SettleOp{a}, "a", 10},    // again: answered alike, nothing back
		{[]SettleOp{c}, "c", -1},    // released: 30 back
		{[]SettleOp{d}, "d", 5},     // GCRA: limits.lua
		{[]SettleOp{stale}, "s", 5}, // changed since: limits.lua
		{[]SettleOp{a, c}, "x", 0},  // two limits: limits.lua
	}
	mon := startMonitor(t, srv.Addr())
	var batch []*redisCall
	for _, s := range settles {
		batch = append(batch, rs.settleCall(s.ops, s.mark, until, s.actual))
	}
	batch = append(batch, rs.newCall([]Op{{Key: tbKey, Params: tb, Cost: 1}}, "check", 0, -1))
	runBatch(t, rs, batch)
	run := mon.scripts(t, admin, "settle-marker")
	want := []string{limitsSHA + " 2", limitsSHA + " 2", limitsSHA + " 4", settlesSHA + " 8", checksSHA + " 1"}
	if !slices.Equal(run, want) {
		t.Fatalf("scripts run (sha, keys) %q, want %q", run, want)
	}
	// In the pipeline's order: limits.lua's calls, then settles.lua's,
	// then checks.lua's.
	order := []int{4, 5, 6, 0, 1, 2, 3}
	for _, i := range order {
		s := settles[i]
		out := make([]Settlement, len(s.ops))
		if _, err := mem.Settle(ctx, s.ops, s.mark, until, s.actual, out); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out, batch[i].settled) {
			t.Fatalf("settlement %d (%s, %d): memory %+v, redis %+v", i, s.mark, s.actual, out, batch[i].settled)
		}
	}
	var want1 [1]Result
	if _, err := mem.Apply(ctx, []Op{{Key: tbKey, Params: tb, Cost: 1}}, want1[:]); err != nil {
		t.Fatal(err)
	}
	if got := batch[len(settles)].results[0]; got != want1[0] {
		t.Fatalf("the check after: memory %+v, redis %+v", want1[0], got)
	}
	if got := batch[0].settled[0]; got.Charged != 10 || got.Again {
		t.Fatalf("commit of 10 of 30: %+v", got)
	}
	if got := batch[2].settled[0]; !got.Again || got.Charged != 10 {
		t.Fatalf("the same commit again: %+v", got)
	}
}
