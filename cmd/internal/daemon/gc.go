package daemon

import (
	"os"
	"runtime/debug"
)

// GCPercent is the GOGC of a server answering checks, unless the
// environment sets one: a check allocates much that does not live, and
// collecting when the heap reaches five times what lives instead of twice
// cut CPU per check by a sixth to a fifth side by side
// (docs/benchmarks.md#gc). GOMEMLIMIT caps the heap.
const GCPercent = 400

// SetGC sets GCPercent unless GOGC is set. regiond and sim floor (the
// protocol's floor it is measured against) both call it, so that the two
// run the same collector.
func SetGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
}
