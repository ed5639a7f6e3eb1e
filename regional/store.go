package regional

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/geoquota/geoquota/crdt"
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
	// Settle settles a reservation (reservation.go) on each of its counters:
	// a commit of its actual cost (actual >= 0) or a release (actual < 0).
	// The settlement of each counter is kept under the name mark (unique to
	// the reservation) until the reservation ends at until (µs, the store's
	// time), so that it is made once. It returns the store's time.
	Settle(ctx context.Context, ops []SettleOp, mark string, until, actual int64, out []Settlement) (int64, error)
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
	// Debt counts the cost whatever the decision (Rule.CountOverLimit):
	// past the limit, as debt (chargeDebt; a global limit's in the
	// region's slot, past its allowance), and whether or not the request
	// goes ahead. Not for sliding_window_log or batches.
	Debt bool
	// Batch, if positive, asks the limit to take up to Batch at once (at
	// least Cost, as much as it has up to Batch); Result.Taken says how
	// much it took. Not for sliding_window_log.
	Batch int64
	// Global marks a global limit (fixed_window or sliding_window_counter):
	// the region admits within Allowance of its own count, or, with a
	// Ceiling of 0 or more (elastic mode), while the global count stays
	// within Ceiling. See global.go.
	Global    bool
	Allowance int64
	Ceiling   int64
	// KnownP and KnownN are what the engine knows this region counted in
	// the window starting at KnownStart (Unix ms): a store that has less
	// (it lost its data) is raised to them before it decides.
	KnownStart     int64
	KnownP, KnownN uint64
}

// decideOp decides one op against state s, in place (see decide), taking a
// batch if it asks for one.
func decideOp(op *Op, s *State, now int64, r *Result) {
	if op.Global {
		panic("regional: decideOp on a global limit")
	}
	cost := op.Cost
	if op.Batch > 0 {
		var avail Result
		probe := *s
		decide(&op.Params, &probe, now, 0, &avail)
		cost = max(op.Cost, min(op.Batch, avail.Remaining))
	}
	*r = Result{}
	decide(&op.Params, s, now, cost, r)
	switch {
	case r.Allowed:
		r.Taken = cost
	case op.Debt && cost > 0:
		chargeDebt(&op.Params, s, now, cost, r)
	}
}

// writes reports whether a store keeps the state decideOp left for op:
// that of a limit that took something, if the request goes ahead (commit)
// or the limit counts debt. A check of cost 0 writes nothing.
func writes(op *Op, r *Result, commit bool) bool {
	return r.Taken > 0 && (commit || op.Debt)
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

// GlobalStore is a store that keeps the slots of global counters (see
// global.go) and takes in other regions' slots. Implementations are safe
// for concurrent use.
type GlobalStore interface {
	// MergeGlobal raises each slot of each window to at least what is
	// given (per-slot maximum; nothing is ever lowered) and returns how
	// many fields it raised.
	MergeGlobal(ctx context.Context, windows []GlobalWindow) (int, error)
	// ReadGlobal returns the slots of one window, in region order.
	ReadGlobal(ctx context.Context, key []byte, startMillis int64) ([]crdt.Slot, error)
	// AddGlobal counts in this region's slot what a replica admitted of
	// each window without the store (see degraded.go), and sets slots[i]
	// to the region's slot of adds[i]'s window after. Each add gives the
	// replica's total for the window: the store counts what it has not
	// yet counted of that replica's, so a retry counts nothing twice.
	AddGlobal(ctx context.Context, adds []GlobalAdd, slots []crdt.Slot) error
	// Heartbeat records what this replica says of itself (unwritten: its
	// windows admitted without the store and not yet written) and returns
	// what every replica of the region heard within keep said, with the
	// store's time (µs).
	Heartbeat(ctx context.Context, replica string, unwritten int64, keep time.Duration) ([]ReplicaState, int64, error)
}

// ReplicaState is what a replica of the region last said of itself in the
// store (GlobalStore.Heartbeat).
type ReplicaState struct {
	Replica   string
	Unwritten int64
	At        int64 // µs, the store's time
}

// GlobalAdd is what one replica admitted of a global counter's window
// while the store could not answer.
type GlobalAdd struct {
	Key         []byte // the counter's key
	StartMillis int64  // the window's start, Unix milliseconds
	// TTL is how long a window that did not exist yet is kept.
	TTL     time.Duration
	Replica string
	// Admitted is everything the replica admitted of the window without
	// the store, written before or not.
	Admitted uint64
	// KnownP and KnownN are what the replica knows of the region's slot:
	// a store that lost it is raised to them first.
	KnownP, KnownN uint64
}

// GlobalWindow is some slots of one window of a global counter.
type GlobalWindow struct {
	Key         []byte // the counter's key
	StartMillis int64  // the window's start, Unix milliseconds
	// TTL is how long a window that did not exist yet is kept.
	TTL   time.Duration
	Slots []crdt.Slot
}

// slotsOf turns a window's fields into slots, in region order.
func slotsOf(fields map[string]uint64) []crdt.Slot {
	byRegion := map[string]*crdt.Slot{}
	for f, v := range fields {
		r, neg := strings.CutPrefix(f, "-")
		s := byRegion[r]
		if s == nil {
			s = &crdt.Slot{Region: r}
			byRegion[r] = s
		}
		if neg {
			s.N = v
		} else {
			s.P = v
		}
	}
	out := make([]crdt.Slot, 0, len(byRegion))
	for _, s := range byRegion {
		if s.P != 0 || s.N != 0 {
			out = append(out, *s)
		}
	}
	slices.SortFunc(out, func(a, b crdt.Slot) int { return strings.Compare(a.Region, b.Region) })
	return out
}
