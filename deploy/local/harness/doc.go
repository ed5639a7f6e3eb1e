// Package harness starts real Redis and NATS servers on free loopback
// ports, for tests, for the local multi-region deployment and for live
// simulations.
//
// It can start a standalone redis-server (StartRedis), a Redis Cluster
// (StartRedisCluster, created with redis-cli --cluster create), a primary
// with replicas under Sentinel (StartSentinel), a NATS server embedded in
// this process or run from Debian's nats-server binary (StartNATS), and a
// NATS supercluster: one cluster per region, joined by gateways
// (StartSupercluster). Each waits until its servers answer — for a cluster,
// until it is whole — and returns something that can Kill a server with
// SIGKILL and Restart it on the same port, and Stop everything.
//
// No port is fixed: ports are picked free, and a server that loses its
// port to another process before binding it is started again on new ones.
// A missing binary is an error wrapping ErrMissingBinary that names the
// Debian package to install.
//
// In tests, the New* helpers start servers in the test's temporary
// directory and stop them with t.Cleanup:
//
//	func TestSomething(t *testing.T) {
//		r := harness.NewRedis(t, harness.RedisOptions{})
//		c := redis.NewClient(&redis.Options{Addr: r.Addr()})
//		...
//		r.Kill()          // crash it
//		r.Restart(ctx)    // same port; empty unless Persist
//	}
//
// Server processes run in their own process group and are killed if the
// process that started them dies, so a crashed test leaves none behind.
package harness
