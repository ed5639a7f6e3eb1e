// Package e2e is geoquota's end-to-end fault suite: it starts real
// multi-region deployments on loopback (package harness: per region a
// redis-server, a NATS cluster joined to the others by gateway links, and
// regiond replicas; globalsync in the first region), puts them under load
// far above a strict global limit, and breaks them while the load runs:
//
//   - a region cut off from the others for longer than a lease, then healed;
//   - a region's redis-server killed with SIGKILL and restarted empty;
//   - a region's NATS server killed and restarted;
//   - a regiond replica killed with SIGKILL in the middle of a window;
//   - the leading globalsync killed with SIGKILL;
//   - the rules changed while a region is cut off;
//
// and checks the deployment itself (every endpoint listed, nothing left
// running after Stop). It also plays scenarios of the simulator on a
// deployment as sim live plays them (package sim/live): many tenants,
// each with a small limit.
//
// Every fault test keeps the books of what its clients saw admitted, per
// window and per region, and asserts the guarantees of global limits (docs/design.md): in every
// window the regions together admit no more than the strict limit, a
// region cut off keeps serving on its floor, and once the fault is over
// every region's Redis holds the same count of every window as every other
// and as the clients saw admitted — no counted usage is lost. A call whose
// outcome the client could not see (it failed, or the store timed out and
// the rule failed closed) may or may not have been counted, and widens the
// bound by one.
//
// The suite is slow (a few minutes on two cores) and starts real servers,
// so its tests carry the build tag e2e and stay out of go test ./...:
//
//	go test -tags e2e -count=1 ./deploy/local/e2e
//
// It needs redis-server (Debian package redis-server) and the go command,
// which builds regiond and globalsync once for the whole run; or, with
// GEOQUOTA_E2E_BIN naming a directory that holds both binaries, those. The NATS
// servers are embedded in the test process. Each test logs where its
// deployment's daemon logs are, and the per-window books it judged.
package e2e
