package regional

import (
	"math"
	"time"
)

// A reservation holds a request's estimated cost against regional limits
// until its cost is known. Reserving is a check of the estimate, nothing
// more: what settling it needs — each counter's key and limit, the
// estimate, when it was taken, when the reservation ends — travels in its
// id, sealed by the region (reserve.go), so that a store keeps nothing of
// a reservation until it is settled. Settling it commits the actual cost
// (the difference given back into the window the estimate was taken in,
// or taken, past the limit as debt) or releases it (the estimate given
// back), and keeps, under the counter, that it was settled and what it
// charged, until the reservation would have ended: the same settlement
// sent again changes nothing and is answered alike. One never settled is
// charged its estimate — it stays taken — and is unknown once it ends.
// Both stores settle alike to the bit (TestStoresSettleAlike).

// MaxReservationTTL is the longest a reservation may hold.
const MaxReservationTTL = time.Hour

// maxSettled is the least bound on the settlements a counter keeps of
// reservations that end in one minute (settledBucket; settledCap):
// reserving and releasing over and over costs a client nothing of its
// limit, and each settlement is kept until its reservation ends. Past the
// bound, a settlement is refused (Settlement.Full). limits.lua's
// MAX_SETTLED is the same.
const maxSettled = 10_000

// settledCap is the bound on a counter's settlements of reservations that
// end in one minute: twice what the counter can admit in a minute (each
// reservation took at least 1 of it, so a counter's own traffic stays well
// within), at least maxSettled, at most 2^40. limits.lua's settled_cap
// computes it alike.
func settledCap(p Params) int {
	per := float64(p.Limit)
	switch p.Algorithm {
	case TokenBucket, GCRA:
		per += p.Rate * 60
	default:
		per *= math.Ceil(60e6 / float64(p.Window))
	}
	return int(max(maxSettled, math.Floor(math.Min(2*per, 1<<40))))
}

// settleExpired, as a settlement's actual cost, releases a reservation
// that ended unsettled, whose rule refunds it (Rule.RefundOnExpiry): made
// past its end, once, as any settlement — after a commit or release it
// changes nothing.
const settleExpired = -2

// settledBucket is the minute (from the Unix epoch) in which a
// reservation that ends at until (µs) ends: a counter keeps the
// settlements of such reservations together, until a minute after that
// minute ends.
func settledBucket(until int64) int64 { return (until-1)/60e6 + 1 }

// SettleOp is one counter of a reservation to settle: what its id says.
type SettleOp struct {
	Key    []byte
	Params Params
	// Estimate is what the reservation took, at At (µs, the store's time);
	// for a slot of a global concurrency limit, its number in the window
	// that starts at At (the region's P after it was taken), which its
	// release takes out of the window's slots in flight.
	Estimate, At int64
	// Stale says the counter's limit is no longer Params (the rules
	// changed): the settlement is kept, the counter is not touched (its
	// state is another limit's), and the estimate stays taken.
	Stale bool
	// Global marks a global limit's counter (global.go): the estimate was
	// counted in the region's P; what comes back goes to its N, in the
	// window the estimate was taken in while that window holds, and what
	// a commit charges past the estimate to its P. Allowance and Ceiling
	// are the limit's as a check would have them now (Op's), for the
	// answer.
	Global             bool
	Allowance, Ceiling int64
}

// Settlement is what settling a reservation did to one of its counters.
type Settlement struct {
	// Ended: the reservation had ended by the store's clock, and nothing
	// was done (its estimate stays charged). Full: the counter keeps as
	// many settlements as it may (settledCap), and nothing was done.
	Ended, Full bool
	// Again: the counter's part was settled before and nothing changed;
	// Charged is what the first settlement charged (0 for a release).
	Again   bool
	Charged int64
	// Result is, for a cost above the estimate, the decision on the
	// difference (counted as debt where it does not fit); otherwise the
	// counter as a check of cost 0 sees it: Remaining below zero by a
	// debt.
	Result Result
}

// settledMarks are a counter's settlements of reservations that end in one
// minute (settledBucket), by mark, as the memory store keeps them until a
// minute after that minute ends (an expiry comes after the end);
// limits.lua keeps a hash.
type settledMarks struct {
	charged map[string]int64
	until   int64 // µs
}

// settle settles op on the counter's state s at now (µs): a commit of the
// actual cost (actual >= 0) or a release (actual < 0). It turns s into the
// state to store and reports whether it changed. A sliding window log
// takes no debt: a difference that does not fit is not counted. A
// concurrency limit's slot is freed, committed or released.
func settle(op *SettleOp, s *State, now, actual int64, out *Settlement) bool {
	p := &op.Params
	if p.Algorithm == Concurrency {
		actual = -1 // the request is over, whatever it cost: its slot is free
	}
	*out = Settlement{Charged: max(0, actual)}
	extra := actual - op.Estimate
	if actual < 0 || extra <= 0 {
		back := op.Estimate
		if actual >= 0 {
			back = -extra
		}
		var given int64
		if back > 0 {
			*s, given = giveBack(*p, *s, now, back, op.At)
		}
		out.Result = inspect(*p, *s, now)
		return given > 0
	}
	changed := false
	decide(p, s, now, extra, &out.Result)
	switch {
	case out.Result.Allowed:
		changed = true
	case p.Algorithm != SlidingWindowLog:
		chargeDebt(p, s, now, extra, &out.Result)
		changed = true
	}
	if changed {
		out.Result.Taken = extra
	}
	return changed
}
