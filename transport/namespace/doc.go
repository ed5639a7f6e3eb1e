// Package namespace names what one deployment of geoquota owns on NATS:
// the subjects of its gossip and pushes, its JetStream KV buckets, and
// what each of its identities may publish and subscribe to. A deployment
// name (regiond's and globalsync's --deployment) puts all of them under
// names of their own, so that two deployments on one NATS never see each
// other. The package does no I/O and depends on nothing but crdt's limits,
// so that every part that speaks NATS, and the test harness that
// configures servers, take their names from here.
package namespace
