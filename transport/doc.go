// Package transport carries geoquota between processes: the geoquota.v1
// gRPC API, Envoy's RateLimitService v3, the HTTP JSON API, usage gossip and
// budgets over NATS, and replica membership over memberlist.
//
// Status: not built yet; see the project README.
package transport
