// Command sim simulates geoquota, runs load against it, and measures the
// accuracy of its algorithms.
//
//	sim run -scenario partition -seed 1 [-mode strict|elastic|both] [-out sim-out] [-cpuprofile FILE] [-memprofile FILE]
//	sim run -list
//	sim accuracy [-keys 1000 -limit 60 -window 1m -duration 10m]
//	sim load -target 127.0.0.1:8081 -api envoy|grpc|http -keys 10000 -concurrency 50 -duration 20s
//	sim live -scenario tenants-live [-deployment deploy/local]
//	sim floor [-grpc-addr 127.0.0.1:18091]
//
// sim run runs a scenario (a built-in one, or a YAML file) in the
// deterministic simulator of package sim, in each of its modes, and prints
// a table per window: the limit, what was admitted, over-admission and
// false rejections, every region's share; then convergence after each
// heal, lease expiries and what globalsync found when it closed the books.
// The same seed prints the same output, byte for byte; how long the run
// took goes to stderr. The report is also written as CSV, SVG charts and
// HTML into the directory -out names (sim-out by default; an empty name
// writes none): SCENARIO-index.html sets the modes run side by side, each
// region's demand, admissions and false rejections over time, the faults
// shaded on every chart, and a table of the modes' outcomes.
//
// sim accuracy replays one traffic trace through the sliding window counter
// and the exact sliding window log (both the real engine, in memory) and
// reports the requests they decide differently.
//
// sim load drives one of regiond's APIs with API keys drawn uniformly (or
// by Zipf, -zipf 1.1) and prints requests per second, allowed, denied and
// failed counts, and latency percentiles (p50, p90, p99, p99.9, max). By
// default each caller sends as soon as its last answer came; -rate N sends
// N a second in all on a fixed schedule and counts latency from each
// request's due time, so that a slow server cannot hide its queue. Runs
// are bounded (10 minutes) and only loopback targets are accepted.
//
// sim live runs a scenario against a local multi-region deployment
// (deploy/local) in real time, scaled down, and the simulator beside it.
//
// sim floor serves Envoy's rate-limit protocol and answers OK to every
// request, with the gRPC server and options regiond serves it with: the
// protocol's own cost on the machine, what deploy/bench/sidebyside.sh
// measures regiond against.
package main
