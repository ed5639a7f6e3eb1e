package regional

import (
	"errors"
	"testing"
	"time"
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
			clock.AdvanceBy(30 * time.Second)
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
	for field, rule := range map[string]string{
		"ttl":              "{ id: x, algorithm: concurrency, limit: 5, ttl: 25h }",
		"limit":            "{ id: x, algorithm: concurrency, limit: 100001 }",
		"window":           "{ id: x, algorithm: concurrency, limit: 5, window: 1m }",
		"cost":             "{ id: x, algorithm: concurrency, limit: 5, cost: 2 }",
		"count_over_limit": "{ id: x, algorithm: concurrency, limit: 5, count_over_limit: true }",
		"scope":            "{ id: x, algorithm: concurrency, limit: 5, scope: global }",
		"batch":            "{ id: x, by: [api_key], algorithm: concurrency, limit: 5, batch: 2 }",
	} {
		_, err := Parse("", []byte("rules:\n  - "+rule+"\n"))
		var re *RuleError
		if !errors.As(err, &re) || re.Field != field {
			t.Errorf("%s: %v, want an error naming %s", rule, err, field)
		}
	}
}
