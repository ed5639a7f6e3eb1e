// Command regiond is the region daemon: it answers "may this request go
// through?" for the gateways of one region, over Envoy's RateLimitService,
// geoquota's gRPC API, HTTP, or as a reverse proxy, against the region's
// Redis, and takes part in the global limits through NATS.
//
// Status: not built yet; see the project README.
package main
