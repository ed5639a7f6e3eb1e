// Package coord is globalsync's brain, as a pure state machine: the
// Coordinator. globalsync's daemon (cmd/globalsync) drives it over NATS
// and JetStream KV; the simulator (sim) over its modelled network; both
// run the very same code.
//
// # What it does
//
// Every regiond replica's heartbeat reaches globalsync's observer gossip
// node (transport/gossip), which hands it to the coordinator (Heartbeat):
// the replica's demand (admitted plus denied, in limits, cumulative), the
// lease it may acknowledge, what it used of its window, and the limit it
// enforces. The coordinator is also the node's Counters: it keeps a copy
// of every region's usage from the gossip.
//
// One globalsync instance leads (the daemon holds a lease in NATS KV,
// taken with compare-and-swap). The coordinator that starts to lead first
// restores what the leaders before it published (Restore): every lease
// that may still be in force, their high-water marks, acknowledgements and
// debt, and how far the books are closed, so that a strict limit holds
// across the change. Then, every rebalance (1s), Rebalance closes the
// books of the windows that have settled and returns one budget.Document
// per global rule, for the daemon to publish: each region's lease, from
// its replicas' demand summed (budget.Allocator). A region's floor is
// never given away; a region whose replicas last reported a higher limit
// (they have not heard it was lowered) keeps its floor of that limit.
//
// Closing the books: once a window has ended and the gossip has settled
// (an anti-entropy round and two rebalances), a counter whose regions
// together admitted more than its limit in force while the window ran is
// over-admission, put on the regions that went beyond their grants
// (budget.Attribute) and, for a carry_debt rule, withheld from their next
// windows. It needs the rules the regions enforce (SetRules).
//
// What is granted and what is enforced: a region cut off does not receive
// the leases published for it, and runs on its last lease until that
// expires, then on its floor. Each replica names in its heartbeat the
// lease it holds; Enforced tells from it, and the documents that lease
// came in, whether the region still holds a lease or is on its floor.
// A coordinator that follows is given the leader's documents (Observe),
// so that its Budgets, Figures and Enforced show the leases in force.
//
// # Use
//
//	c, _ := coord.New(coord.Config{ID: "gs-1", Regions: regions})
//	c.SetRules(now, rules)
//	// gossip: gossip.Config{Region: coord.Name, Observer: true, Counters: c, Heartbeats: c}
//	c.Restore(history)                // on taking the lead
//	docs, found, err := c.Rebalance(now) // every second, while leading: publish docs
//	c.Tick(now)                       // every second, leader or not
//	c.Observe(doc)                    // following: each document the leader publishes
//	c.Enforced(now)                   // what each region's replicas say they enforce
//
// Nothing here does I/O, reads a clock or starts a goroutine; a
// Coordinator is not safe for concurrent use.
package coord
