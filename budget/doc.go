// Package budget decides each region's share of every global limit: shares
// follow where the demand is, never fall below a region's floor, keep a
// reserve that is never handed out by demand, change with hysteresis, and
// are leases with an expiry, so that a cut-off region's share is not given
// away before it has lapsed. Over-admission found after a partition is
// carried forward as debt.
//
// # Model
//
// All figures are fractions of a rule's limit, so that one set of shares
// serves every counter of the rule, whatever each key's own limit. A
// region may always use its floor: the reserve (Config.Reserve, 10% by
// default) split evenly over the known regions. The rest of the limit is
// handed out as shares, by demand (admitted plus denied-for-budget, in
// limits per window, smoothed), by water-filling: every region gets what it
// asks for up to an equal level, and what nobody asks for goes to regions
// in proportion to their demand.
//
// A Lease gives one region floor plus share until its expiry. The region
// enforces Lease.Allowance while the lease holds (by its own clock) and its
// floor after; see Allowance. A lease of a rule also says why its share is
// what it is (Lease.Reason): the step of the rebalance that decided it,
// for operators to read; it changes nothing.
//
// # Strict safety
//
// The Allocator never lets the regions together admit more than the limit
// in any window, whatever the order in which leases arrive or lapse. A
// region may hold several leases at once (a newer one may not have reached
// it), so for each window the allocator keeps, per region, the largest
// fraction the region may have used in it (its high-water mark) and grants
// more only out of room that no high-water mark covers. A lease stops
// counting when it has expired and the skew allowance has passed, or when
// the region reports (Report.Acked) that it has moved to a newer one.
// Lowering a region's fraction frees, in the window in course, only what
// the region reports it has not used (Report.Used) once it acknowledges
// the lower lease; the rest from the next window on.
//
// # Use
//
// globalsync's coordinator (budget/coord) feeds each region's reports and
// calls Rebalance once per rebalance interval per global rule, and the
// daemon publishes the leases as one Document per rule. The package
// is pure: it takes the time as an argument, does no I/O and starts no
// goroutines, so globalsync and the simulator run the same code. An
// Allocator is not safe for concurrent use.
package budget
