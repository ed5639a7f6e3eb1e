package regional

import "math"

// State is a counter's stored state. What its numbers mean depends on the
// algorithm; times are microseconds since the Unix epoch:
//
//	token bucket            A tokens, B time of the last update
//	GCRA                    A debt: the cost the meter holds, draining at the
//	                        rate, B time of the last update
//	fixed window            A window start, B count
//	sliding window counter  A window start, B current count, C previous count
//	sliding window log      A sum of logged costs, B entries ever logged; Log the entries
//
// The zero State is a counter never used, or expired.
//
// The arithmetic is float64 and mirrors the Lua scripts of the Redis store
// operation for operation, so that both stores decide alike to the bit.
// Counts and times are whole numbers far below 2^53 and exact; what is not
// a whole number (tokens, GCRA's lag) is kept small, relative to the time
// of its last update, so that it keeps its precision.
type State struct {
	Exists  bool
	A, B, C float64
	Log     []LogEntry // oldest first
}

// LogEntry is one admitted request in a sliding window log.
type LogEntry struct {
	At   float64 // µs
	Cost float64
}

// Result is one limit's answer to one request.
type Result struct {
	Allowed   bool
	Remaining int64 // what the limit could still admit after this request
	// ResetAt is when the limit is fully available again, in µs since the
	// Unix epoch.
	ResetAt int64
	// RetryAfter is, for a denied request, the shortest wait in µs after
	// which the same request would be allowed, barring other traffic.
	RetryAfter int64
	// Taken is what an allowing limit took: the cost, or a batch (see Op).
	Taken int64
	// OwnP and OwnN are, for a global limit, this region's slot of the
	// window after the request: what it counted up and down.
	OwnP, OwnN uint64
	// PrevP and PrevN are, for a global concurrency limit decided (not
	// settled), this region's slot of the window before, whose slots are
	// in flight still.
	PrevP, PrevN uint64
}

// Decide is one limit's decision on a request of the given cost at now
// (µs): the result and the state to store if the request goes ahead.
// Decide keeps no state of its own; for the log it may reuse s.Log.
func Decide(p Params, s State, now, cost int64) (Result, State) {
	var r Result
	decide(&p, &s, now, cost, &r)
	return r, s
}

// decide is Decide in place: it fills r and, if the request is allowed,
// turns s into the state to store. Pointers spare the hot path copies of
// State and Result at every call.
func decide(p *Params, s *State, now, cost int64, r *Result) {
	t, c := float64(now), float64(cost)
	switch p.Algorithm {
	case TokenBucket:
		tokenBucket(p, s, t, c, r)
	case GCRA:
		gcra(p, s, t, c, r)
	case FixedWindow:
		fixedWindow(p, s, t, c, r)
	case SlidingWindowCounter:
		slidingCounter(p, s, t, c, r)
	case SlidingWindowLog, Concurrency:
		slidingLog(p, s, t, c, r)
	default:
		panic("regional: unknown algorithm " + p.Algorithm.String())
	}
}

// chargeDebt counts a denied request's cost all the same (a rule's
// count_over_limit: the cost was spent before it was reported): a token
// bucket goes below zero and refills from there, GCRA's meter past its
// burst, a window's count past its limit. s is the state decide left (it
// changes nothing it denies); r becomes a denial as the counter stands
// after: its Remaining below zero by the debt, RetryAfter until the debt
// is paid (a check that counts nothing is allowed again), Taken the cost.
// A counter keeps at most debtCap past its limit. The sliding window log
// takes no debt (Rule.CountOverLimit).
func chargeDebt(p *Params, s *State, now, cost int64, r *Result) {
	t, c := float64(now), float64(cost)
	limit, window := float64(p.Limit), float64(p.Window)
	*r = Result{Taken: cost, ResetAt: now}
	switch p.Algorithm {
	case TokenBucket:
		tokens := fmax(tbTokens(p, s, t)-c, -debtCap(p))
		*s = State{Exists: true, A: tokens, B: t}
		r.Remaining = int64(math.Floor(tokens))
		r.RetryAfter = exactWait(t, -tokens*1e6/p.Rate, func(u float64) bool { return tbTokens(p, s, u) >= 0 })
		r.ResetAt += exactWait(t, (limit-tokens)*1e6/p.Rate, func(u float64) bool { return tbTokens(p, s, u) >= limit })
	case GCRA:
		debt := fmin(gcraDebt(p, s, t)+c, limit+debtCap(p))
		*s = State{Exists: true, A: debt, B: t}
		r.Remaining = gcraFits(debt, limit)
		r.RetryAfter = exactWait(t, (debt-limit)*1e6/p.Rate, func(u float64) bool { return gcraDebt(p, s, u) <= limit })
		r.ResetAt += exactWait(t, debt*1e6/p.Rate, func(u float64) bool { return gcraDebt(p, s, u) <= 0 })
	case FixedWindow:
		start, n := fwCount(p, s, t)
		n = fmin(n+c, limit+debtCap(p))
		*s = State{Exists: true, A: start, B: n}
		r.Remaining = int64(limit - n)
		r.RetryAfter = int64(start + window - t)
		r.ResetAt = int64(start + window)
	case SlidingWindowCounter:
		start, cur, prev := swcCounts(p, s, t)
		cur = fmin(cur+c, limit+debtCap(p))
		*s = State{Exists: true, A: start, B: cur, C: prev}
		r.Remaining = int64(math.Floor(limit - swcEstimate(window, start, cur, prev, t)))
		r.RetryAfter = exactWait(t, start+window-t, func(u float64) bool {
			start, cur, prev := swcCounts(p, s, u)
			return swcEstimate(window, start, cur, prev, u) <= limit
		})
		r.ResetAt = int64(start + 2*window)
	default:
		panic("regional: no debt for algorithm " + p.Algorithm.String())
	}
}

// maxDebt and maxDebtWait bound what a counter keeps past its limit
// (debtCap): counts stay exact in float64, and a key pays any debt within
// the longest period a rule may have.
const (
	maxDebt     = 1 << 40
	maxDebtWait = 366 * 86400e6 // µs
)

// debtCap is the most a counter keeps past its limit: 2^40, and for a
// bucket or GCRA no more than refills in maxDebtWait. More reported is
// counted as charged, and forgotten.
func debtCap(p *Params) float64 {
	if p.Rate > 0 {
		return fmin(maxDebt, p.Rate*maxDebtWait/1e6)
	}
	return maxDebt
}

// Allows reports whether a request of the given cost would be allowed at
// now (µs) against state s.
func Allows(p Params, s State, now, cost int64) bool {
	r, _ := Decide(p, cloneLog(s), now, cost)
	return r.Allowed
}

func cloneLog(s State) State {
	if s.Log != nil {
		s.Log = append([]LogEntry(nil), s.Log...)
	}
	return s
}

// exactWait turns a first estimate of a wait into the exact one: the shortest
// whole number of microseconds after which allows holds. allows is monotone
// in time. The estimate is usually right, and exactWait then asks allows twice;
// when rounding has put it off, it searches outward by doubling steps and
// then bisects, so the answer is exact however far off the estimate was.
func exactWait(now, wait float64, allows func(t float64) bool) int64 {
	w := fmax(1, math.Ceil(wait))
	var lo, hi float64 // allows(now+lo) is false (or lo is 0), allows(now+hi) true
	if allows(now + w) {
		if w == 1 || !allows(now+w-1) {
			return int64(w)
		}
		hi = w - 1
		step := 1.0
		for i := 0; i < 64; i++ {
			lo = fmax(0, hi-step)
			if lo == 0 || !allows(now+lo) {
				break
			}
			hi, step = lo, step*2
		}
	} else {
		lo = w
		step := 1.0
		for i := 0; i < 64; i++ {
			hi = lo + step
			if allows(now + hi) {
				break
			}
			lo, step = hi, step*2
		}
	}
	for hi-lo > 1 {
		mid := lo + math.Floor((hi-lo)/2)
		if allows(now + mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return int64(hi)
}

// fmax and fmin are Lua 5.1's math.max and math.min for two numbers: the
// first unless the second is greater (smaller). They inline, where
// math.Max and math.Min do not, and they are what the script computes.
func fmax(a, b float64) float64 {
	if b > a {
		return b
	}
	return a
}

func fmin(a, b float64) float64 {
	if b < a {
		return b
	}
	return a
}

// tbExpiryMargin keeps a token bucket's key past the moment it is full, so
// that a bucket that expired and one that refilled to the brim are the
// same to the bit.
const tbExpiryMargin = 1000 // µs

func tbTokens(p *Params, s *State, t float64) float64 {
	limit := float64(p.Limit)
	if !s.Exists {
		return limit
	}
	elapsed := fmax(0, t-s.B)
	return fmin(limit, s.A+elapsed*p.Rate/1e6)
}

func tokenBucket(p *Params, s *State, now, cost float64, r *Result) {
	limit := float64(p.Limit)
	tokens := tbTokens(p, s, now)
	if tokens >= cost {
		r.Allowed = true
		tokens -= cost
		*s = State{Exists: true, A: tokens, B: now}
	} else {
		r.RetryAfter = exactWait(now, (cost-tokens)*1e6/p.Rate, func(t float64) bool { return tbTokens(p, s, t) >= cost })
	}
	r.Remaining = int64(math.Floor(tokens))
	r.ResetAt = int64(now)
	if tokens < limit {
		r.ResetAt += exactWait(now, (limit-tokens)*1e6/p.Rate, func(t float64) bool { return tbTokens(p, s, t) >= limit })
	}
}

// gcraDebt is what the meter holds at t, in units of cost: it drains at the
// rate. Counting in units of cost rather than of time keeps whole costs
// exact, however high the rate. (GCRA is the token bucket seen from the
// other side: tokens are the burst less the debt.)
func gcraDebt(p *Params, s *State, t float64) float64 {
	if !s.Exists {
		return 0
	}
	elapsed := fmax(0, t-s.B)
	return fmax(0, s.A-elapsed*p.Rate/1e6)
}

// gcraFits is how many more units of cost fit a meter holding debt: the
// largest n with debt + n within the burst, as decisions test it.
func gcraFits(debt, burst float64) int64 {
	n := math.Floor(burst - debt)
	for i := 0; i < 2 && debt+(n+1) <= burst; i++ {
		n++
	}
	for i := 0; i < 2 && n > 0 && debt+n > burst; i++ {
		n--
	}
	return int64(n)
}

func gcra(p *Params, s *State, now, cost float64, r *Result) {
	burst := float64(p.Limit)
	debt := gcraDebt(p, s, now)
	if next := debt + cost; next <= burst {
		r.Allowed = true
		debt = next
		*s = State{Exists: true, A: next, B: now}
	} else {
		r.RetryAfter = exactWait(now, (next-burst)*1e6/p.Rate, func(t float64) bool { return gcraDebt(p, s, t)+cost <= burst })
	}
	r.Remaining = gcraFits(debt, burst)
	r.ResetAt = int64(now)
	if debt > 0 {
		r.ResetAt += exactWait(now, debt*1e6/p.Rate, func(t float64) bool { return gcraDebt(p, s, t) <= 0 })
	}
}

func fwCount(p *Params, s *State, t float64) (start, n float64) {
	window := float64(p.Window)
	start = math.Floor(t/window) * window
	if s.Exists && s.A == start {
		n = s.B
	}
	return start, n
}

func fixedWindow(p *Params, s *State, now, cost float64, r *Result) {
	limit, window := float64(p.Limit), float64(p.Window)
	start, n := fwCount(p, s, now)
	if n+cost <= limit {
		r.Allowed = true
		n += cost
		*s = State{Exists: true, A: start, B: n}
	} else {
		r.RetryAfter = exactWait(now, start+window-now, func(t float64) bool {
			_, n := fwCount(p, s, t)
			return n+cost <= limit
		})
	}
	r.Remaining = int64(limit - n)
	r.ResetAt = int64(start + window)
}

func swcCounts(p *Params, s *State, t float64) (start, cur, prev float64) {
	window := float64(p.Window)
	start = math.Floor(t/window) * window
	if s.Exists {
		if s.A == start {
			cur, prev = s.B, s.C
		} else if s.A == start-window {
			prev = s.B
		}
	}
	return start, cur, prev
}

// swcEstimate weighs the previous window's count by how much of it the
// sliding window still covers.
func swcEstimate(window, start, cur, prev, t float64) float64 {
	return float64(prev*((window-(t-start))/window)) + cur
}

func slidingCounter(p *Params, s *State, now, cost float64, r *Result) {
	limit, window := float64(p.Limit), float64(p.Window)
	start, cur, prev := swcCounts(p, s, now)
	if swcEstimate(window, start, cur, prev, now)+cost <= limit {
		r.Allowed = true
		cur += cost
		*s = State{Exists: true, A: start, B: cur, C: prev}
	} else {
		// Either the previous window's weight must shrink enough, or, if
		// this window alone is too full, the next window's must.
		var at float64
		if cur+cost <= limit {
			at = start + (window - (limit-cur-cost)*window/prev)
		} else {
			at = start + window + fmax(0, window-(limit-cost)*window/cur)
		}
		r.RetryAfter = exactWait(now, at-now, func(t float64) bool {
			start, cur, prev := swcCounts(p, s, t)
			return swcEstimate(window, start, cur, prev, t)+cost <= limit
		})
	}
	r.Remaining = int64(math.Floor(limit - swcEstimate(window, start, cur, prev, now)))
	switch {
	case cur > 0:
		r.ResetAt = int64(start + 2*window)
	case prev > 0:
		r.ResetAt = int64(start + window)
	default:
		r.ResetAt = int64(now)
	}
}

// trimLog drops the entries that have left the window at now.
func trimLog(p *Params, s *State, now float64) (sum float64, log []LogEntry) {
	sum, log = s.A, s.Log
	for len(log) > 0 && log[0].At <= now-float64(p.Window) {
		sum -= log[0].Cost
		log = log[1:]
	}
	return sum, log
}

func slidingLog(p *Params, s *State, now, cost float64, r *Result) {
	limit, window := float64(p.Limit), float64(p.Window)
	sum, log := trimLog(p, s, now)
	if sum+cost <= limit {
		r.Allowed = true
		if cost > 0 {
			sum += cost
			at := now
			if n := len(log); n > 0 && p.Algorithm == Concurrency && log[n-1].At >= now {
				at = log[n-1].At + 1 // a slot's time is its own (slotAt)
			}
			log = append(log, LogEntry{At: at, Cost: cost})
			*s = State{Exists: true, A: sum, B: s.B + 1, Log: log}
		}
	} else {
		freed := 0.0
		for _, e := range log {
			freed += e.Cost
			if sum-freed+cost <= limit {
				r.RetryAfter = int64(e.At + window - now)
				break
			}
		}
	}
	r.Remaining = int64(limit - sum)
	r.ResetAt = int64(now)
	if n := len(log); n > 0 {
		r.ResetAt = int64(log[n-1].At + window)
	}
}

// ttl is how long, in µs after now, a counter's stored state matters: past
// it the state is the same as none, so the store may drop it.
func ttl(p *Params, s *State, now int64) int64 {
	t := float64(now)
	var until float64
	switch p.Algorithm {
	case TokenBucket:
		until = t + math.Ceil((float64(p.Limit)-s.A)*1e6/p.Rate) + tbExpiryMargin
	case GCRA:
		until = s.B + math.Ceil(s.A*1e6/p.Rate) + tbExpiryMargin
	case FixedWindow:
		until = s.A + float64(p.Window)
	case SlidingWindowCounter:
		until = s.A + 2*float64(p.Window)
	case SlidingWindowLog, Concurrency:
		if n := len(s.Log); n > 0 {
			until = s.Log[n-1].At + float64(p.Window)
		}
	}
	return max(1, int64(until-t))
}
