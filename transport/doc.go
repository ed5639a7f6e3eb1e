// Package transport serves a regional engine to every kind of caller: the
// geoquota.v1 gRPC API, Envoy's RateLimitService v3 on the same port, the
// HTTP JSON API with its rate-limit headers, a reverse proxy, and a
// net/http middleware for any Go service. What regions tell each other is
// elsewhere: the gossip protocol in transport/gossip, its NATS, JetStream
// KV and memberlist adapters in transport/control.
//
// # Use
//
//	srv := transport.NewServer(engine, transport.Options{Region: "us-east", AdminToken: token})
//	g := grpc.NewServer()
//	srv.RegisterGRPC(g)           // geoquota.v1, Envoy RLS v3, health, reflection
//	go g.Serve(grpcListener)
//	go http.Serve(httpListener, srv.Handler())
//	srv.SetServing(true)          // health and /readyz; false again while shutting down
//
// or, in any Go service:
//
//	handler = transport.Middleware(engine, transport.MiddlewareOptions{})(handler)
//
// # HTTP
//
//	POST /v1/check            {"descriptors": {...}, "cost": n} → 200, 429, 403, 503
//	POST /v1/report           {"descriptors": {...}, "cost": n} → 200 (charged, debt), 429, 403, 503
//	GET  /v1/usage?rule=R&<descriptor>=V…
//	POST /v1/admin/reset      {"rule", "descriptors"}
//	POST /v1/admin/grant      {"rule", "descriptors", "amount"}
//	POST /v1/admin/block      {"pattern", "until" (RFC 3339) or "ttl_seconds"}
//	POST /v1/admin/unblock    {"pattern"}
//	GET  /v1/admin/blocks
//	GET  /v1/admin/rules      PUT /v1/admin/rules (YAML)
//	GET  /v1/admin/violations?limit=N
//	GET  /metrics, /healthz, /readyz
//
// Every checked response carries X-RateLimit-Limit, -Remaining and -Reset
// (of the limit that speaks: the one with the least left; see
// docs/design.md), RateLimit and RateLimit-Policy
// (draft-ietf-httpapi-ratelimit-headers-11, every enforced limit, tightest
// first), Retry-After when denied, and X-RateLimit-Degraded: true when a
// limit was decided without the shared store. Errors are JSON,
// {"error": {"code", "message", "details"}}; a 400 names the field at
// fault in details.field. A JSON body declared as another type is 415
// UNSUPPORTED_MEDIA_TYPE; no Content-Type, application/json, a +json type
// and application/x-www-form-urlencoded (curl -d's) are read as JSON.
// Admin endpoints need Authorization: Bearer with
// the admin token (401 UNAUTHENTICATED without it; 403 PERMISSION_DENIED
// when regiond has none, for then admin calls are off).
//
// # gRPC
//
// geoquota.v1.RateLimiter (Check, a batch validated whole before anything
// is counted; GetUsage), geoquota.v1.Admin (metadata authorization:
// Bearer <token>), envoy.service.ratelimit.v3.RateLimitService, the
// standard health service and reflection (grpcurl works). Bad input is
// InvalidArgument with a BadRequest detail naming the field. In Envoy's
// API each descriptor is decided on its own, as in Envoy's reference
// service; remote_address is taken as ip, and hits_addend is the cost.
// The daemons serve with Codec: gRPC's, but marshalling Envoy's messages
// with vtprotobuf's generated code in a binary built with -tags
// vtprotobuf (go-control-plane compiles that code only then).
//
// # Metrics
//
// geoquota_checks_total{rule,decision}, geoquota_check_duration_seconds{api},
// geoquota_redis_pipeline_duration_seconds, geoquota_redis_pipeline_checks
// (checks a pipeline carried), geoquota_redis_errors_total,
// geoquota_breaker_state, geoquota_degraded_decisions_total, the denial
// cache, hot-key batch and key-cap counters, geoquota_rule_reloads_total{result},
// geoquota_rule_warnings;
// with gossip, geoquota_gossip_* and the budget each global rule holds.
// No tenant or key is ever a label.
package transport
