package regional

import "time"

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

// SettleOp is one counter of a reservation to settle: what its id says.
type SettleOp struct {
	Key    []byte
	Params Params
	// Estimate is what the reservation took, at At (µs, the store's time).
	Estimate, At int64
}

// Settlement is what settling a reservation did to one of its counters.
type Settlement struct {
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

// settledMark is what the memory store keeps of a settled counter of a
// reservation, until the reservation ends.
type settledMark struct {
	charged, until int64
}

// settle settles op on the counter's state s at now (µs): a commit of the
// actual cost (actual >= 0) or a release (actual < 0). It turns s into the
// state to store and reports whether it changed. A sliding window log
// takes no debt: a difference that does not fit is not counted.
func settle(op *SettleOp, s *State, now, actual int64, out *Settlement) bool {
	p := &op.Params
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
