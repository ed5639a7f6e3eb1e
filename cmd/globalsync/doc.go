// Command globalsync is the global budget service: it hears every regiond
// replica's heartbeat (demand, and the leases it may acknowledge), and the
// instance that leads — one of two or more, by a lease in NATS JetStream KV
// taken with compare-and-swap — computes every region's share of every
// global limit (package budget) once a second and publishes the leases in
// the JetStream KV bucket geoquota-budgets, which every regiond watches.
// A follower takes over within one leader lease (3s by default), and
// first reads every lease still in force from the bucket's history, so
// that strict limits hold across the change. While none leads, regions keep
// enforcing on their leases, then on their floors.
//
//	globalsync --nats nats://127.0.0.1:4222 --grpc-addr 127.0.0.1:9081 --http-addr 127.0.0.1:9080 [--regions a,b,c]
//
// HTTP: GET /healthz, GET /v1/budgets (the leases last published), GET
// /v1/regions (regions heard from, replicas, partition suspicion, and
// whether this instance leads).
package main
