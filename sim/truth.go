package sim

// truth is what really happened: every request, by the window its region
// counted it in. Regions record their own requests in parallel, into
// their own records; between steps their requests join the per-counter
// counts (fold).
type truth struct {
	nkeys   int
	global  map[int64]*counterCounts // window epoch → per counter, every region
	regions []*regionTruth
}

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
	// pend is the requests not yet folded, each its key and whether it
	// was admitted (pendKey), in runs of one window each: the window is
	// kept once a run, not once a request.
	pend []uint32
	runs []pendRun
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
}

// fold adds the regions' requests of the step to the per-counter counts.
func (t *truth) fold() {
	for i, rt := range t.regions {
		for j, run := range rt.runs {
			end := len(rt.pend)
			if j+1 < len(rt.runs) {
				end = rt.runs[j+1].start
			}
			g := t.global[run.epoch]
			if g == nil {
				g = &counterCounts{admitted: make([]int32, t.nkeys), denied: make([]int32, t.nkeys), deniedIn: make([][]int32, len(t.regions))}
				t.global[run.epoch] = g
			}
			for _, p := range rt.pend[run.start:end] {
				key := p >> 1
				if p&1 != 0 {
					g.admitted[key]++
					continue
				}
				g.denied[key]++
				if g.deniedIn[i] == nil {
					g.deniedIn[i] = make([]int32, t.nkeys)
				}
				g.deniedIn[i][key]++
			}
		}
		rt.pend, rt.runs = rt.pend[:0], rt.runs[:0]
	}
}
