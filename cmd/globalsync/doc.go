// Command globalsync is the global budget and reconciliation service: it
// merges every region's usage, hands each region its share of every global
// limit as a lease, publishes rules, and settles the books after a partition.
//
// Status: not built yet; see the project README.
package main
