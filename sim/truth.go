package sim

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// truth is what really happened: every request, by the window its region
// counted it in. Regions record their own requests in parallel, into
// their own records; from time to time their requests join the
// per-counter counts (fold), each region's as its place runs, in
// parallel with the others' (the counts are added atomically, and sums
// do not depend on the order).
type truth struct {
	nkeys   int
	mu      sync.Mutex               // guards global's map, not the counts
	global  map[int64]*counterCounts // window epoch → per counter, every region
	regions []*regionTruth
}

// foldAt is how many pending requests a region keeps before its place
// folds them into the counts.
const foldAt = 1 << 16

// counterCounts is every counter's requests in one window.
type counterCounts struct {
	admitted, denied []int32 // by key
	// deniedIn is denied by region, then key (nil for a region that
	// denied nothing in the window): what a counter's false rejections
	// are split over the regions by.
	deniedIn [][]int32
}

type regionTruth struct {
	windows map[int64]*windowCounts
	// streams are the streams the region admitted (traffic of streams):
	// what is in flight, when.
	streams []stream
	// pend is the requests not yet folded, each its key and whether it
	// was admitted (pendKey), in runs of one window each: the window is
	// kept once a run, not once a request.
	pend []uint32
	runs []pendRun
	// costs are the pending requests' costs, beside pend, once a request
	// of a cost other than 1 was recorded (recordCost).
	costs []uint32
}

// pendRun is the window of the pending requests from start to the next
// run's start.
type pendRun struct {
	epoch int64
	start int
}

// pendKey is a pending request: its key, and whether it was admitted in
// the lowest bit.
func pendKey(key int, allowed bool) uint32 {
	k := uint32(key) << 1
	if allowed {
		k |= 1
	}
	return k
}

// windowCounts is one region's requests in one window.
type windowCounts struct {
	requests, admitted, denied int64
}

func newTruth(regions, keys int) *truth {
	t := &truth{nkeys: keys, global: map[int64]*counterCounts{}}
	for range regions {
		t.regions = append(t.regions, &regionTruth{windows: map[int64]*windowCounts{}})
	}
	return t
}

// record notes one request of cost 1 in a region; it writes only the
// region's own records.
func (t *truth) record(region int, epoch int64, key int, allowed bool) {
	rt := t.regions[region]
	w := rt.windows[epoch]
	if w == nil {
		w = &windowCounts{}
		rt.windows[epoch] = w
	}
	w.requests++
	if allowed {
		w.admitted++
	} else {
		w.denied++
	}
	if n := len(rt.runs); n == 0 || rt.runs[n-1].epoch != epoch {
		rt.runs = append(rt.runs, pendRun{epoch: epoch, start: len(rt.pend)})
	}
	rt.pend = append(rt.pend, pendKey(key, allowed))
	if rt.costs != nil {
		rt.costs = append(rt.costs, 1)
	}
}

// recordCost notes what a request cost in a region — counted (admitted),
// or asked for and denied — as record notes a request of cost 1.
func (t *truth) recordCost(region int, epoch int64, key int, counted bool, cost int64) {
	rt := t.regions[region]
	if rt.costs == nil {
		rt.costs = make([]uint32, len(rt.pend), cap(rt.pend))
		for i := range rt.costs {
			rt.costs[i] = 1
		}
	}
	t.record(region, epoch, key, counted)
	rt.costs[len(rt.costs)-1] = uint32(cost)
	w := rt.windows[epoch]
	w.requests += cost - 1
	if counted {
		w.admitted += cost - 1
	} else {
		w.denied += cost - 1
	}
}

// stream is a request in flight from start to end (virtual time).
type stream struct {
	key        int32
	start, end time.Duration
}

// recordStream notes a stream a region admitted; it writes only the
// region's own records.
func (t *truth) recordStream(region, key int, start, end time.Duration) {
	rt := t.regions[region]
	rt.streams = append(rt.streams, stream{key: int32(key), start: start, end: end})
}

// streamsInFlight makes each counter's admitted count of a window the
// most streams it had in flight at once in it, every region's together
// (a concurrency limit's measure: TrafficSpec.Streams). window is the
// windows' length in µs, from the Unix epoch as the regions' are.
func (t *truth) streamsInFlight(window int64) {
	byKey := map[int32][]stream{}
	for _, rt := range t.regions {
		for _, s := range rt.streams {
			byKey[s.key] = append(byKey[s.key], s)
		}
	}
	epochOf := func(d time.Duration) int64 { return epoch0.Add(d).UnixMicro() / window }
	type change struct {
		at time.Duration
		n  int32
	}
	for key, ss := range byKey {
		changes := make([]change, 0, 2*len(ss))
		for _, s := range ss {
			changes = append(changes, change{s.start, 1}, change{s.end, -1})
		}
		// At the same moment an end comes before a start: a slot freed
		// as another is taken.
		slices.SortFunc(changes, func(a, b change) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.n, b.n)) })
		most := map[int64]int32{}
		level, last := int32(0), int64(math.MinInt64)
		for _, c := range changes {
			e := epochOf(c.at)
			if level > 0 && last != math.MinInt64 {
				for w := last + 1; w <= e; w++ { // in flight across window starts
					most[w] = max(most[w], level)
				}
			}
			level += c.n
			most[e] = max(most[e], level)
			last = e
		}
		for e, n := range most {
			t.window(e).admitted[key] = n
		}
	}
}

// fold adds every region's pending requests to the per-counter counts.
func (t *truth) fold() {
	for i := range t.regions {
		t.foldRegion(i)
	}
}

// foldSome folds a region's pending requests if it has many: called by
// the region's place alone.
func (t *truth) foldSome(i int) {
	if len(t.regions[i].pend) >= foldAt {
		t.foldRegion(i)
	}
}

// foldRegion adds a region's pending requests to the per-counter counts;
// it writes the region's own records, and the counts atomically.
func (t *truth) foldRegion(i int) {
	rt := t.regions[i]
	for j, run := range rt.runs {
		end := len(rt.pend)
		if j+1 < len(rt.runs) {
			end = rt.runs[j+1].start
		}
		g := t.window(run.epoch)
		denied := g.deniedIn[i] // the region's own: no other writes it
		for j, p := range rt.pend[run.start:end] {
			key, n := p>>1, int32(1)
			if rt.costs != nil {
				n = int32(rt.costs[run.start+j])
			}
			if p&1 != 0 {
				atomic.AddInt32(&g.admitted[key], n)
				continue
			}
			atomic.AddInt32(&g.denied[key], n)
			if denied == nil {
				denied = make([]int32, t.nkeys)
				g.deniedIn[i] = denied
			}
			denied[key] += n
		}
	}
	rt.pend, rt.runs = rt.pend[:0], rt.runs[:0]
	if rt.costs != nil {
		rt.costs = rt.costs[:0]
	}
}

// window is the counts of window epoch, made if new.
func (t *truth) window(epoch int64) *counterCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	g := t.global[epoch]
	if g == nil {
		g = &counterCounts{admitted: make([]int32, t.nkeys), denied: make([]int32, t.nkeys), deniedIn: make([][]int32, len(t.regions))}
		t.global[epoch] = g
	}
	return g
}
