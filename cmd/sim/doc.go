// Command sim runs load and, later, simulations.
//
//	sim load -target 127.0.0.1:8081 -api envoy|grpc|http -keys 10000 -concurrency 50 -duration 20s
//
// sim load drives one of regiond's APIs with API keys drawn uniformly (or
// by Zipf, -zipf 1.1) and prints requests per second, allowed, denied and
// failed counts, and latency percentiles (p50, p90, p99, p99.9, max). By
// default each caller sends as soon as its last answer came; -rate N sends
// N a second in all on a fixed schedule and counts latency from each
// request's due time, so that a slow server cannot hide its queue. Runs
// are bounded (10 minutes) and only loopback targets are accepted.
//
// sim run (deterministic partition simulations) and sim live (scenarios
// against a local multi-region deployment) are not built yet.
package main
