// Command globalsync is the global budget service: the coordinator of
// package budget/coord, driven over NATS. Its gossip node hears every
// regiond replica's heartbeat (demand, and the leases it may acknowledge)
// and every region's usage; the instance that leads — one of two or more,
// by a claim in NATS JetStream KV taken with compare-and-swap — has the
// coordinator compute every region's share of every global limit once a
// second and publishes the leases in the JetStream KV bucket
// geoquota-budgets, which every regiond watches. A follower takes over
// once the leader's claim has lapsed (3s by default, and the clock-skew
// allowance), and first restores every lease still in force from the
// bucket's history, so that strict limits hold across the change. While
// none leads, regions keep enforcing on their leases, then on their
// floors. What is decided is the coordinator's; this command is NATS, KV,
// the leader's claim, HTTP, gRPC and the dashboard.
//
//	globalsync --nats nats://127.0.0.1:4222 --grpc-addr 127.0.0.1:9081 --http-addr 127.0.0.1:9080 [--regions a,b,c]
//
// gRPC: geoquota.v1.GlobalSync (GetGlobalUsage, GetBudgets, ListRegions),
// health and reflection. HTTP: GET /healthz (the process answers),
// /readyz (200 once this instance knows whether it leads or which instance
// does, from the leader's claim it read or wrote within the last leader
// TTL, with its NATS connection up; 503 otherwise), /metrics, /v1/budgets
// (the leases last published: a follower is given the leader's as they
// are pushed), /v1/regions (regions heard from, replicas, partition
// suspicion, and whether this instance leads), /v1/over-admissions, and a
// dashboard at / (from /v1/dashboard): who leads, with a link to the
// leader's dashboard on a follower's (the claim names it: --dashboard-url);
// the regions; every global rule's leases as the leader granted them
// beside what each region's replicas last reported they enforce (the
// lease they acknowledge, and whether it still holds), each with why the
// leader granted it (budget.Reason) and each move of one listed with its
// reason, in percentages of the limit; demand and admissions over the last
// ten minutes on a time axis fitted to them, with the faults seen (a region
// silent, a lease lapsed) and leader changes marked.
//
// With --rules the leader publishes the rules to every region (JetStream
// KV bucket geoquota-rules) and closes each window's books: over-admission
// is put on the regions that went beyond their grants, counted
// (geoquota_over_admitted_total), logged, and for carry_debt rules
// withheld from their next windows. What the rules hold that is read and
// not enforced (envoyproxy/ratelimit's metadata) is logged as a warning;
// with --rules-strict such rules are refused, and not published.
package main
