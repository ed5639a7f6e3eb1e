// Package sim is a deterministic discrete-event simulator for partition and
// traffic scenarios. It runs the code the daemons run, in virtual time:
// every region is a regional.Engine on its own in-memory store and clock
// with its gossip node (transport/gossip), exchanging deltas, asks,
// repairs and heartbeats; globalsync is the coordinator (budget/coord) with
// its observer node, restoring itself from the documents it published (the
// simulator's budgets bucket) when it comes back, and closing the books of
// every window. What is the simulator's own is time, the network, faults,
// traffic and reports: links between regions have a latency each (drawn
// from the seed), jitter and loss, deliver a message to whoever subscribes
// to its subject, as NATS does, and can be cut and healed; clocks can be
// skewed or jump; a region's store can fail and come back empty.
//
// Virtual time advances in steps (1ms by default): the messages and timers
// due in a step run first, then every region's requests of the step. Each
// region (with globalsync, in its region) is a place that touches only its
// own state and hears the others over links at least the lookahead long,
// so the places run in parallel, each as far ahead of each other as the
// fastest link from that one to it, each telling the others how far it
// has run step by step (see runPlaces); the samples are taken by each
// place of its own regions at their step's start, and only an event that
// may touch anything (a fault) stops them all at its step, which runs
// alone. Events due at the
// same time run in an order that does not depend on how the work was
// spread, and each place draws its own loss and jitter, so that a run
// gives the same output, byte for byte, for the same seed, however many
// goroutines run it.
//
// Scenarios are YAML files (sim/scenarios; see Scenario); Run reports
// each window's admissions against the limit, over-admission, false
// rejections (denials that the window's unused room could have taken), the
// regions' shares over time, convergence after each heal and lease
// expiries, as text, CSV and SVG charts with an HTML page (Report);
// WritePage sets the reports of a scenario's modes side by side on one
// page.
// Accuracy compares the sliding window counter with the exact sliding
// window log on one traffic trace.
package sim
