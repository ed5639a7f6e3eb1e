// Package sim is a deterministic discrete-event simulator for partition and
// traffic scenarios. It runs the real crdt, budget and in-memory regional
// code in virtual time over modelled links, and reports what each scenario
// does to the global limits.
//
// Status: not built yet; see the project README.
package sim
