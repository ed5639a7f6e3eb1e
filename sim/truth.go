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
	pend    []pendKey // this step's requests
}

type pendKey struct {
	epoch   int64
	key     int32
	allowed bool
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
	rt.pend = append(rt.pend, pendKey{epoch, int32(key), allowed})
}

// fold adds the regions' requests of the step to the per-counter counts.
func (t *truth) fold() {
	for i, rt := range t.regions {
		for _, p := range rt.pend {
			g := t.global[p.epoch]
			if g == nil {
				g = &counterCounts{admitted: make([]int32, t.nkeys), denied: make([]int32, t.nkeys), deniedIn: make([][]int32, len(t.regions))}
				t.global[p.epoch] = g
			}
			if p.allowed {
				g.admitted[p.key]++
				continue
			}
			g.denied[p.key]++
			if g.deniedIn[i] == nil {
				g.deniedIn[i] = make([]int32, t.nkeys)
			}
			g.deniedIn[i][p.key]++
		}
		rt.pend = rt.pend[:0]
	}
}
