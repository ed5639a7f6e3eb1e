// Package crdt holds the counters that let regions agree on global usage
// without coordinating: grow-only counters (GCounter), counters that also
// count down (PNCounter), a collection of them per counter key and window
// epoch (Counters), the deltas regions exchange, and the compact binary
// encoding those travel in.
//
// # Model
//
// Every region owns one slot of every counter and only ever raises it. A
// counter's value is the sum of the slots. Replicas merge by taking the
// maximum of each slot, which is commutative, associative and idempotent:
// messages may arrive late, twice, or out of order, and replicas that have
// seen the same updates hold the same state. Usage admitted in a window is
// counted in P; grants and refunds of quota in N.
//
// # Using Counters
//
// A region keeps a Counters for its own slots and the copies of everyone
// else's:
//
//	c, _ := crdt.NewCounters("us-east", []string{"us-east", "eu-west", "ap-south"})
//	id := crdt.ID{Key: "tenant-global/sk_prod_1", Epoch: windowStartMillis}
//	c.Inc(id, 1)                      // admitted one request
//	d := c.OwnDeltaSince(published)   // our slots changed since the last gossip
//	msg, _ := crdt.AppendDelta(nil, d)
//	published = d.To
//
// and on the receiving side:
//
//	d, err := crdt.DecodeDelta(msg)   // malformed input is an error, never a panic
//	report := c.Merge(d)              // replayed or regressing slots are ignored and counted
//
// Every change gets a version, and a delta says which versions it covers
// (From, To]: a receiver that finds a range missing (a delta lost) asks the
// sender for OwnDeltas since the last version it holds without a gap, and
// merges them; a region that lost its own slots gets them back from
// another's RegionState.
//
// Old windows are dropped with Expire; removal is local and not gossiped.
//
// # Guarantees
//
// Merge never lowers a slot. A delta naming a region outside the set given
// to NewCounters, or sent by one, is ignored and reported in the
// MergeReport, so the transport can count it. Increments saturate instead of
// wrapping. Nothing in this package does I/O, reads a clock or starts a
// goroutine; a Counters is not safe for concurrent use.
//
// # Size
//
// The encoding sends each region name once per message and prefix-compresses
// the sorted keys, so a change costs a few bytes: see BenchmarkEncodeSize for
// the figures per (key, epoch, slot) change.
package crdt
