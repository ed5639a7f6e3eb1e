// Command regiond is the region daemon: it answers "may this request go
// through?" for the gateways of one region — over Envoy's RateLimitService
// v3 and geoquota's gRPC API (one port), over HTTP, or as a reverse proxy —
// against the region's Redis.
//
//	regiond --region us-east --redis redis://127.0.0.1:6379/0 --nats nats://127.0.0.1:4222 \
//	        --rules rules.yaml --grpc-addr 127.0.0.1:8081 --http-addr 127.0.0.1:8080 \
//	        [--admin-token T] [--regions us-east,eu-west,ap-south] \
//	        [--peers host:port,...] [--memberlist-addr 127.0.0.1:7946] \
//	        [--proxy-upstream http://127.0.0.1:9000] [--dev]
//
// --dev needs nothing else: an embedded NATS, an in-memory store and the
// example rules (regional/example-rules.yaml). Every flag may also be given as an
// environment variable GEOQUOTA_<FLAG> (GEOQUOTA_REDIS, GEOQUOTA_ADMIN_TOKEN,
// …); the command line wins. More: --tls-cert/--tls-key (both APIs),
// --timeout (Redis, default 50ms), --log-format text|json, --log-level,
// --shutdown-timeout. regiond -h lists them all.
//
// The rules file is watched (its directory, so that editors and Kubernetes
// ConfigMaps are followed) and reloaded on change and on SIGHUP; an invalid
// file is rejected whole, logged and counted, and the last good rules stay.
// What a file holds that is read and not enforced (envoyproxy/ratelimit's
// metadata) is logged as a warning, or refused as invalid with
// --rules-strict.
// On SIGTERM or SIGINT health turns NOT_SERVING, in-flight requests finish,
// and pending audit entries are written.
//
// With --nats (or --dev's embedded server) the region gossips its usage of
// global limits with the others, watches the budget leases and the rules
// globalsync publishes in JetStream KV, and sends its heartbeat; --regions
// names every region, this one included (each region's floor is the
// reserve split over them; without --regions, or naming this region alone,
// the region enforces every global limit whole). NATS down at start is no
// reason not to serve: the region enforces on its floor and connects when
// it can.
//
// --memberlist-addr (and --peers, the siblings to join) makes the region's
// replicas find each other (memberlist, LAN profile; --memberlist-key
// encrypts it): the first alive replica by name (--replica-name) is
// elected to ask the other regions for what the region lacks, another
// within seconds when it dies, and every replica tells the others of keys
// it found over their limits, for their denial caches. Every replica sends its own heartbeat:
// each enforces the leases itself, so globalsync needs each one's
// acknowledgement, and adds their demand up.
package main
