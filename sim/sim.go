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
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/regional"
)

// Options tune a run without changing its outcome.
type Options struct {
	// Workers run the regions in parallel; 0 means GOMAXPROCS, or one for
	// a light run (under lightRate). The output is the same whatever the
	// number.
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
	now      time.Duration // true virtual time: every place has run until now
	// places, by index; placeOf is each endpoint's (a region's index, or
	// len(regions) for globalsync).
	places  []*place
	placeOf []int
	// lookahead is how far a place may run ahead of each other, by
	// sending place then receiving place: the fastest link from the
	// one's endpoints to the other's, in whole steps.
	lookahead [][]time.Duration
	globals   eventQueue // events that may touch anything
	workPool  *pool      // s.workers goroutines, while the run lasts
	gseq      uint64
	// eventAt is, by endpoint, the time of the event it runs: what its
	// gossip node is told the time is.
	eventAt []time.Duration

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
	s.rule = budget.Rule{ID: ruleID, Window: sc.Rule.Window, Sliding: sc.Rule.Algorithm == "sliding_window_counter" || sc.Rule.Algorithm == "concurrency"}
	bcfg := s.budgetConfig()
	if err := bcfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: budget: %v", ErrInvalidScenario, sc.Name, err)
	}
	if err := (coord.Config{Regions: sc.Regions, Rebalance: sc.Budget.Rebalance, Budget: bcfg}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidScenario, sc.Name, err)
	}
	s.truth = newTruth(len(sc.Regions), s.nkeys)
	s.eventAt = make([]time.Duration, len(sc.Regions)+1)
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
	s.placeEndpoints()
	// A light run is quicker on one goroutine, unless told otherwise: its
	// places would stop for each other more often than they work (the
	// output is the same).
	peak := 0.0
	for _, r := range s.regions {
		for _, src := range r.srcs {
			peak += src.peak
		}
	}
	if peak < lightRate && opt.Workers == 0 {
		s.workers = 1
	}
	s.gs = newGlobalSync(s, bcfg)
	for _, f := range sc.Faults {
		s.scheduleFault(f)
	}
	return s, nil
}

// lightRate is the peak rate of requests (a second, every source's peak
// summed) under which a run goes on one goroutine.
const lightRate = 1000

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
	if sc.Rule.Algorithm == "concurrency" {
		return fmt.Appendf(nil, `rules:
  - id: %s
    by: [api_key]
    scope: global
    mode: %s
    algorithm: concurrency
    limit: %d
    ttl: %dms
`, ruleID, mode, sc.Rule.Limit, sc.Rule.Window.Milliseconds())
	}
	return fmt.Appendf(nil, `rules:
  - id: %s
    by: [api_key]
    scope: global
    mode: %s
    algorithm: %s
    limit: %d
    window: %dms
    carry_debt: %t
    count_over_limit: %t
%s`, ruleID, mode, sc.Rule.Algorithm, sc.Rule.Limit, sc.Rule.Window.Milliseconds(), sc.Rule.CarryDebt, sc.Rule.CountOverLimit, fallbackYAML(sc.Rule.Fallback, "    "))
}

// fallbackYAML is a rule's fallback line, if the scenario names one.
func fallbackYAML(fallback, indent string) string {
	if fallback == "" {
		return ""
	}
	return indent + "fallback: " + fallback + "\n"
}

// KeyName is the API key of a scenario's key i (TrafficSpec.Keys).
func KeyName(i int) string { return "k" + strconv.Itoa(i) }

// global marks an event that may touch anything: it runs alone.
const global = -1

// at schedules fn at virtual time t (never before now), alone: the
// places run up to its step, then the step runs in order, serially.
func (s *sim) at(t time.Duration, fn func()) {
	s.gseq++
	heap.Push(&s.globals, &event{at: max(t, s.now), src: global, seq: s.gseq, fn: fn, target: global})
}

// atFor schedules fn at virtual time t (never before the step its place
// runs) for one endpoint (a region's index, or len(regions) for
// globalsync): fn touches that endpoint alone. It is called from the
// endpoint's own place, or while nothing runs in parallel.
func (s *sim) atFor(target int, t time.Duration, fn func()) {
	p := s.places[s.placeOf[target]]
	p.push(p, &event{at: max(t, p.now), fn: fn, target: target})
}

// every runs fn for target at start and every period after, while the run
// lasts.
func (s *sim) every(target int, start, period time.Duration, fn func()) {
	if target == global {
		s.gseq++
		heap.Push(&s.globals, &event{at: start, src: global, seq: s.gseq, fn: fn, target: global, period: period})
		return
	}
	p := s.places[s.placeOf[target]]
	p.push(p, &event{at: start, fn: fn, target: target, period: period})
}

// run advances virtual time: the places run in parallel up to the next
// event that may touch anything (see runPlaces), whose step then runs
// alone.
func (s *sim) run() {
	for _, r := range s.regions {
		r.start()
	}
	s.gs.start()
	s.rec.start()
	s.workPool = newPool(s.workers)
	defer s.workPool.stop()
	step := s.sc.Step
	for s.now < s.duration {
		until := s.duration
		if len(s.globals) > 0 {
			until = min(until, s.globals[0].at/step*step)
		}
		if until > s.now {
			s.runPlaces(until)
			s.truth.fold()
			s.now = until
			continue
		}
		s.globalStep()
	}
}

// globalStep runs one step in order, serially: the events due, global or
// not, and what they schedule within the step; then the regions'
// requests.
func (s *sim) globalStep() {
	end := min(s.now+s.sc.Step, s.duration)
	for _, p := range s.places {
		p.now = s.now
		for _, r := range p.regions {
			r.now = s.now
		}
		s.rec.sample(p)
	}
	var due []*event
	for {
		due = due[:0]
		for _, p := range s.places {
			p.drain()
		}
		for {
			q := &s.globals
			for _, p := range s.places {
				if len(p.events) > 0 && (len(*q) == 0 || before(p.events[0], (*q)[0])) {
					q = &p.events
				}
			}
			if len(*q) == 0 || (*q)[0].at >= end {
				break
			}
			due = append(due, s.pop(q))
		}
		if len(due) == 0 {
			break
		}
		for _, e := range due {
			if e.target != global {
				s.eventAt[e.target] = e.at
			}
			e.fn()
		}
	}
	s.requests(end)
	s.truth.fold()
	s.now = end
}

// pop takes the first event of a queue, and schedules it again if it
// repeats.
func (s *sim) pop(q *eventQueue) *event {
	e := heap.Pop(q).(*event)
	if e.period > 0 && e.at+e.period <= s.duration {
		next := &event{at: e.at + e.period, fn: e.fn, target: e.target, period: e.period}
		if e.target == global {
			s.gseq++
			next.src, next.seq = global, s.gseq
			heap.Push(q, next)
		} else {
			p := s.places[s.placeOf[e.target]]
			p.push(p, next)
		}
	}
	return e
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
	next := make(chan *region, len(s.regions))
	for _, r := range s.regions {
		next <- r
	}
	close(next)
	s.workPool.run(s.workers, func() {
		for r := range next {
			r.requests(end)
		}
	})
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

// event is something due at a virtual time. Events due at the same time
// run in the order of the place that scheduled them (global first), then
// of their scheduling there: an order that does not depend on how the
// places' work was spread.
type event struct {
	at     time.Duration
	src    int // the place that scheduled it, or global
	seq    uint64
	fn     func()
	target int           // global, or the one endpoint fn touches
	period time.Duration // > 0: runs again every period
}

type eventQueue []*event

func (q eventQueue) Len() int           { return len(q) }
func (q eventQueue) Less(i, j int) bool { return before(q[i], q[j]) }

// before orders two events.
func before(a, b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.src != b.src {
		return a.src < b.src
	}
	return a.seq < b.seq
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
