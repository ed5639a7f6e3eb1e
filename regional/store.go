package regional

import (
	"context"
	"time"
)

// Store holds the counters of a region and applies requests to them.
// Implementations are safe for concurrent use.
type Store interface {
	// Apply decides the limits of one request together, at the store's own
	// time, which it returns (µs since the Unix epoch). If every enforced
	// (non-shadow) limit allows, each allowing limit takes its cost;
	// otherwise none does, so a denied request costs nothing. results[i]
	// answers ops[i].
	Apply(ctx context.Context, ops []Op, results []Result) (now int64, err error)
	// Inspect reports a counter's state as a request of cost 0 would see
	// it, changing nothing.
	Inspect(ctx context.Context, key []byte, p Params) (Result, error)
	// Reset forgets a counter: it starts afresh.
	Reset(ctx context.Context, key []byte, p Params) error
	// Grant gives a counter n more: a window's count goes down by n (below
	// zero if need be, so that the window admits more than its limit); a
	// token bucket or GCRA fills by n, at most to full; a log forgets its
	// newest n units.
	Grant(ctx context.Context, key []byte, p Params, n int64) (Result, error)
	// Refund gives back n that a request took at time at (µs, the store's
	// time): only into the window it was taken in, so that what a window
	// did not use cannot be spent in the next one. It returns how much it
	// gave back.
	Refund(ctx context.Context, key []byte, p Params, n, at int64) (int64, error)
}

// timedStore is a store that bounds its calls itself: the engine hands it
// a deadline rather than a context per call, which would cost every check
// a timer.
type timedStore interface {
	applyUntil(ctx context.Context, ops []Op, results []Result, deadline time.Time) (int64, error)
}

// Op is one limit of a request, for a store to apply.
type Op struct {
	Key    []byte // the counter's key, as built by the engine
	Params Params
	Cost   int64
	Shadow bool // counted when it allows, never denies
	// Lease, if positive, asks the limit to take up to Lease at once (at
	// least Cost, as much as it has up to Lease); Result.Taken says how
	// much it took. Not for sliding_window_log.
	Lease int64
}

// decideOp decides one op against state s, in place (see decide), taking a
// lease if it asks for one.
func decideOp(op *Op, s *State, now int64, r *Result) {
	cost := op.Cost
	if op.Lease > 0 {
		var avail Result
		probe := *s
		decide(&op.Params, &probe, now, 0, &avail)
		cost = max(op.Cost, min(op.Lease, avail.Remaining))
	}
	*r = Result{}
	decide(&op.Params, s, now, cost, r)
	if r.Allowed {
		r.Taken = cost
	}
}

// commits reports whether a request goes ahead: every enforced limit allows.
func commits(ops []Op, results []Result) bool {
	for i := range ops {
		if !ops[i].Shadow && !results[i].Allowed {
			return false
		}
	}
	return true
}
