package sim

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/regional"
)

// Options tune a run without changing its outcome.
type Options struct {
	// Workers run the regions' requests of one step in parallel; 0 means
	// GOMAXPROCS. The output is the same whatever the number.
	Workers int
	// Duration, if set, cuts the scenario short (faults after it do not
	// happen).
	Duration time.Duration
}

// epoch0 is the virtual time 0: a whole day since the Unix epoch, so that
// every window is aligned at it.
var epoch0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ruleID is the scenario rule's id.
const ruleID = "global"

// sim is one run of a scenario in one mode.
type sim struct {
	sc       *Scenario
	mode     string
	seed     uint64
	duration time.Duration
	workers  int
	now      time.Duration // true virtual time
	seq      uint64
	events   eventQueue
	batching bool // endpoints' events run in parallel: sends wait in outboxes
	// eventAt is, by endpoint, the time of the event it runs: what its
	// gossip node is told the time is.
	eventAt []time.Duration
	later   [][]*event // by endpoint: what its events scheduled while batching

	regions []*region
	byName  map[string]*region
	net     *network
	gs      *globalsync
	keys    []string
	nkeys   int
	window  int64 // µs
	rule    budget.Rule
	rules   *regional.RuleSet
	truth   *truth
	rec     *recorder
}

// Run runs a scenario in one mode ("strict" or "elastic") with a seed, and
// reports what happened. The same scenario, mode and seed give the same
// report, byte for byte.
func Run(sc *Scenario, mode string, seed uint64, opt Options) (*Report, error) {
	if mode != "strict" && mode != "elastic" {
		return nil, fmt.Errorf("%w: mode %q: want strict or elastic", ErrInvalidScenario, mode)
	}
	s, err := newSim(sc, mode, seed, opt)
	if err != nil {
		return nil, err
	}
	s.run()
	return s.report(), nil
}

func newSim(sc *Scenario, mode string, seed uint64, opt Options) (*sim, error) {
	s := &sim{sc: sc, mode: mode, seed: seed, duration: sc.Duration, workers: opt.Workers, byName: map[string]*region{}}
	if opt.Duration > 0 && opt.Duration < s.duration {
		s.duration = opt.Duration
	}
	if s.workers <= 0 {
		s.workers = runtime.GOMAXPROCS(0)
	}
	s.workers = min(s.workers, len(sc.Regions))
	for _, t := range sc.Traffic {
		s.nkeys = max(s.nkeys, t.Keys)
	}
	s.keys = make([]string, s.nkeys)
	for i := range s.keys {
		s.keys[i] = KeyName(i)
	}
	rs, err := regional.Parse("scenario "+sc.Name, ruleYAML(sc, mode))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: rule: %v", ErrInvalidScenario, sc.Name, err)
	}
	s.rules = rs
	s.window = sc.Rule.Window.Microseconds()
	s.rule = budget.Rule{ID: ruleID, Window: sc.Rule.Window, Sliding: sc.Rule.Algorithm == "sliding_window_counter"}
	bcfg := s.budgetConfig()
	if err := bcfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: budget: %v", ErrInvalidScenario, sc.Name, err)
	}
	if err := (coord.Config{Regions: sc.Regions, Rebalance: sc.Budget.Rebalance, Budget: bcfg}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidScenario, sc.Name, err)
	}
	s.truth = newTruth(len(sc.Regions), s.nkeys)
	s.eventAt = make([]time.Duration, len(sc.Regions)+1)
	s.later = make([][]*event, len(sc.Regions)+1)
	s.rec = newRecorder(s)
	s.net = newNetwork(s, rand.New(rand.NewPCG(seed, 0x6e6574)))
	redisFaults := map[string]bool{}
	for _, f := range sc.Faults {
		if f.Kind == "redis-down" {
			redisFaults[f.Region] = true
		}
	}
	for i, name := range sc.Regions {
		r, err := newRegion(s, i, name, redisFaults[name], bcfg)
		if err != nil {
			return nil, err
		}
		s.regions = append(s.regions, r)
		s.byName[name] = r
	}
	for _, t := range sc.Traffic {
		s.addTraffic(t)
	}
	s.gs = newGlobalSync(s, bcfg)
	for _, f := range sc.Faults {
		s.scheduleFault(f)
	}
	return s, nil
}

// staleAfter is how long a region may go unheard before the others take
// it for silent: three heartbeats, as the transport's Gossip.StaleAfter.
func (s *sim) staleAfter() time.Duration { return 3 * s.sc.Gossip.Heartbeat }

func (s *sim) budgetConfig() budget.Config {
	c := budget.DefaultConfig()
	c.Reserve, c.LeaseTTL, c.Skew = *s.sc.Budget.Reserve, s.sc.Budget.LeaseTTL, s.sc.Budget.Skew
	return c
}

// ruleYAML is the rules file every region enforces.
func ruleYAML(sc *Scenario, mode string) []byte {
	return fmt.Appendf(nil, `rules:
  - id: %s
    by: [api_key]
    scope: global
    mode: %s
    algorithm: %s
    limit: %d
    window: %dms
    carry_debt: %t
    fallback: %s
`, ruleID, mode, sc.Rule.Algorithm, sc.Rule.Limit, sc.Rule.Window.Milliseconds(), sc.Rule.CarryDebt, sc.Rule.Fallback)
}

// KeyName is the API key of a scenario's key i (TrafficSpec.Keys).
func KeyName(i int) string { return "k" + strconv.Itoa(i) }

// global marks an event that may touch anything: it runs alone.
const global = -1

// at schedules fn at virtual time t (never before now), alone.
func (s *sim) at(t time.Duration, fn func()) { s.atFor(global, t, fn) }

// atFor schedules fn at virtual time t for one endpoint (a region's index,
// or len(regions) for globalsync): fn touches that endpoint alone, and
// what it sends goes out after it (see runEvents).
func (s *sim) atFor(target int, t time.Duration, fn func()) {
	e := &event{at: max(t, s.now), fn: fn, target: target}
	if s.batching {
		// Endpoints' events run in parallel: what they schedule waits,
		// as what they send does, and is scheduled after the run in a
		// fixed order.
		s.later[target] = append(s.later[target], e)
		return
	}
	s.seq++
	e.seq = s.seq
	heap.Push(&s.events, e)
}

// every runs fn for target at start and every period after, while the run
// lasts.
func (s *sim) every(target int, start, period time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, &event{at: start, seq: s.seq, fn: fn, target: target, period: period})
}

// run advances virtual time step by step: the messages and timers due,
// then every region's requests of the step, regions in parallel.
func (s *sim) run() {
	for _, r := range s.regions {
		r.start()
	}
	s.gs.start()
	s.rec.start()
	step := s.sc.Step
	var due []*event
	for s.now < s.duration {
		end := min(s.now+step, s.duration)
		for _, r := range s.regions {
			r.now = s.now
		}
		for {
			due = due[:0]
			for len(s.events) > 0 && s.events[0].at < end {
				e := heap.Pop(&s.events).(*event)
				if e.period > 0 && e.at+e.period <= s.duration {
					s.seq++
					heap.Push(&s.events, &event{at: e.at + e.period, seq: s.seq, fn: e.fn, target: e.target, period: e.period})
				}
				due = append(due, e)
			}
			if len(due) == 0 {
				break
			}
			s.runEvents(due)
		}
		s.requests(end)
		s.truth.fold()
		// Jump over steps with nothing to do.
		next := end
		if c := s.nextArrival(); len(s.events) > 0 {
			next = max(next, min(c, s.events[0].at)/step*step)
		} else {
			next = max(next, c/step*step)
		}
		s.now = min(next, s.duration)
	}
}

// runEvents runs events in order; a run of events each for one endpoint
// runs endpoint by endpoint, in parallel, since they touch nothing else,
// and what they send goes out after the run, endpoint by endpoint (so
// the output does not depend on how the work was spread).
func (s *sim) runEvents(due []*event) {
	var run []*event
	for _, e := range due {
		if e.target == global {
			s.runLocal(run)
			run = run[:0]
			e.fn()
			continue
		}
		run = append(run, e)
	}
	s.runLocal(run)
}

func (s *sim) runLocal(run []*event) {
	if len(run) == 0 {
		return
	}
	byTarget := make([][]*event, len(s.regions)+1)
	busy := 0
	for _, e := range run {
		if len(byTarget[e.target]) == 0 {
			busy++
		}
		byTarget[e.target] = append(byTarget[e.target], e)
	}
	s.batching = true
	if s.workers <= 1 || busy == 1 {
		for _, evs := range byTarget {
			for _, e := range evs {
				s.eventAt[e.target] = e.at
				e.fn()
			}
		}
	} else {
		var wg sync.WaitGroup
		next := make(chan []*event, len(byTarget))
		for _, evs := range byTarget {
			if len(evs) > 0 {
				next <- evs
			}
		}
		close(next)
		for range s.workers {
			wg.Go(func() {
				for evs := range next {
					for _, e := range evs {
						s.eventAt[e.target] = e.at
						e.fn()
					}
				}
			})
		}
		wg.Wait()
	}
	s.batching = false
	for i, evs := range s.later {
		for _, e := range evs {
			s.atFor(e.target, e.at, e.fn)
		}
		clear(evs)
		s.later[i] = evs[:0]
	}
	s.net.flush()
}

// nextArrival is the earliest next request of any region.
func (s *sim) nextArrival() time.Duration {
	next := s.duration
	for _, r := range s.regions {
		next = min(next, r.nextArrival())
	}
	return next
}

// requests runs every region's requests due before end.
func (s *sim) requests(end time.Duration) {
	busy := 0
	for _, r := range s.regions {
		if r.nextArrival() < end {
			busy++
		}
	}
	if busy == 0 {
		return
	}
	if s.workers <= 1 || busy == 1 || s.expected(end) < 64 {
		for _, r := range s.regions {
			r.requests(end)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan *region, len(s.regions))
	for _, r := range s.regions {
		next <- r
	}
	close(next)
	for range s.workers {
		wg.Go(func() {
			for r := range next {
				r.requests(end)
			}
		})
	}
	wg.Wait()
}

// expected is about how many requests the regions have until end.
func (s *sim) expected(end time.Duration) float64 {
	n := 0.0
	for _, r := range s.regions {
		n += r.rate() * (end - s.now).Seconds()
	}
	return n
}

// clock is the time a region's clock shows at true time t.
func (s *sim) clock(t, skew time.Duration) time.Time { return epoch0.Add(t + skew) }

func (s *sim) scheduleFault(f FaultSpec) {
	switch f.Kind {
	case "partition":
		s.at(f.At, func() { s.net.partition(f.Regions) })
	case "split":
		s.at(f.At, func() { s.net.split(f.Groups) })
	case "heal":
		s.at(f.At, func() { s.heal() })
	case "globalsync-down":
		s.at(f.At, func() { s.gs.down(f.At + f.For) })
		s.at(f.At+f.For, func() { s.gs.up() })
	case "redis-down":
		r := s.byName[f.Region]
		s.at(f.At, func() { r.store.fail(); s.rec.note(f.At, "%s's store down", r.name) })
		s.at(f.At+f.For, func() { r.store.replace(); s.rec.note(f.At+f.For, "%s's store back, empty", r.name) })
	case "clock-jump":
		r := s.byName[f.Region]
		s.at(f.At, func() { r.skew += f.By; s.rec.note(f.At, "%s's clock jumps %v", r.name, f.By) })
	}
}

// heal restores every link and starts measuring convergence.
func (s *sim) heal() {
	s.net.heal()
	s.rec.note(s.now, "links healed")
	s.rec.heal(s.now)
	s.gs.healed()
}

// discard is the engines' logger.
var discard = slog.New(slog.DiscardHandler)

var background = context.Background()

// event is something due at a virtual time; seq keeps events due at the
// same time in the order they were scheduled.
type event struct {
	at     time.Duration
	seq    uint64
	fn     func()
	target int           // global, or the one endpoint fn touches
	period time.Duration // > 0: runs again every period
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// sortedNames returns the keys of a map, sorted.
func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
