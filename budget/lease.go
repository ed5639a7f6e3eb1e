package budget

import "time"

// Lease is one region's budget for one global rule: it may admit, in every
// window, up to Allowance of the rule's limit while the lease holds.
type Lease struct {
	Rule string
	// Key is the counter (its key within the rule) of a lease of a
	// counter's own budget, empty for the rule's lease, which serves its
	// other counters.
	Key    string
	Region string
	// Shard is the slice of the rule's counters the lease serves, of the
	// Shards its document names (see ShardOf); 0 when globalsync is not
	// sharded.
	Shard int
	// Seq numbers the rule's rebalances: a newer lease has a larger Seq. A
	// region reports the newest it holds (Report.Acked), which lets the
	// allocator stop counting the older ones.
	Seq uint64
	// Floor is what the region may use without a lease; Share is what it
	// holds above the floor. Both are fractions of the limit.
	Floor, Share float64
	// Debt is withheld from the allowance for over-admission in an earlier
	// window (carry_debt).
	Debt    float64
	Issued  time.Time
	Expires time.Time
	// Reason says why the share is what it is (a rule's lease only).
	Reason Reason
	// Released, on a lease of a counter's own budget (Key), says the
	// counter has no more leases: the region enforces the one it holds
	// (or its floor) until then, and its rule's lease from then on. Floor,
	// Share and Expires are unset, but on the last leases of a counter
	// released to make room for another (Allocator.Release), which the
	// region takes and holds until then, its floor as high as the lease.
	Released time.Time
}

// Last reports whether the lease is the last of a counter released to
// make room for another: one to take, with its release.
func (l *Lease) Last() bool { return !l.Released.IsZero() && l.Floor+l.Share > 0 }

// Allowance is the fraction of the limit the lease lets its region admit
// per window.
func (l *Lease) Allowance() float64 { return max(0, l.Floor+l.Share-l.Debt) }

// Holds reports whether the lease is in force at now, by the region's own
// clock.
func (l *Lease) Holds(now time.Time) bool { return now.Before(l.Expires) }

// Allowance is what a region enforces at now: its lease's allowance while
// the lease holds, and its floor otherwise (no lease yet, or lapsed).
func Allowance(l *Lease, floor float64, now time.Time) float64 {
	if l != nil && l.Holds(now) {
		return l.Allowance()
	}
	return floor
}
