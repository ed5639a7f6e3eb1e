package budget

import (
	"runtime"
	"sync"
)

// minChunk is the fewest counters a goroutine of a rebalance takes: below
// twice as many, a rule's counters are rebalanced on the caller's
// goroutine alone.
const minChunk = 512

// inChunks calls fn for consecutive chunks [lo, hi) covering [0, n), in
// parallel on up to GOMAXPROCS goroutines when n is large, and returns
// once every call has. The chunks depend on n and GOMAXPROCS alone, and
// fn for one chunk must touch nothing another's touches: the outcome is
// the same however the calls run.
func inChunks(n int, fn func(chunk, lo, hi int)) int {
	chunks := max(1, min(runtime.GOMAXPROCS(0), n/minChunk))
	if chunks == 1 {
		fn(0, 0, n)
		return 1
	}
	var wg sync.WaitGroup
	for i := range chunks {
		lo, hi := i*n/chunks, (i+1)*n/chunks
		wg.Go(func() { fn(i, lo, hi) })
	}
	wg.Wait()
	return chunks
}
