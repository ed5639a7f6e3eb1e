package regional

import (
	"math"
	"strconv"
)

// A global limit (scope: global) counts, per window, what each region
// admitted: a G-counter per (counter key, window), one slot per region,
// stored as a hash with a field per region (its P) and, for what was given
// back, a field "-region" (its N). The hash's key is the counter key, a
// colon and the window's start in Unix milliseconds (GlobalKey). The Redis
// and in-memory stores keep the same fields; gossip brings in the other
// regions' slots (MergeGlobal), each the maximum of what was held and what
// arrived — into a shared store. An engine whose store is its own memory
// keeps global counters in its copy of the counters alone, and its store
// decides against that (MemoryStore.copy): one window per counter, not
// two.
//
// A region admits a request if its own count stays within its allowance
// (its budget lease, in units of the limit) or, in elastic mode, if the
// global count stays within the ceiling (the limit less a headroom).

// globalGrace keeps a global window's slots after the window ends, for
// gossip and reconciliation to finish with it: one more window, and at
// least a minute.
const globalGrace = 60e6 // µs

// GlobalKey is the key of a global counter's window that starts at
// startMillis (Unix milliseconds).
func GlobalKey(key []byte, startMillis int64) []byte {
	return appendGlobalKey(nil, key, startMillis)
}

func appendGlobalKey(dst, key []byte, startMillis int64) []byte {
	dst = append(dst, key...)
	dst = append(dst, ':')
	return strconv.AppendInt(dst, startMillis, 10)
}

// globalView is what a store reads of one window of a global counter: this
// region's P and N, and the sum of every region's P less their N.
type globalView struct {
	p, n, total float64
}

// globalWindows is the start of the window that holds now and of the one
// before, in µs.
func globalWindows(p *Params, now float64) (start, prev float64) {
	window := float64(p.Window)
	start = math.Floor(now/window) * window
	return start, start - window
}

// decideGlobal decides one global limit: cur is the window that holds now,
// prev the one before (used by a sliding window counter). ceiling < 0 is
// strict mode: the region admits within its allowance. In elastic mode it
// admits while the global count it sees stays within the ceiling, or
// within its allowance while that count stays within the limit.
func decideGlobal(p *Params, cur, prev *globalView, now, cost, allowance, ceiling float64, r *Result) {
	window := float64(p.Window)
	start, _ := globalWindows(p, now)
	own, total := cur.p-cur.n, cur.total
	switch p.Algorithm {
	case SlidingWindowCounter:
		own = swcEstimate(window, start, own, prev.p-prev.n, now)
		total = swcEstimate(window, start, total, prev.total, now)
	case Concurrency:
		// Slots taken in the window before are in flight still.
		own += prev.p - prev.n
		total += prev.total
	}
	allowed := own+cost <= allowance
	rem := allowance - own
	if ceiling >= 0 {
		// Elastic: the region borrows up to the ceiling, and its own
		// allowance holds only within the limit as it sees it, since
		// others may have borrowed the room it would have used.
		limit := float64(p.Limit)
		allowed = (allowed && total+cost <= limit) || total+cost <= ceiling
		rem = fmax(fmin(rem, limit-total), ceiling-total)
	}
	if allowed {
		rem -= cost
		r.Allowed = true
	} else {
		r.RetryAfter = int64(start + window - now)
	}
	r.Remaining = int64(math.Floor(fmax(0, rem)))
	r.ResetAt = int64(start + window)
}

// globalTTL is how long, in µs after now, a window starting at start is
// kept.
func globalTTL(p *Params, start, now float64) int64 {
	return max(1, int64(globalUntil(p, start)-now))
}

// globalUntil is when a window starting at start stops mattering.
func globalUntil(p *Params, start float64) float64 {
	window := float64(p.Window)
	until := start + window + fmax(window, globalGrace)
	if p.carriesPrev() {
		until += window
	}
	return until
}

// slotWindow is the start of the window a global concurrency limit's slot
// taken at at (µs) is counted in, and whether it counts at now: that
// window is now's or the one before.
func slotWindow(p *Params, at, now int64) (taken float64, counts bool) {
	start, prev := globalWindows(p, float64(now))
	taken, _ = globalWindows(p, float64(at))
	return taken, taken == start || taken == prev
}

// carriesPrev says whether a global limit's count carries the window
// before: a sliding window counter's estimate weighs it, and a
// concurrency limit's slots taken in it are in flight still. A global
// concurrency limit counts a slot in the window (its ttl long) it was
// taken in and the next, less what was released: a slot never released
// frees itself between one ttl and two after it was taken.
func (p *Params) carriesPrev() bool {
	return p.Algorithm == SlidingWindowCounter || p.Algorithm == Concurrency
}
