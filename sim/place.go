package sim

import (
	"container/heap"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
)

// place is the endpoints that run in one region: the region, and
// globalsync if it runs there. Places hear each other only over links
// between regions, each at least the lookahead long, so a place can run
// ahead of the others by up to the lookahead without missing a message:
// what another place sends at its time t arrives after t+lookahead. The
// places run in parallel that way (conservative parallel discrete-event
// simulation), each step by step, and the outcome does not depend on how
// the work was spread: every step of a place sees the same events.
type place struct {
	idx     int
	regions []*region
	now     time.Duration // the start of the step it runs
	done    time.Duration // it has run every step before done
	events  eventQueue    // touched by its own run alone
	seq     uint64        // what it scheduled: the order of events due at the same time
	rng     *rand.Rand    // the loss and jitter of what it sends
	// nextSample is when the recorder next samples its regions, at the
	// start of that step, before anything else of it runs.
	nextSample time.Duration

	mu    sync.Mutex
	inbox []*event // what other places scheduled for it
}

// placeEndpoints puts every region in a place of its own and globalsync
// in its region's, and takes the lookahead of each pair of places from
// the links between them.
func (s *sim) placeEndpoints() {
	s.placeOf = make([]int, len(s.regions)+1)
	for i, r := range s.regions {
		s.places = append(s.places, &place{idx: i, regions: []*region{r},
			rng: rand.New(rand.NewPCG(s.seed, 0x706c6163<<16|uint64(i)))})
		s.placeOf[i] = i
	}
	s.placeOf[len(s.regions)] = s.byName[s.sc.GlobalSync.Region].idx
	step := s.sc.Step
	s.lookahead = make([][]time.Duration, len(s.places))
	for i := range s.places {
		s.lookahead[i] = make([]time.Duration, len(s.places))
		for j := range s.places {
			s.lookahead[i][j] = s.duration
		}
	}
	// Every endpoint's links, globalsync's from its region's place.
	names := make([]string, 0, len(s.regions)+1)
	for _, r := range s.regions {
		names = append(names, r.name)
	}
	names = append(names, coord.Name)
	for a, from := range names {
		for b, to := range names {
			if pa, pb := s.placeOf[a], s.placeOf[b]; pa != pb {
				s.lookahead[pa][pb] = min(s.lookahead[pa][pb], s.net.Latency(from, to))
			}
		}
	}
	for i := range s.lookahead {
		for j, d := range s.lookahead[i] {
			s.lookahead[i][j] = max(step, d/step*step)
		}
	}
}

// push schedules e for p, from the place from: at once if from is p
// (p's own run, or no run in parallel), else through p's inbox.
func (p *place) push(from *place, e *event) {
	from.seq++
	e.src, e.seq = from.idx, from.seq
	if from == p {
		heap.Push(&p.events, e)
		return
	}
	p.mu.Lock()
	p.inbox = append(p.inbox, e)
	p.mu.Unlock()
}

// drain moves what other places scheduled for p into its queue.
func (p *place) drain() {
	p.mu.Lock()
	in := p.inbox
	p.inbox = nil
	p.mu.Unlock()
	for _, e := range in {
		heap.Push(&p.events, e)
	}
}

// runPlaces runs every place from now until until (a step's start, with
// no global event before it), in parallel: a place runs the steps that
// end before every other place's done plus the lookahead from that place
// to it, the place furthest behind first. A place says how far it has
// run after every step, so that the others need not wait for the end of
// its turn: one that runs globalsync's rebalance, the longest event,
// leaves the others their whole lookahead to run meanwhile.
func (s *sim) runPlaces(until time.Duration) {
	for _, p := range s.places {
		p.done = s.now
	}
	var (
		mu      sync.Mutex
		wake    = sync.NewCond(&mu)
		running = make([]bool, len(s.places))
	)
	// bound is how far p may run: every message another place can still
	// send it arrives at or after it.
	bound := func(p *place) time.Duration {
		b := until
		for _, q := range s.places {
			if q != p {
				b = min(b, q.done+s.lookahead[q.idx][p.idx])
			}
		}
		return b
	}
	// advance says p has run every step before done, which lets the
	// others run further while it goes on, and returns how far p may
	// run now.
	advance := func(p *place, done time.Duration) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		if done > p.done {
			p.done = done
			wake.Broadcast()
		}
		return bound(p)
	}
	s.workPool.run(min(s.workers, len(s.places)), func() {
		mu.Lock()
		defer mu.Unlock()
		for {
			var next *place
			finished := true
			for _, p := range s.places {
				if p.done < until {
					finished = false
				}
				if !running[p.idx] && p.done < until && bound(p) > p.done && (next == nil || p.done < next.done) {
					next = p
				}
			}
			if finished {
				wake.Broadcast()
				return
			}
			if next == nil {
				wake.Wait()
				continue
			}
			b := bound(next)
			running[next.idx] = true
			mu.Unlock()
			s.runPlace(next, b, advance)
			mu.Lock()
			running[next.idx] = false
			wake.Broadcast()
		}
	})
}

// runPlace runs a place's steps from its done until until, each as a
// step of the whole simulation runs: the events due in it (and what they
// schedule within it), then the regions' requests; steps with nothing to
// do are skipped. After each, it tells advance how far it has run, which
// says how far it may run now (the others may have run on meanwhile).
func (s *sim) runPlace(p *place, until time.Duration, advance func(*place, time.Duration) time.Duration) {
	step := s.sc.Step
	var due []*event
	for now := p.done; now < until; {
		end := min(now+step, until)
		p.now = now
		for _, r := range p.regions {
			r.now = now
		}
		s.rec.sample(p)
		for {
			p.drain()
			due = due[:0]
			for len(p.events) > 0 && p.events[0].at < end {
				due = append(due, s.pop(&p.events))
			}
			if len(due) == 0 {
				break
			}
			for _, e := range due {
				s.eventAt[e.target] = e.at
				e.fn()
			}
		}
		arrival := s.duration
		for _, r := range p.regions {
			r.requests(end)
			s.truth.foldSome(r.idx)
			arrival = min(arrival, r.nextArrival())
		}
		// Skip steps with nothing to do, and no sample; what other places
		// send arrives at until or later.
		next := max(end, arrival/step*step)
		if len(p.events) > 0 {
			next = max(end, min(arrival, p.events[0].at)/step*step)
		}
		now = min(next, until, max(end, p.nextSample))
		until = advance(p, now)
	}
}

// pool is the run's worker goroutines: kept from one parallel stretch to
// the next, so that their stacks, grown deep in the engine's code, are
// not grown again every time (a day's run has hundreds of thousands of
// stretches).
type pool struct {
	work chan func()
	done sync.WaitGroup
}

func newPool(n int) *pool {
	p := &pool{work: make(chan func())}
	for range n {
		p.done.Go(func() {
			for f := range p.work {
				f()
			}
		})
	}
	return p
}

// run runs f on n of the pool's goroutines (n at most the pool's size),
// and returns when every one has returned.
func (p *pool) run(n int, f func()) {
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		p.work <- func() {
			defer wg.Done()
			f()
		}
	}
	wg.Wait()
}

// stop ends the pool's goroutines.
func (p *pool) stop() {
	close(p.work)
	p.done.Wait()
}
