package regional

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Regression tests, one for each defect a review found.

// stallStore is glue for the breaker tests: a store that answers after it
// is told to, or fails, so that the engine's handling of a probe whose
// caller gives up can be seen. (Store behaviour itself is tested on Redis.)
type stallStore struct {
	MemoryStore
	fail  atomic.Bool
	stall chan struct{}
}

func (s *stallStore) Apply(ctx context.Context, ops []Op, res []Result) (int64, error) {
	if ch := s.stall; ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if s.fail.Load() {
		return 0, errors.New("store down")
	}
	return s.MemoryStore.Apply(ctx, ops, res)
}

func TestBreakerProbeWhoseCallerGivesUpIsReleased(t *testing.T) {
	clock := newVirtualClock()
	store := &stallStore{MemoryStore: *NewMemoryStore(clock.Now)}
	e := New(Config{Store: store, Clock: clock.Now, Breaker: BreakerConfig{Failures: 1, Cooldown: time.Second}},
		mustParse(t, "rules:\n  - { id: r, by: [api_key], capacity: 10, refill_per_second: 1 }\n"))
	store.fail.Store(true)
	mustCheck(t, e, Request{APIKey: "k"})
	if e.Breaker() != BreakerOpen {
		t.Fatalf("breaker %v after a failure", e.Breaker())
	}
	clock.AdvanceBy(2 * time.Second)
	// The probe's caller gives up while the (healthy) store is slow.
	store.fail.Store(false)
	store.stall = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var d Decision
	e.Check(ctx, &Request{APIKey: "k"}, &d)
	store.stall = nil
	// The next call probes again, finds the store well, and closes the breaker.
	if d := mustCheck(t, e, Request{APIKey: "k"}); d.Degraded || e.Breaker() != BreakerClosed {
		t.Fatalf("after an abandoned probe: breaker %v, degraded %v", e.Breaker(), d.Degraded)
	}
}

func TestCallerDeadlinesDoNotOpenTheBreaker(t *testing.T) {
	store, _ := newTestRedisStore(t, RedisOptions{})
	e := New(Config{Store: store, Breaker: BreakerConfig{Failures: 3, Cooldown: time.Hour}},
		mustParse(t, "rules:\n  - { id: r, by: [api_key], capacity: 1000000, refill_per_second: 1000 }\n"))
	// Callers with deadlines too short for any round trip.
	for range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Microsecond)
		var d Decision
		e.Check(ctx, &Request{APIKey: "k"}, &d)
		cancel()
	}
	if e.Breaker() != BreakerClosed {
		t.Fatalf("breaker %v: impatient callers opened it on a healthy Redis", e.Breaker())
	}
	if d := mustCheck(t, e, Request{APIKey: "k"}); d.Degraded {
		t.Fatal("degraded with Redis healthy")
	}
}

func TestShadowKeyCapDoesNotBypassEnforcedLimits(t *testing.T) {
	e := New(Config{}, mustParse(t, `
rules:
  - { id: enforced, by: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
  - { id: watched, by: [api_key], algorithm: fixed_window, limit: 100, window: 1h, shadow: true, max_keys: 1 }
`))
	mustCheck(t, e, Request{APIKey: "first"}) // the shadow rule's only key
	allowed := 0
	for range 10 {
		d := mustCheck(t, e, Request{APIKey: "second"})
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 {
		t.Fatalf("the enforced limit of 2 let %d of 10 through", allowed)
	}
}

func TestWindowLeasesGoBackWithinTheirWindow(t *testing.T) {
	clock := newVirtualClock() // t0 is a whole minute
	e := New(Config{Clock: clock.Now, BatchTTL: time.Second}, mustParse(t, `
rules:
  - { id: fw, by: [api_key], algorithm: fixed_window, limit: 100, window: 1m, lease: 10 }
`))
	allowed := 0
	for range 30 { // 30 requests, one every 1.9 s, all in one minute
		if mustCheck(t, e, Request{APIKey: "k"}).Allowed {
			allowed++
		}
		clock.AdvanceBy(1900 * time.Millisecond)
		if err := e.Maintain(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if allowed != 30 || e.Stats().BatchLapsed.Load() != 0 {
		t.Fatalf("%d of 30 allowed with a limit of 100; %d leased tokens lapsed", allowed, e.Stats().BatchLapsed.Load())
	}
}

func TestGCRAHoldsAtHighRates(t *testing.T) {
	for _, rate := range []float64{3e5, 3e6, 1e7} {
		p := Params{Algorithm: GCRA, Limit: 1000, Rate: rate}
		var s State
		now := int64(t0)
		admitted := 0
		const micros = 100_000 // 0.1 s, three requests a microsecond
		for i := range micros * 3 {
			if i%3 == 0 {
				now++
			}
			if r, s2 := Decide(p, s, now, 1); r.Allowed {
				s, admitted = s2, admitted+1
			}
		}
		allowance := float64(p.Limit) + rate*micros/1e6
		want := min(allowance, 3*micros) // no more than the allowance, nor than was offered
		if got := float64(admitted); got > allowance+1 || got < want*0.999 {
			t.Errorf("rate %g: admitted %d of %d offered in 0.1 s, allowance %.0f", rate, admitted, 3*micros, allowance)
		}
	}
	burst := Params{Algorithm: GCRA, Limit: 100_000, Rate: 1e7}
	var s State
	admitted := 0
	for range 1_000_000 {
		if r, s2 := Decide(burst, s, t0, 1); r.Allowed {
			s, admitted = s2, admitted+1
		}
	}
	if admitted != 100_000 {
		t.Fatalf("a burst of 100000 at one instant admitted %d", admitted)
	}
	if r, _ := Decide(Params{Algorithm: GCRA, Limit: 7, Rate: 3}, State{}, t0, 0); r.Remaining != 7 {
		t.Fatalf("an idle meter of burst 7 reports %d remaining", r.Remaining)
	}
}

func TestRuleIDsCannotMakeKeysCollide(t *testing.T) {
	_, err := Parse("", []byte("rules:\n  - { id: \"a:b\", by: [api_key], capacity: 1, refill_per_second: 1 }\n"))
	if !errors.Is(err, ErrInvalidRules) {
		t.Fatalf("a rule id with a colon: %v", err)
	}
}

func TestAlgorithmChangeStartsAfresh(t *testing.T) {
	for _, kind := range storeKinds[:2] { // memory and redis
		t.Run(kind.name, func(t *testing.T) {
			store, _ := kind.start(t)
			e := New(Config{Store: store, Timeout: slowOK}, mustParse(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 20, window: 1h }\n"))
			for range 20 {
				mustCheck(t, e, Request{APIKey: "k"})
			}
			e.SetRules(mustParse(t, "rules:\n  - { id: r, by: [api_key], algorithm: sliding_window_log, limit: 20, window: 1h }\n"))
			allowed := 0
			for range 20 {
				if mustCheck(t, e, Request{APIKey: "k"}).Allowed {
					allowed++
				}
			}
			if allowed != 20 {
				t.Fatalf("after switching fixed_window to sliding_window_log, %d of 20 allowed", allowed)
			}
		})
	}
}

func TestRefundStaysInItsWindow(t *testing.T) {
	rs, _ := newTestRedisStore(t, RedisOptions{})
	clock := newVirtualClock()
	rs.testNow = clock.micros
	for _, store := range []Store{NewMemoryStore(clock.Now), rs} {
		key := []byte("gq:{w:k}")
		p := Params{Algorithm: FixedWindow, Limit: 5, Window: 60e6}
		clock.us.Store(t0 + 60e6 - 1) // the window's last microsecond
		res := make([]Result, 1)
		store.Apply(t.Context(), []Op{{Key: key, Params: p, Cost: 5}}, res)
		taken := clock.micros()
		clock.Advance(2) // the next window
		given, err := store.Refund(t.Context(), key, p, 5, taken)
		if err != nil || given != 0 {
			t.Fatalf("%T: a refund into a window that has passed gave %d (%v)", store, given, err)
		}
		st, _ := store.Inspect(t.Context(), key, p)
		if st.Remaining != 5 {
			t.Fatalf("%T: the new window has %d remaining of 5", store, st.Remaining)
		}
		store.Reset(t.Context(), key, p)
	}
}

// TestRedisWaitsAreBounded sends many checks to a server that never
// answers, through one pipeline of one call at a time. Were a wait in the
// queue not bounded by the deadline, the last caller would wait for all
// the calls before it, 200 × 50ms = 10s; bounded, each gives up after
// about 50ms, plus what the machine's scheduling adds.
func TestRedisWaitsAreBounded(t *testing.T) {
	// A server that accepts connections and never answers.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				buf := make([]byte, 1024)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	// The accept loop ends before the wait for its connections: an Add
	// racing a Wait at zero is a misuse of WaitGroup.
	defer func() { lis.Close(); <-accepting; conns.Wait() }()
	client, cluster, err := NewRedisClient("redis://"+lis.Addr().String()+"/0", RedisAuth{})
	if err != nil {
		t.Fatal(err)
	}
	store := newRedisStore(client, cluster, RedisOptions{Timeout: 50 * time.Millisecond, Pipelines: 1, MaxBatch: 1})
	e := New(Config{Store: store, Timeout: 50 * time.Millisecond, Breaker: BreakerConfig{Failures: 1 << 30}},
		mustParse(t, "rules:\n  - { id: r, by: [api_key], capacity: 10, refill_per_second: 1 }\n"))
	var worst atomic.Int64
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			var d Decision
			e.Check(context.Background(), &Request{APIKey: "k"}, &d)
			if took := time.Since(start); int64(took) > worst.Load() {
				worst.Store(int64(took))
			}
		}()
	}
	wg.Wait()
	store.Close()
	if w := time.Duration(worst.Load()); w > time.Second {
		t.Fatalf("a check waited %v against a 50ms timeout", w)
	}
}

func TestCloseReleasesWaiters(t *testing.T) {
	store, srv := newTestRedisStore(t, RedisOptions{Timeout: time.Hour})
	srv.Kill() // calls now stall in dialling and retries
	done := make(chan struct{})
	go func() {
		var res [1]Result
		store.Apply(context.Background(), []Op{{Key: []byte("gq:{r:k}"), Params: Params{Algorithm: FixedWindow, Limit: 1, Window: 1e6}, Cost: 1}}, res[:])
		close(done)
	}()
	time.Sleep(20 * time.Millisecond) // let the call queue up
	store.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a call still waits after Close")
	}
}

func TestInvalidRequestsTrackNoKeys(t *testing.T) {
	e := New(Config{}, mustParse(t, "rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 5, window: 1h, max_keys: 1 }\n"))
	var d Decision
	if err := e.Check(t.Context(), &Request{APIKey: "bad", Cost: 6}, &d); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("cost 6 of 5: %v", err)
	}
	if d := mustCheck(t, e, Request{APIKey: "good"}); !d.Allowed {
		t.Fatal("an invalid request took the rule's only tracked key")
	}
}

func TestRulesThatCouldNeverApplyAreRefused(t *testing.T) {
	for name, yaml := range map[string]string{
		"empty tiers":               "rules:\n  - { id: r, algorithm: fixed_window, window: 1m, limit: 5, tiers: {} }\n",
		"match a tier not in tiers": "rules:\n  - { id: r, match: { tier: gold }, algorithm: fixed_window, window: 1m, tiers: { free: 5 } }\n",
		"scaled rate too high":      "rules:\n  - { id: r, algorithm: gcra, rate: 1000, burst: 10, tiers: { big: 100000000000 } }\n",
	} {
		if _, err := Parse("", []byte(yaml)); !errors.Is(err, ErrInvalidRules) {
			t.Errorf("%s: %v", name, err)
		}
	}
	rs := mustParse(t, "rules:\n  - { id: r, match: { ip: \"::ffff:10.0.0.0/104\" }, by: [ip], capacity: 5, refill_per_second: 1 }\n")
	if m := rs.AppendMatches(nil, &Request{IP: "10.1.2.3"}); len(m) != 1 {
		t.Fatal("an IPv4-mapped CIDR matches no IPv4 request")
	}
}
