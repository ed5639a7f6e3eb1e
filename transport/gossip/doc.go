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
// maximum). Every change in a replica's copy of the counters gets a
// version, and each delta says which range of its versions it covers
// (from, to]: a receiver keeps, for each replica (and run of it), the
// version up to which it holds that replica's own slots without a gap.
// A delta that starts past that version shows one lost; every 10s a
// replica sends a delta of no entries that says how far its versions run,
// so that a receiver also finds the last deltas lost. The replica its
// region elected then asks the sender for its own slots changed since
// the version it holds (<prefix>.ask.<to>.<from>), and the sender answers
// with them (<prefix>.repair.<to>.<from>): anti-entropy costs what
// differs, whatever the number of counters held — with every counter in
// sync, a mark of a few dozen bytes a replica every 10s.
//
// A replica that starts asks every other region for all it holds, and
// for its own region's slots as their copies hold them (a new process, or
// a flushed store, may have lost them). A region silent for longer than
// three heartbeats that is heard again (a partition healed) is asked at
// once for what it counted since, again at its first ask or answer since,
// and a second and two seconds later: a NATS gateway redials each way on
// its own, and an ask sent on a way still cut is lost. Every replica
// reports its demand and the leases it may acknowledge to globalsync
// (<prefix>.heartbeat.<region>, every 500ms). globalsync takes part as an
// observer: it merges every delta, asks each region it hears of for what
// it lacks, and hears the heartbeats; it answers no one's asks.
//
// Messages carry the sending replica, its instance (a restarted replica
// numbers afresh) and a sequence number in headers. A message that is
// malformed, replayed, sent under another region's name than its subject's,
// a delta carrying slots not its sender's, or slots of an unknown region or
// going backwards, is counted (Stats) and never merged. An asker is
// answered a few times a second at most.
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
