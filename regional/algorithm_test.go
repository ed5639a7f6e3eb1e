package regional

import (
	"fmt"
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

var algorithms = []Algorithm{TokenBucket, GCRA, FixedWindow, SlidingWindowCounter, SlidingWindowLog, Concurrency}

// genParams draws a limit of any algorithm: mostly with numbers small
// enough to reach the edges often, sometimes at the far ends of what rules
// allow (limits to 2^40, rates to a million a second, periods and windows
// from a millisecond to a year).
func genParams() *rapid.Generator[Params] {
	return rapid.Custom(func(t *rapid.T) Params {
		p := Params{Algorithm: rapid.SampledFrom(algorithms).Draw(t, "algorithm")}
		wide := rapid.IntRange(0, 3).Draw(t, "wide") == 0
		if !wide {
			p.Limit = rapid.Int64Range(1, 20).Draw(t, "limit")
			if p.Algorithm == TokenBucket || p.Algorithm == GCRA {
				p.Rate = rapid.SampledFrom([]float64{0.5, 1, 3, 7.25, 1000, 1.0 / 3}).Draw(t, "rate")
			} else {
				p.Window = rapid.SampledFrom([]int64{1000, 7777, 1e6, 60e6}).Draw(t, "window")
			}
			return p
		}
		p.Limit = rapid.SampledFrom([]int64{1, 3, 1000, 99_999, 1_000_000, 123_456_789, 1 << 40}).Draw(t, "wide limit")
		if p.Algorithm.logged() {
			p.Limit = min(p.Limit, 50) // a log of 2^40 entries is not a test
		}
		if p.Algorithm == TokenBucket || p.Algorithm == GCRA {
			period := rapid.SampledFrom([]float64{0.001, 0.0013, 1, 7.7, 3600, 366 * 86400}).Draw(t, "period")
			p.Rate = float64(p.Limit) / period
			if rapid.Bool().Draw(t, "thirds") {
				p.Rate /= 3
			}
			p.Rate = fmin(fmax(p.Rate, float64(p.Limit)/(366*86400)), fmin(1e6, float64(p.Limit)/0.001))
		} else {
			p.Window = rapid.SampledFrom([]int64{1000, 1001, 7777, 60e6, 86400e6, 366 * 86400e6}).Draw(t, "wide window")
		}
		return p
	})
}

const t0 = 1_767_225_600_000_000 // 2026-01-01T00:00:00Z in µs

// genHistory drives a limit through random traffic and returns its state
// and the time reached.
func genHistory(t *rapid.T, p Params) (State, int64) {
	var s State
	now := int64(t0) + rapid.Int64Range(0, 1e7).Draw(t, "start")
	for range rapid.IntRange(0, 30).Draw(t, "requests") {
		now += rapid.SampledFrom([]int64{0, 0, 1, 999, 1000, 12345, 1e6}).Draw(t, "advance")
		var r Result
		r, s2 := Decide(p, s, now, genCost(t, p))
		if r.Allowed {
			s = s2
		}
		if rapid.IntRange(0, 9).Draw(t, "give back") == 0 {
			s, _ = giveBack(p, s, now, genCost(t, p), rapid.SampledFrom([]int64{-1, now}).Draw(t, "at"))
		}
	}
	return s, now
}

// genCost draws a cost for a limit: small ones, and the edges near it.
func genCost(t *rapid.T, p Params) int64 {
	c := rapid.SampledFrom([]int64{1, 2, 3, p.Limit, p.Limit - 1, p.Limit / 2, p.Limit / 3}).Draw(t, "cost")
	return max(1, min(c, p.Limit))
}

func TestRetryAfterIsExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams().Draw(t, "params")
		s, now := genHistory(t, p)
		cost := genCost(t, p)
		r, _ := Decide(p, cloneLog(s), now, cost)
		if r.Allowed {
			if r.RetryAfter != 0 {
				t.Fatalf("allowed with retry-after %d", r.RetryAfter)
			}
			return
		}
		if r.RetryAfter < 1 {
			t.Fatalf("denied with retry-after %d", r.RetryAfter)
		}
		if !Allows(p, s, now+r.RetryAfter, cost) {
			t.Fatalf("%v: denied at now+%dµs, the retry-after it gave", p, r.RetryAfter)
		}
		if Allows(p, s, now+r.RetryAfter-1, cost) {
			t.Fatalf("%v: allowed at now+%dµs already, before the retry-after %d", p, r.RetryAfter-1, r.RetryAfter)
		}
	})
}

func TestWholeLimitAvailableAtReset(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams().Draw(t, "params")
		s, now := genHistory(t, p)
		r, s2 := Decide(p, cloneLog(s), now, 1)
		if r.Allowed {
			s = s2
		}
		if r.ResetAt < now {
			t.Fatalf("reset %d before now %d", r.ResetAt, now)
		}
		if !Allows(p, s, r.ResetAt, p.Limit) {
			t.Fatalf("%v: the whole limit is not available at the reset time (now+%dµs)", p, r.ResetAt-now)
		}
	})
}

func TestExpiredStateIsNoState(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams().Draw(t, "params")
		s, now := genHistory(t, p)
		if !s.Exists {
			return
		}
		at := now + ttl(&p, &s, now) + rapid.Int64Range(0, 1e6).Draw(t, "later")
		cost := genCost(t, p)
		got, _ := Decide(p, cloneLog(s), at, cost)
		want, _ := Decide(p, State{}, at, cost)
		if got != want {
			t.Fatalf("%v: after the TTL, state %+v decides %+v; no state decides %+v", p, s, got, want)
		}
	})
}

// TestNeverOverLimit counts what each algorithm admits under random
// traffic against what it may: a fixed window's limit per window, a log's
// per sliding window, a bucket's capacity plus its refill.
func TestNeverOverLimit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams().Draw(t, "params")
		var s State
		type admit struct{ at, cost int64 }
		var admitted []admit
		now := int64(t0)
		for range rapid.IntRange(1, 60).Draw(t, "requests") {
			now += rapid.SampledFrom([]int64{0, 1, 100, 999, 5000, 250_000}).Draw(t, "advance")
			cost := rapid.Int64Range(1, p.Limit).Draw(t, "cost")
			r, s2 := Decide(p, s, now, cost)
			if r.Allowed {
				s = s2
				admitted = append(admitted, admit{now, cost})
			}
		}
		window := p.WindowMicros()
		for i, a := range admitted {
			var sum int64
			for _, b := range admitted[i:] {
				switch {
				case p.Algorithm == FixedWindow || p.Algorithm == SlidingWindowCounter:
					if b.at/window == a.at/window {
						sum += b.cost
					}
				case p.Algorithm.logged():
					if b.at-a.at < window {
						sum += b.cost
					}
				default: // token bucket, GCRA: capacity plus what refilled since a
					sum += b.cost
					if allowance := float64(p.Limit) + float64(b.at-a.at)*p.Rate/1e6; float64(sum) > allowance+1e-9 {
						t.Fatalf("%v: admitted %d from %d to %d, more than %.3f", p, sum, a.at, b.at, allowance)
					}
				}
			}
			if sum > p.Limit && p.Algorithm != TokenBucket && p.Algorithm != GCRA {
				t.Fatalf("%v: admitted %d in the window from %d", p, sum, a.at)
			}
		}
	})
}

func TestBurstThenRefill(t *testing.T) {
	for _, p := range []Params{
		{Algorithm: TokenBucket, Limit: 30, Rate: 0.5},
		{Algorithm: GCRA, Limit: 30, Rate: 0.5},
		{Algorithm: FixedWindow, Limit: 30, Window: 60e6},
		{Algorithm: SlidingWindowCounter, Limit: 30, Window: 60e6},
		{Algorithm: SlidingWindowLog, Limit: 30, Window: 60e6},
	} {
		t.Run(p.Algorithm.String(), func(t *testing.T) {
			var s State
			now := int64(t0) // a window boundary
			for i := range 30 {
				r, s2 := Decide(p, s, now, 1)
				if !r.Allowed || r.Remaining != int64(29-i) {
					t.Fatalf("request %d of the burst: %+v", i+1, r)
				}
				s = s2
			}
			r, _ := Decide(p, s, now, 1)
			if r.Allowed || r.Remaining != 0 {
				t.Fatalf("31st request: %+v", r)
			}
			// Token bucket and GCRA refill one every 2 s; windows wait for
			// the window to end (the sliding counter a little longer for
			// the previous window's weight... here, exactly one window).
			want := map[Algorithm]int64{TokenBucket: 2e6, GCRA: 2e6, FixedWindow: 60e6, SlidingWindowCounter: 60e6 + 2e6, SlidingWindowLog: 60e6}[p.Algorithm]
			if r.RetryAfter != want {
				t.Fatalf("retry-after %dµs, want %d", r.RetryAfter, want)
			}
			if r, _ := Decide(p, cloneLog(s), now+want, 1); !r.Allowed {
				t.Fatalf("denied after the retry-after: %+v", r)
			}
		})
	}
}

func TestSlidingCounterWeighsPreviousWindow(t *testing.T) {
	p := Params{Algorithm: SlidingWindowCounter, Limit: 100, Window: 60e6}
	// 80 in the previous window; a quarter into this one, it still counts 60.
	s := State{Exists: true, A: t0, B: 80}
	now := int64(t0 + 60e6 + 15e6)
	r, s := Decide(p, s, now, 40)
	if !r.Allowed || r.Remaining != 0 {
		t.Fatalf("60 weighed + 40 = 100: %+v", r)
	}
	if r, _ := Decide(p, s, now, 1); r.Allowed {
		t.Fatalf("101st allowed: %+v", r)
	}
	if fmt.Sprint(s.A, s.B, s.C) != fmt.Sprint(float64(t0+60e6), 40.0, 80.0) {
		t.Fatalf("state %+v", s)
	}
}

func TestDecideDoesNotChangeADeniedState(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams().Draw(t, "params")
		s, now := genHistory(t, p)
		before := cloneLog(s)
		r, after := Decide(p, s, now, p.Limit)
		if !r.Allowed && !reflect.DeepEqual(after, before) {
			t.Fatalf("denied, yet the state changed: %+v -> %+v", before, after)
		}
	})
}

// A hit past the limit of a rule that counts every hit (count_over_limit)
// is counted as debt: the key is denied, even a check that counts nothing,
// until the debt is paid, and RetryAfter says exactly when that is.
func TestDebtIsPaidBackExactly(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genParams().Filter(func(p Params) bool { return !p.Algorithm.logged() }).Draw(t, "params")
		s, now := genHistory(t, p)
		before := inspect(p, s, now)
		cost := rapid.OneOf(rapid.Int64Range(1, 3*p.Limit+3), rapid.SampledFrom([]int64{1 << 40, 1 << 53, 1 << 62})).Draw(t, "reported")
		op := Op{Params: p, Cost: cost, Debt: true}
		var r Result
		decideOp(&op, &s, now, &r)
		if r.Taken != cost {
			t.Fatalf("a report of %d took %d: %+v", cost, r.Taken, r)
		}
		if r.Allowed {
			return
		}
		// What a counter keeps past its limit is capped (a sliding window
		// counter's estimate adds its previous window's, capped alike).
		if bound := 2*(debtCap(&p)+float64(p.Limit)) + 2; float64(-r.Remaining) > bound {
			t.Fatalf("a report of %d left a debt of %d, past %.0f", cost, -r.Remaining, bound)
		}
		if r.Remaining >= before.Remaining && float64(-r.Remaining) < debtCap(&p) {
			t.Fatalf("a report of %d past the limit left %d remaining, %d before", cost, r.Remaining, before.Remaining)
		}
		probe := func(at int64) bool { return Allows(p, s, at, 0) }
		if r.Remaining < 0 && probe(now) {
			t.Fatalf("in debt by %d, a check counting nothing is allowed", -r.Remaining)
		}
		if r.RetryAfter <= 0 || !probe(now+r.RetryAfter) || (r.RetryAfter > 1 && probe(now+r.RetryAfter-1)) {
			t.Fatalf("retry after %dµs is not when the debt is paid: allowed then %v, a µs before %v",
				r.RetryAfter, probe(now+r.RetryAfter), probe(now+r.RetryAfter-1))
		}
	})
}
