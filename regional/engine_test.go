package regional

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// env is an engine on one kind of store, on a virtual clock that the
// store's scripts share.
type env struct {
	t     *testing.T
	e     *Engine
	clock *virtualClock
	key   string // an API key no other test uses
}

func (v *env) check(req Request) Decision {
	v.t.Helper()
	var d Decision
	if err := v.e.Check(v.t.Context(), &req, &d); err != nil {
		v.t.Fatalf("Check(%+v): %v", req, err)
	}
	return d
}

func (v *env) allow(req Request, what string) Decision {
	v.t.Helper()
	d := v.check(req)
	if !d.Allowed {
		v.t.Fatalf("%s: denied (%v), want allowed: %+v", what, d.Code, d.Limit())
	}
	return d
}

func (v *env) deny(req Request, what string) Decision {
	v.t.Helper()
	d := v.check(req)
	if d.Allowed || d.Code != CodeOverLimit {
		v.t.Fatalf("%s: %v (allowed %v), want denied over limit: %+v", what, d.Code, d.Allowed, d.Limit())
	}
	return d
}

// storeKind makes a store for engine tests; the test's scenarios share it.
type storeKind struct {
	name  string
	start func(t *testing.T) (Store, func(clock *virtualClock))
}

// slowOK bounds store calls in tests of decisions: generous, so that a
// busy machine (the whole suite runs at once, under the race detector) is
// not mistaken for a failing store. Tests of timeouts set their own.
const slowOK = 5 * time.Second

func redisKind(name string, spec func(t *testing.T) string) storeKind {
	return storeKind{name, func(t *testing.T) (Store, func(*virtualClock)) {
		s := openTestRedisStore(t, spec(t), RedisOptions{Timeout: slowOK})
		s.testMinTTL = int64(time.Hour / time.Millisecond)
		return s, func(c *virtualClock) { s.testNow = c.micros }
	}}
}

var storeKinds = []storeKind{
	{"memory", func(t *testing.T) (Store, func(*virtualClock)) { return nil, nil }},
	redisKind("redis", func(t *testing.T) string { return harness.NewRedis(t, harness.RedisOptions{}).URL() }),
	redisKind("cluster", func(t *testing.T) string { return harness.NewRedisCluster(t, harness.RedisClusterOptions{}).Spec() }),
	redisKind("sentinel", func(t *testing.T) string { return harness.NewSentinel(t, harness.SentinelOptions{}).URL() }),
}

func loadTestRules(t testing.TB) *RuleSet {
	rs, err := LoadFile("testdata/engine.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestEngineBehaviours runs every behaviour of the rules and of regional
// enforcement on every kind of store.
func TestEngineBehaviours(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(v *env)
	}{
		{"token bucket: burst, then one every 2s", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/tb"}
			for i := range 30 {
				if d := v.allow(req, fmt.Sprintf("burst %d", i+1)); d.Limit().Remaining != int64(29-i) {
					t.Fatalf("burst %d: remaining %d", i+1, d.Limit().Remaining)
				}
			}
			d := v.deny(req, "31st")
			if l := d.Limit(); l.RetryAfter != 2*time.Second || l.Rule.ID != "tb" || l.Limit != 30 || l.Window != time.Minute {
				t.Fatalf("31st: %+v", l)
			}
			v.clock.AdvanceBy(2*time.Second - time.Microsecond)
			v.deny(req, "a microsecond before the retry-after")
			v.clock.AdvanceBy(time.Microsecond)
			v.allow(req, "at the retry-after")
			v.deny(req, "right after")
			v.clock.AdvanceBy(time.Minute)
			if d := v.allow(req, "a minute later"); d.Limit().Remaining != 29 {
				t.Fatalf("refilled to %d, want full (29 after this one)", d.Limit().Remaining)
			}
		}},
		{"gcra: burst, then one every 2s", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/gcra"}
			for i := range 30 {
				v.allow(req, fmt.Sprintf("burst %d", i+1))
			}
			if d := v.deny(req, "31st"); d.Limit().RetryAfter != 2*time.Second {
				t.Fatalf("retry-after %v", d.Limit().RetryAfter)
			}
			v.clock.AdvanceBy(2 * time.Second)
			v.allow(req, "after 2s")
		}},
		{"fixed window: edges", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/fw"}
			v.clock.AdvanceBy(time.Minute - time.Millisecond) // the window's last millisecond
			for i := range 5 {
				v.allow(req, fmt.Sprintf("request %d", i+1))
			}
			d := v.deny(req, "6th")
			if l := d.Limit(); l.RetryAfter != time.Millisecond || !l.ResetAt.Equal(time.UnixMicro(t0).Add(time.Minute)) {
				t.Fatalf("6th: retry %v reset %v", l.RetryAfter, l.ResetAt)
			}
			v.clock.AdvanceBy(time.Millisecond)
			for i := range 5 {
				v.allow(req, fmt.Sprintf("next window, request %d", i+1))
			}
			v.deny(req, "next window, 6th")
		}},
		{"sliding window counter: the last window weighs in", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/swc"}
			for range 80 {
				v.allow(req, "previous window")
			}
			v.clock.AdvanceBy(time.Minute + 15*time.Second) // 3/4 of the previous window still counts: 60
			for i := range 40 {
				v.allow(req, fmt.Sprintf("current window %d", i+1))
			}
			v.deny(req, "101st estimated")
		}},
		{"sliding window log: exactly 5 a minute per IP", func(v *env) {
			ip := fmt.Sprintf("198.51.100.%d", len(v.key)%200)
			req := Request{Endpoint: "/login", Method: "POST", IP: ip}
			for i := range 5 {
				v.allow(req, fmt.Sprintf("login %d", i+1))
				v.clock.AdvanceBy(10 * time.Second)
			}
			// The first login was 50s ago: it leaves the window in 10s.
			if d := v.deny(req, "6th"); d.Limit().RetryAfter != 10*time.Second {
				t.Fatalf("retry-after %v, want 10s", d.Limit().RetryAfter)
			}
			v.allow(Request{Endpoint: "/login", Method: "POST", IP: "2001:db8::1" + v.key[len(v.key)-1:]}, "another IP")
			v.clock.AdvanceBy(10 * time.Second)
			v.allow(req, "after the first left the window")
		}},
		{"several windows: all must allow, the tightest speaks", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/multi"}
			d := v.allow(req, "first")
			if len(d.Limits) != 2 || d.Limit().Rule.ID != "per-second" || d.Limit().Remaining != 9 || d.Limits[1].Remaining != 19 {
				t.Fatalf("limits %+v", d.Limits)
			}
			for range 9 {
				v.allow(req, "rest of the second")
			}
			if d := v.deny(req, "11th this second"); d.Limit().Rule.ID != "per-second" || d.Limit().RetryAfter != time.Second {
				t.Fatalf("denied by %+v", d.Limit())
			}
			v.clock.AdvanceBy(time.Second)
			for range 10 {
				v.allow(req, "next second")
			}
			v.clock.AdvanceBy(time.Second)
			d = v.deny(req, "21st this minute")
			if l := d.Limit(); l.Rule.ID != "per-minute" || l.RetryAfter != 58*time.Second {
				t.Fatalf("denied by %+v, want per-minute for 58s", l)
			}
		}},
		{"a denied request costs nothing", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/refund"}
			v.allow(req, "first")
			for range 5 {
				if d := v.deny(req, "narrow limit spent"); d.Limit().Rule.ID != "narrow" {
					t.Fatalf("denied by %s", d.Limit().Rule.ID)
				}
			}
			st, err := v.e.Inspect(v.t.Context(), "wide", &req)
			if err != nil || st.Remaining != 99 {
				t.Fatalf("wide limit after 1 allowed and 5 denied: %d left (%v), want 99", st.Remaining, err)
			}
		}},
		{"cost", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/tb", Cost: 10}
			for range 3 {
				v.allow(req, "10 of 30")
			}
			if d := v.deny(req, "31-40 of 30"); d.Limit().RetryAfter != 20*time.Second {
				t.Fatalf("retry-after %v, want 20s for 10 tokens at 0.5/s", d.Limit().RetryAfter)
			}
			weighted := Request{APIKey: v.key, Endpoint: "/weighted"}
			for range 3 {
				v.allow(weighted, "rule cost 10")
			}
			v.deny(weighted, "rule cost 10, 4th")
		}},
		{"shadow: counted, never denies", func(v *env) {
			req := Request{APIKey: v.key, Endpoint: "/shadow"}
			v.allow(req, "first")
			d := v.allow(req, "second, over the shadow limit")
			if l := d.Limit(); !l.Shadow || l.Allowed || l.Rule.ID != "shadowed" {
				t.Fatalf("shadow status %+v", l)
			}
		}},
		{"allow and block lists", func(v *env) {
			for range 50 {
				if d := v.check(Request{APIKey: "internal_" + v.key, Endpoint: "/fw"}); !d.Allowed || !d.Bypassed {
					t.Fatalf("allow-listed key limited: %+v", d)
				}
			}
			if d := v.check(Request{APIKey: "revoked_" + v.key, Endpoint: "/fw"}); d.Allowed || d.Code != CodeBlocked {
				t.Fatalf("block-listed key: %+v", d)
			}
		}},
		{"tiers and overrides", func(v *env) {
			for _, tc := range []struct {
				req  Request
				want int
			}{
				{Request{APIKey: "free_" + v.key, Endpoint: "/tiered"}, 2},               // tier from tier_of
				{Request{APIKey: "p" + v.key, Endpoint: "/tiered", Tier: "pro"}, 5},      // tier sent
				{Request{APIKey: "free_x" + v.key, Endpoint: "/tiered", Tier: "pro"}, 5}, // sent beats tier_of
				{Request{APIKey: "vip", Endpoint: "/tiered", Tier: "pro"}, 8},            // override beats tier
			} {
				for i := range tc.want {
					v.allow(tc.req, fmt.Sprintf("%s request %d", tc.req.APIKey, i+1))
				}
				v.deny(tc.req, fmt.Sprintf("%s over %d", tc.req.APIKey, tc.want))
			}
			if d := v.check(Request{APIKey: "nobody" + v.key, Endpoint: "/tiered"}); !d.Allowed || len(d.Limits) != 0 {
				t.Fatalf("no tier, no tier rule: %+v", d)
			}
		}},
	}
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			store, setClock := kind.start(t)
			for i, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					clock := newVirtualClock()
					if setClock != nil {
						setClock(clock)
					}
					e := New(Config{Store: store, Clock: clock.Now, Timeout: slowOK}, loadTestRules(t))
					sc.run(&env{t: t, e: e, clock: clock, key: fmt.Sprintf("%s-%d", kind.name, i)})
				})
			}
		})
	}
}

func TestInvalidRequestsChangeNothing(t *testing.T) {
	store, _ := newTestRedisStore(t, RedisOptions{})
	rs := mustParse(t, `
rules:
  - id: r
    match: { endpoint: /x }
    by: [api_key]
    capacity: 5
    refill_per_second: 1
  - id: plan
    match: { descriptors: { plan: "*" } }
    by: [plan]
    capacity: 5
    refill_per_second: 1
`)
	e := New(Config{Store: store, Timeout: slowOK}, rs)
	long := strings.Repeat("k", MaxValueLen+1)
	for _, tc := range []struct {
		req   Request
		field string
	}{
		{Request{APIKey: long, Endpoint: "/x"}, "api_key"},
		{Request{APIKey: "k", Endpoint: "/x/" + long}, "endpoint"},
		{Request{APIKey: "k", Endpoint: "x"}, "endpoint"},
		{Request{APIKey: "k", Endpoint: "/x", IP: "300.1.1.1"}, "ip"},
		{Request{APIKey: "k", Endpoint: "/x", Method: long}, "method"},
		{Request{APIKey: "k", Endpoint: "/x", Tier: long}, "tier"},
		{Request{APIKey: "k", Endpoint: "/x", Cost: -1}, "cost"},
		{Request{APIKey: "k", Endpoint: "/x", Cost: 6}, "cost"},
		{Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"colour", "red"}}}, "descriptors.colour"},
		{Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"plan", ""}}}, "descriptors.plan"},
		{Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"plan", long}}}, "descriptors.plan"},
		{Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"plan", "a"}, {"plan", "b"}}}, "descriptors.plan"},
		{Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"api_key", "k2"}}}, "descriptors.api_key"},
		// Not UTF-8: refused, not counted under a key that JSON would
		// have mangled into another.
		{Request{APIKey: "k\xff", Endpoint: "/x"}, "api_key"},
		{Request{APIKey: "k", Endpoint: "/x\xc3"}, "endpoint"},
		{Request{APIKey: "k", Endpoint: "/x", Method: "G\xffT"}, "method"},
		{Request{APIKey: "k", Endpoint: "/x", Tier: "\xfe"}, "tier"},
		{Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"plan", "a\x80"}}}, "descriptors.plan"},
	} {
		var d Decision
		err := e.Check(t.Context(), &tc.req, &d)
		var re *RequestError
		if !errors.Is(err, ErrInvalidRequest) || !errors.As(err, &re) || re.Field != tc.field {
			t.Errorf("%+v: error %v, want ErrInvalidRequest naming %s", tc.req, err, tc.field)
		}
	}
	if n, err := store.Client().DBSize(t.Context()).Result(); err != nil || n != 0 {
		t.Fatalf("invalid requests left %d keys in Redis (%v)", n, err)
	}
	// The limits: 512 bytes are accepted, and counted.
	ok := Request{APIKey: strings.Repeat("k", MaxValueLen), Endpoint: "/x", Cost: 5}
	var d Decision
	if err := e.Check(t.Context(), &ok, &d); err != nil || !d.Allowed {
		t.Fatalf("512-byte key: %v, %+v", err, d)
	}
	// Its counter, and the set that counts the rule's keys in the region.
	if n, _ := store.Client().DBSize(t.Context()).Result(); n != 2 {
		t.Fatalf("%d keys after one valid request, want 2", n)
	}
}

func TestInvalidRulesKeepLastGood(t *testing.T) {
	e := New(Config{}, loadTestRules(t))
	dir := t.TempDir()
	bad := dir + "/rules.yaml"
	if err := writeFile(bad, "rules:\n  - id: fw\n    algorithm: fixed_window\n    limit: 0\n    window: 1m\n"); err != nil {
		t.Fatal(err)
	}
	err := e.LoadRules(bad)
	if !errors.Is(err, ErrInvalidRules) || !strings.Contains(err.Error(), `rule "fw": limit`) {
		t.Fatalf("LoadRules(bad) = %v", err)
	}
	if e.Rules().Rule("tb") == nil || e.Stats().RuleReloadErrors.Load() != 1 {
		t.Fatal("the last good rules are no longer in force")
	}
}

// TestConcurrentEnginesNeverOverAdmit hammers one counter from two engines
// (two replicas) with their own connections to one Redis.
func TestConcurrentEnginesNeverOverAdmit(t *testing.T) {
	srv := harness.NewRedis(t, harness.RedisOptions{})
	rules := mustParse(t, `
rules:
  - { id: fw, match: { endpoint: /fw }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
  - { id: swl, match: { endpoint: /swl }, by: [api_key], algorithm: sliding_window_log, limit: 300, window: 1h }
  - { id: tb, match: { endpoint: /tb }, by: [api_key], capacity: 500, refill_per_second: 0.001 }
  - { id: both-a, match: { endpoint: /both }, by: [api_key], algorithm: fixed_window, limit: 400, window: 1h }
  - { id: both-b, match: { endpoint: /both }, by: [api_key], capacity: 250, refill_per_second: 0.001 }
`)
	var engines []*Engine
	for range 2 {
		s := openTestRedisStore(t, srv.URL(), RedisOptions{Timeout: 5 * time.Second})
		engines = append(engines, New(Config{Store: s, Timeout: 5 * time.Second}, rules))
	}
	for endpoint, limit := range map[string]int64{"/fw": 1000, "/swl": 300, "/tb": 500, "/both": 250} {
		var admitted sync.WaitGroup
		var mu sync.Mutex
		var n int64
		for g := range 50 {
			admitted.Add(1)
			go func() {
				defer admitted.Done()
				e := engines[g%2]
				for range 3 * int(limit) / 50 {
					var d Decision
					if err := e.Check(context.Background(), &Request{APIKey: "hot", Endpoint: endpoint}, &d); err != nil {
						t.Error(err)
						return
					}
					if d.Degraded {
						t.Error("degraded decision under load")
						return
					}
					if d.Allowed {
						mu.Lock()
						n++
						mu.Unlock()
					}
				}
			}()
		}
		admitted.Wait()
		if n > limit || n < limit-1 {
			t.Errorf("%s: admitted %d of %d attempts, limit %d", endpoint, n, 3*limit, limit)
		}
	}
}

// TestResetAtIsTheWindowsEnd: a fixed window's reset is its end to the
// microsecond, whatever the nanoseconds of the engine's clock (they made
// /v1/check say a second later than /v1/usage).
func TestResetAtIsTheWindowsEnd(t *testing.T) {
	now := time.Date(2026, 11, 26, 10, 30, 15, 123_456_789, time.UTC)
	e := New(Config{Clock: func() time.Time { return now }}, mustParse(t, `rules:
  - { id: m, match: { endpoint: /m }, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m }
`))
	var d Decision
	if err := e.Check(t.Context(), &Request{Endpoint: "/m", APIKey: "a"}, &d); err != nil || len(d.Limits) != 1 {
		t.Fatalf("%+v, %v", d, err)
	}
	if want := time.Date(2026, 11, 26, 10, 31, 0, 0, time.UTC); !d.Limits[0].ResetAt.Equal(want) {
		t.Fatalf("reset at %v, want the window's end %v", d.Limits[0].ResetAt, want)
	}
}

// TestDenialTakesNothing: a request denied by one limit takes nothing
// from the others, and its decision says so: each other limit's remaining
// is what it had, on both stores.
func TestDenialTakesNothing(t *testing.T) {
	rules := mustParse(t, `
rules:
  - { id: small, by: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
  - { id: large, by: [api_key], capacity: 100, refill_per_second: 0.001 }
`)
	srv := harness.NewRedis(t, harness.RedisOptions{})
	for name, store := range map[string]Store{"memory": NewMemoryStore(nil), "redis": openTestRedisStore(t, srv.URL(), RedisOptions{})} {
		e := New(Config{Store: store}, rules)
		req := Request{APIKey: "acme", Cost: 1}
		mustCheck(t, e, req)
		mustCheck(t, e, req)
		d := mustCheck(t, e, req)
		if d.Allowed || len(d.Limits) != 2 {
			t.Fatalf("%s: third request: %+v", name, d)
		}
		for _, l := range d.Limits {
			if l.Rule.ID == "large" && l.Remaining != 98 {
				t.Errorf("%s: the limit that allowed says %d remaining after the denial, want 98 (it took nothing)", name, l.Remaining)
			}
		}
		if u, err := e.Inspect(t.Context(), "large", &req); err != nil || u.Remaining != 98 {
			t.Errorf("%s: large holds %d remaining, %v", name, u.Remaining, err)
		}
	}
}
