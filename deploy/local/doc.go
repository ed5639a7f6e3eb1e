// Command local starts a real multi-region geoquota deployment on
// loopback, and stops it:
//
//	go run ./deploy/local up -regions 3   # start it in the background, print its endpoints
//	go run ./deploy/local status          # print them again
//	go run ./deploy/local fault partition ap
//	go run ./deploy/local fault heal
//	go run ./deploy/local down            # stop everything it started
//	go run ./deploy/local nats-config -deployment prod -regions us,eu,ap -out DIR
//
// Each region has a redis-server, a NATS cluster (the clusters joined by
// gateways into a supercluster, with JetStream) and two regiond replicas
// joined by memberlist; two globalsync instances run in the first region.
// Every daemon loads the example rules, regional/example-rules.yaml (or -rules). The gateways
// between regions pass through fault proxies (toxiproxy) held by a
// supervisor process, which `fault`, `sim live` and the end-to-end tests
// use to cut, heal and slow the links between regions.
//
// `up` builds regiond and globalsync, starts the supervisor in the
// background and returns once everything is ready, having written
// deploy/local/state.json: every endpoint, the supervisor's pid and the
// address of its fault API. Data and logs go to deploy/local/.run. `down`
// stops the supervisor, which stops every server and daemon, and checks
// that none is left running.
//
// `nats-config` starts nothing: it writes, for real NATS servers, a
// deployment's accounts (accounts.conf: an nkey user per region, one for
// globalsync and one for the operator, each allowed only its own subjects,
// from transport/namespace) and the identities' seeds.
package main
