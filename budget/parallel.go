package budget

import (
	"runtime"
	"sync"
)

// minChunk is the fewest counters a goroutine of a rebalance takes: below
// twice as many, a rule's counters are rebalanced on the caller's
// goroutine alone.
const minChunk = 512

// chunksOf is how many chunks inChunks cuts n into: one a goroutine, up
// to GOMAXPROCS, none smaller than minChunk.
func chunksOf(n int) int { return max(1, min(runtime.GOMAXPROCS(0), n/minChunk)) }

// inChunks calls fn for consecutive chunks [lo, hi) covering [0, n),
// numbered 0 to chunksOf(n) - 1, in parallel when there are several, and
// returns once every call has. fn for one chunk must touch nothing
// another's touches: the outcome is the same however the calls run.
func inChunks(n int, fn func(chunk, lo, hi int)) {
	chunks := chunksOf(n)
	if chunks == 1 {
		fn(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for i := range chunks {
		lo, hi := i*n/chunks, (i+1)*n/chunks
		wg.Go(func() { fn(i, lo, hi) })
	}
	wg.Wait()
}
