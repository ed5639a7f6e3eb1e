// Package gossip is the protocol by which regions keep each other's usage
// of global limits, as a pure state machine: Node. The daemons drive it
// over NATS (transport/control), and the simulator (sim) over its modelled
// network, so that both run the very same protocol.
//
// # Protocol
//
// Every replica of a region sends the region's slots of the global
// counters changed since its last delta (<prefix>.delta.<region>, every
// 250ms), and merges the other regions' into its engine (per-slot
// maximum). Every 10s the replica its region elected sends the region's
// digest (<prefix>.digest.<region>); every other region's elected replica
// answers with what the digest shows missing (<prefix>.repair.<to>.<from>).
// Every replica reports its demand and the leases it may acknowledge to
// globalsync (<prefix>.heartbeat.<region>, every 500ms). A region silent
// for longer than three heartbeats that is heard again (a partition
// healed) is sent the digest at once, and again a second and two seconds
// later, and its first digest since is answered with another: a NATS
// gateway redials each way on its own, and a digest sent on a way still
// cut is lost. globalsync takes part as an observer: it merges every delta
// and the repairs it asks for with its own digest, and hears the
// heartbeats.
//
// Messages carry the sending replica, its instance (a restarted replica
// numbers afresh) and a sequence number in headers. A message that is
// malformed, replayed, sent under another region's name than its subject's,
// a delta carrying slots not its sender's, or slots of an unknown region or
// going backwards, is counted (Stats) and never merged.
//
// # Use
//
//	n, _ := gossip.New(gossip.Config{Region: "eu", Replica: "eu-1", Counters: engine, Engine: engine}, time.Now())
//	for _, subject := range n.Subscriptions() { /* subscribe; hand each message to n.Step */ }
//	for { /* at n.Next(): */ send(n.Tick(time.Now())) }
//
// Step and Tick return the messages to send; a message's Body is decoded,
// and Encode gives the bytes for the wire. The node does no I/O, reads no
// clock and starts no goroutine: the time is given to it.
package gossip
