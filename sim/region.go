package sim

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// maintainEvery is regiond's --maintain-every default.
const maintainEvery = 250 * time.Millisecond

// region is one region: one regiond replica on the real engine, with an
// in-memory store, and its real gossip node.
type region struct {
	s      *sim
	idx    int
	name   string
	now    time.Duration // true virtual time, as the region's work sees it
	skew   time.Duration
	engine *regional.Engine
	node   *gossip.Node
	ticks  ticker
	store  *faultyStore // nil: the engine's own memory
	rng    *rand.Rand
	srcs   []*source
	req    regional.Request
	dec    regional.Decision
	// answers are the answers under way (traffic with tokens), whose
	// tokens are reported when they end: a heap by end.
	answers answerHeap

	holding bool // held a lease at the last sample
	// expiries are its leases' expiries seen in the samples (recorder).
	expiries []Expiry
}

func newRegion(s *sim, idx int, name string, faulty bool, bcfg budget.Config) (*region, error) {
	r := &region{s: s, idx: idx, name: name, skew: s.sc.ClockSkew[name], rng: rand.New(rand.NewPCG(s.seed, uint64(idx)+1))}
	cfg := regional.DefaultConfig()
	cfg.Region = name
	cfg.Clock = func() time.Time { return s.clock(r.now, r.skew) }
	cfg.Logger = discard
	// The lag: a gossip round and the slowest link, as regiond takes it.
	cfg.Global = regional.GlobalConfig{Regions: s.sc.Regions, Budget: bcfg, StaleAfter: s.staleAfter(),
		Lag: s.sc.Gossip.Interval + s.sc.Network.Latency.Max + s.sc.Network.Jitter}
	if err := cfg.Global.Validate(name); err != nil {
		return nil, err
	}
	if faulty {
		r.store = newFaultyStore(name, cfg.Clock)
		cfg.Store = r.store
	}
	r.engine = regional.New(cfg, s.rules)
	r.req.Endpoint = "/"
	return r, nil
}

// start starts the region's gossip node, its periodic tasks each at a
// phase of its own, and regiond's maintenance of the engine.
func (r *region) start() {
	s, g := r.s, r.s.sc.Gossip
	phase := func(d time.Duration) time.Duration { return time.Duration(r.rng.Int64N(int64(d))) }
	node, err := gossip.New(gossip.Config{Region: r.name, Replica: r.name, Instance: "1", Interval: g.Interval,
		AntiEntropy: g.AntiEntropy, Heartbeat: g.Heartbeat, Phase: phase, Counters: r.engine, Engine: r.engine}, epoch0)
	if err != nil {
		panic(err) // the regions are checked in newSim
	}
	r.node = node
	r.ticks = ticker{s: s, target: r.idx, node: node, send: r.send, at: -1, subs: node.Subscriptions()}
	// regiond tends its engine every 250ms (--maintain-every).
	s.every(r.idx, phase(maintainEvery), maintainEvery, func() { r.engine.Maintain(background) })
	r.ticks.schedule()
	for _, src := range r.srcs {
		src.after = src.gap(0)
		src.refill()
	}
}

func (r *region) clock() time.Time { return r.s.clock(r.now, r.skew) }

// send puts one of the node's messages on the network.
func (r *region) send(m gossip.Message) { r.s.net.post(r.name, m) }

// endpoint is what a message can reach: a region or globalsync.
type endpoint interface {
	// step hands the endpoint's gossip node a message.
	step(m gossip.Message)
	// budget hands the endpoint a budget document from the bucket.
	budget(doc budget.Document)
	// listens reports whether the endpoint subscribes to a subject.
	listens(subject string) bool
}

func (r *region) step(m gossip.Message) { r.ticks.step(m) }

func (r *region) listens(subject string) bool { return r.ticks.listens(subject) }

func (r *region) budget(doc budget.Document) { r.engine.SetBudget(doc) }

// ticker runs an endpoint's gossip node in virtual time: a tick at every
// time the node has something due, and the messages it returns onto the
// network.
type ticker struct {
	s      *sim
	target int
	node   *gossip.Node
	send   func(gossip.Message)
	at     time.Duration // the next tick scheduled, or -1
	subs   []string      // the node's subscriptions, read by every sender
}

// now is the node's time: the time of the event being run for it.
func (t *ticker) now() time.Time { return epoch0.Add(t.s.eventAt[t.target]) }

// schedule has the node ticked when it is next due, unless a tick is
// scheduled by then.
func (t *ticker) schedule() {
	next := t.node.Next().Sub(epoch0)
	if next >= t.s.duration || (t.at >= 0 && t.at <= next) {
		return
	}
	t.at = next
	t.s.atFor(t.target, next, func() {
		if next != t.at {
			return // replaced by an earlier tick
		}
		t.at = -1
		for _, m := range t.node.Tick(t.now()) {
			t.send(m)
		}
		t.schedule()
	})
}

// step hands the node a message, and sends its answers.
func (t *ticker) step(m gossip.Message) {
	for _, a := range t.node.Step(background, t.now(), m) {
		t.send(a)
	}
	t.schedule()
}

// listens reports whether the node subscribes to a subject, as NATS
// matches them (* stands for one token).
func (t *ticker) listens(subject string) bool {
	for _, sub := range t.subs {
		if matchSubject(sub, subject) {
			return true
		}
	}
	return false
}

func matchSubject(pattern, subject string) bool {
	for {
		p, prest, pmore := strings.Cut(pattern, ".")
		s, srest, smore := strings.Cut(subject, ".")
		if p != "*" && p != s {
			return false
		}
		if !pmore || !smore {
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

// source is one stream of requests arriving at a region: a Poisson
// process whose rate varies with time, never above peak.
type source struct {
	rate func(t time.Duration) float64
	peak float64
	end  time.Duration // no arrivals from here on
	next time.Duration // the next arrival
	keys int
	zipf *rand.Zipf
	hot  float64
	rng  *rand.Rand
	// table, if set, draws keys homed in regions: each key's weight is its
	// demand's, times the part of it that comes to this source's region.
	table *alias
	// ahead is the arrivals drawn ahead, from pos on (next is the time of
	// the first), and after the time of the one after them, its key not
	// yet drawn. They are drawn in the order one at a time would draw
	// them, from the source's own rng, so the requests are the same; in a
	// batch, the loads of the key tables overlap.
	ahead []arrival
	pos   int
	after time.Duration
	// tokens, if set, draws each request's answer (TrafficSpec.Tokens)
	// from trng, apart from the arrivals' rng; streams, each request's
	// stream (TrafficSpec.Streams), from it alike.
	tokens  *TokensSpec
	streams *StreamsSpec
	trng    *rand.Rand
}

// stream draws how long a request's stream lasts, and whether its holder
// crashes (it never releases its slot).
func (src *source) stream() (time.Duration, bool) {
	k := src.streams
	d := time.Duration(float64(k.Median) * math.Exp(k.Sigma*src.trng.NormFloat64()))
	return min(max(d, time.Millisecond), k.Max), src.trng.Float64() < k.Abandon
}

// answer draws a request's answer: its tokens, and how long it lasts.
func (src *source) answer() (int64, time.Duration) {
	k := src.tokens
	n := int64(math.Round(k.Median * math.Exp(k.Sigma*src.trng.NormFloat64())))
	n = min(max(n, 1), k.Max)
	return n, time.Duration(float64(n) / k.PerSecond * 1e9)
}

// pendingAnswer is an answer under way: its tokens are reported at end,
// or, reserved, committed then.
type pendingAnswer struct {
	end  time.Duration
	key  int32
	cost int32
	// rsv is its reservation, if reserved: the id, the estimate, and the
	// window (epoch) it was taken in.
	rsv *reservedAnswer
	// slot is a stream's slot, released at its end unless its holder
	// crashed (abandoned).
	slot      string
	abandoned bool
}

type reservedAnswer struct {
	id       string
	estimate int64
	epoch    int64
}

// answerHeap is a min-heap of answers by end.
type answerHeap []pendingAnswer

func (h *answerHeap) push(a pendingAnswer) {
	*h = append(*h, a)
	x := *h
	for i := len(x) - 1; i > 0; {
		p := (i - 1) / 2
		if x[p].end <= x[i].end {
			break
		}
		x[p], x[i] = x[i], x[p]
		i = p
	}
}

func (h *answerHeap) pop() pendingAnswer {
	x := *h
	top := x[0]
	n := len(x) - 1
	x[0] = x[n]
	x = x[:n]
	for i := 0; ; {
		l, small := 2*i+1, i
		if l < n && x[l].end < x[small].end {
			small = l
		}
		if r := l + 1; r < n && x[r].end < x[small].end {
			small = r
		}
		if small == i {
			break
		}
		x[i], x[small] = x[small], x[i]
		i = small
	}
	*h = x
	return top
}

// arrival is one request a source has drawn: its time and key.
type arrival struct {
	at  time.Duration
	key int32
}

// drawAhead is how many arrivals a source draws at once.
const drawAhead = 64

// refill draws the source's next arrivals, up to drawAhead, none at or
// after end, and sets next to the first's time (end if none).
func (src *source) refill() {
	src.ahead, src.pos = src.ahead[:0], 0
	t := src.after
	for len(src.ahead) < drawAhead && t < src.end {
		src.ahead = append(src.ahead, arrival{at: t, key: int32(src.key())})
		t = src.gap(t)
	}
	src.after = t
	src.next = src.end
	if len(src.ahead) > 0 {
		src.next = src.ahead[0].at
	}
}

// take returns the key of the source's next arrival (at next), and moves
// next on to the one after.
func (src *source) take() int {
	k := int(src.ahead[src.pos].key)
	if src.pos++; src.pos < len(src.ahead) {
		src.next = src.ahead[src.pos].at
	} else {
		src.refill()
	}
	return k
}

// gap draws the next arrival after t by thinning: candidates come at the
// peak rate, and each is kept with probability rate/peak at its time, so
// that the arrivals follow the rate however it moves. None before end:
// end.
func (src *source) gap(t time.Duration) time.Duration {
	if src.peak <= 0 {
		return src.end
	}
	for {
		t += time.Duration(src.rng.ExpFloat64()/src.peak*1e9) + 1
		if t >= src.end {
			return src.end
		}
		if r := src.rate(t); r >= src.peak || src.rng.Float64()*src.peak < r {
			return t
		}
	}
}

func (src *source) key() int {
	if src.table != nil {
		return src.table.draw(src.rng)
	}
	return src.draw()
}

func (src *source) draw() int {
	switch {
	case src.hot > 0 && src.rng.Float64() < src.hot:
		return 0
	case src.keys == 1:
		return 0
	case src.zipf != nil:
		return int(src.zipf.Uint64())
	default:
		return src.rng.IntN(src.keys)
	}
}

// addTraffic turns a traffic spec into sources at its regions.
func (s *sim) addTraffic(t TrafficSpec) {
	trafficSources(t, s.sc.Regions, s.duration, func(region string) *rand.Rand {
		r := s.byName[region]
		return sourceRand(s.seed, r.idx, len(r.srcs))
	}, func(region string, src *source) { r := s.byName[region]; r.srcs = append(r.srcs, src) })
}

// sourceRand is the random source of a region's n-th source of requests:
// its own, so that Run and Arrivals draw the same requests from a seed.
func sourceRand(seed uint64, region, n int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x6c697665<<32|uint64(region)<<16|uint64(n)))
}

// trafficSources makes the sources of a traffic spec, each drawing from
// the rng it is given for it, and gives them to add.
func trafficSources(t TrafficSpec, regions []string, end time.Duration, rng func(region string) *rand.Rand, add func(region string, src *source)) {
	newSource := func(region string, peak float64, rate func(time.Duration) float64) *source {
		r := rng(region)
		src := &source{rate: rate, peak: peak, end: end, keys: t.Keys, hot: t.Hot, rng: r}
		if t.Zipf > 0 && t.Keys > 1 {
			src.zipf = rand.NewZipf(r, t.Zipf, 1, uint64(t.Keys-1))
		}
		if t.Tokens != nil {
			src.tokens, src.trng = t.Tokens, rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		}
		if t.Streams != nil {
			src.streams, src.trng = t.Streams, rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
		}
		return src
	}
	source := func(region string, peak float64, rate func(time.Duration) float64) {
		add(region, newSource(region, peak, rate))
	}
	switch t.Kind {
	case "tenants":
		n := len(regions)
		atHome, away := t.Home, 0.0
		if n > 1 {
			away = (1 - t.Home) / float64(n-1)
		} else {
			atHome = 1
		}
		// Each key's weight, by Zipf's law or evenly (the hot key's
		// part first), and each region's part of it: at home or away.
		weight := make([]float64, t.Keys)
		total := 0.0
		for k := range weight {
			w := 1.0
			if t.Zipf > 0 && t.Keys > 1 {
				w = math.Pow(float64(1+k), -t.Zipf)
			}
			weight[k] = w
			total += w
		}
		for k := range weight {
			weight[k] *= (1 - t.Hot) / total
		}
		weight[0] += t.Hot
		for i, name := range regions {
			w := make([]float64, len(weight))
			part := 0.0
			for k, x := range weight {
				if k%n == i {
					w[k] = x * atHome
				} else {
					w[k] = x * away
				}
				part += w[k]
			}
			rate := t.Rate * part
			src := newSource(name, rate, func(time.Duration) float64 { return rate })
			src.table = newAlias(w)
			add(name, src)
		}
	case "steady":
		source(t.Region, t.Rate, func(time.Duration) float64 { return t.Rate })
	case "shift":
		moved := func(at time.Duration) float64 {
			switch {
			case at < t.At:
				return 0
			case at >= t.At+t.Over:
				return 1
			}
			return float64(at-t.At) / float64(t.Over)
		}
		source(t.Region, t.Rate, func(at time.Duration) float64 { return t.Rate * (1 - moved(at)) })
		source(t.To, t.Rate, func(at time.Duration) float64 { return t.Rate * moved(at) })
	case "flash":
		source(t.Region, max(t.Rate, t.Peak), func(at time.Duration) float64 {
			if at >= t.At && at < t.At+t.For {
				return t.Peak
			}
			return t.Rate
		})
	case "diurnal":
		source(t.Region, t.Rate*(1+t.Amplitude), func(at time.Duration) float64 {
			x := 2 * math.Pi * (float64(at)/float64(t.Period) + t.Phase)
			return t.Rate * (1 + t.Amplitude*math.Sin(x))
		})
	}
}

func (r *region) nextArrival() time.Duration {
	next := r.s.duration
	for _, src := range r.srcs {
		next = min(next, src.next)
	}
	return next
}

// rate is the region's request rate now.
func (r *region) rate() float64 {
	n := 0.0
	for _, src := range r.srcs {
		n += src.rate(r.s.now)
	}
	return n
}

// requests runs the region's requests due before end, in time order. It
// touches nothing outside the region but what the truth lets it.
func (r *region) requests(end time.Duration) {
	tr := r.s.truth
	for {
		var src *source
		for _, x := range r.srcs {
			if x.next < end && (src == nil || x.next < src.next) {
				src = x
			}
		}
		if len(r.answers) > 0 && r.answers[0].end < end && (src == nil || r.answers[0].end <= src.next) {
			// An answer ends: its tokens are reported, and counted
			// whatever the decision (the rule counts past its limit).
			a := r.answers.pop()
			r.now = a.end
			if a.rsv != nil {
				r.commit(a)
				continue
			}
			if a.slot != "" {
				r.release(a)
				continue
			}
			r.req.APIKey, r.req.Cost, r.req.CountNothing = r.s.keys[a.key], int64(a.cost), false
			r.check()
			tr.recordCost(r.idx, r.dec.Time.UnixMicro()/r.s.window, int(a.key), true, int64(a.cost))
			continue
		}
		if src == nil {
			return
		}
		r.now = src.next
		k := src.take()
		if src.tokens != nil && src.tokens.Reserve > 0 {
			r.reserve(src, k)
			continue
		}
		if src.streams != nil {
			r.startStream(src, k)
			continue
		}
		r.req.APIKey, r.req.Cost, r.req.CountNothing = r.s.keys[k], 0, src.tokens != nil
		r.check()
		epoch := r.dec.Time.UnixMicro() / r.s.window
		if src.tokens == nil {
			tr.record(r.idx, epoch, k, r.dec.Allowed)
			continue
		}
		// Is the tenant already over? Allowed, the answer goes on;
		// denied, its tokens are what the tenant asked for in vain.
		cost, lasts := src.answer()
		if !r.dec.Allowed {
			tr.recordCost(r.idx, epoch, k, false, cost)
			continue
		}
		r.answers.push(pendingAnswer{end: r.now + lasts, key: int32(k), cost: int32(cost)})
	}
}

// reserve reserves an answer's estimate for a request of key k; denied,
// the answer's tokens are what the tenant asked for in vain.
func (r *region) reserve(src *source, k int) {
	cost, lasts := src.answer()
	est := src.tokens.Reserve
	r.req.APIKey, r.req.Cost, r.req.CountNothing = r.s.keys[k], est, false
	ttl := time.Duration(float64(src.tokens.Max)/src.tokens.PerSecond*float64(time.Second)) + 10*time.Second
	res, err := r.engine.Reserve(background, &r.req, ttl, &r.dec)
	if err != nil {
		panic(err) // the scenario's requests are well formed
	}
	epoch := r.dec.Time.UnixMicro() / r.s.window
	if !r.dec.Allowed || res.ID == "" {
		r.s.truth.recordCost(r.idx, epoch, k, false, cost)
		return
	}
	r.answers.push(pendingAnswer{end: r.now + lasts, key: int32(k), cost: int32(cost), rsv: &reservedAnswer{id: res.ID, estimate: est, epoch: epoch}})
}

// commit commits a reserved answer's tokens, and counts what the store
// counted: the estimate in the window it was taken in, less what came
// back (only while that window holds), or more past it, now.
func (r *region) commit(a pendingAnswer) {
	_, err := r.engine.Settle(background, a.rsv.id, int64(a.cost))
	tr, k, cost, est := r.s.truth, int(a.key), int64(a.cost), a.rsv.estimate
	now := r.clock().UnixMicro() / r.s.window
	switch {
	case errors.Is(err, regional.ErrStoreUnavailable), errors.Is(err, regional.ErrReservationNotFound):
		// Not settled (the store down, or the reservation ended by a
		// clock that jumped): the estimate stays counted.
		tr.recordCost(r.idx, a.rsv.epoch, k, true, est)
	case err != nil:
		panic(err) // made here
	case cost <= est && now == a.rsv.epoch:
		tr.recordCost(r.idx, a.rsv.epoch, k, true, cost)
	case cost <= est:
		tr.recordCost(r.idx, a.rsv.epoch, k, true, est)
	default:
		tr.recordCost(r.idx, a.rsv.epoch, k, true, est)
		tr.recordCost(r.idx, now, k, true, cost-est)
	}
}

// startStream takes a slot for a stream of key k; it holds it while it
// lasts. The truth counts it in flight from now until it ends.
func (r *region) startStream(src *source, k int) {
	r.req.APIKey, r.req.Cost, r.req.CountNothing = r.s.keys[k], 0, false
	r.check()
	r.s.truth.record(r.idx, r.dec.Time.UnixMicro()/r.s.window, k, r.dec.Allowed)
	if !r.dec.Allowed {
		return
	}
	lasts, abandoned := src.stream()
	// In flight until it ends, or the run does.
	r.s.truth.recordStream(r.idx, k, r.now, min(r.now+lasts, r.s.duration-time.Microsecond))
	if r.dec.Held.ID != "" {
		r.answers.push(pendingAnswer{end: r.now + lasts, key: int32(k), slot: r.dec.Held.ID, abandoned: abandoned})
	}
}

// release frees a stream's slot at its end, unless its holder crashed:
// that slot frees itself. A slot that has freed itself already (a stream
// that outlived it) is not found; a store down cannot release it.
func (r *region) release(a pendingAnswer) {
	if a.abandoned {
		return
	}
	_, err := r.engine.Settle(background, a.slot, -1)
	if err != nil && !errors.Is(err, regional.ErrReservationNotFound) && !errors.Is(err, regional.ErrStoreUnavailable) {
		panic(err) // made here
	}
}

// check decides the region's request.
func (r *region) check() {
	if err := r.engine.Check(background, &r.req, &r.dec); err != nil {
		panic(err) // the scenario's requests are well formed
	}
}
