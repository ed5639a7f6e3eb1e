// Package budget decides each region's share of every global limit: shares
// follow where the demand is, never fall below a region's floor, keep a
// reserve that is never handed out, change with hysteresis, and are leases
// with an expiry so that a cut-off region's share is not given away before
// it has lapsed. Over-admission found after a partition is carried as debt.
//
// Like crdt, the package is pure: it takes the time as an argument, does no
// I/O and starts no goroutines, so globalsync and the simulator run the same
// code.
//
// Status: not built yet; see the project README.
package budget
