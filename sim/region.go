package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
)

// maintainEvery is regiond's --maintain-every default.
const maintainEvery = 250 * time.Millisecond

// region is one region: one regiond replica on the real engine, with an
// in-memory store, and the part of the transport that gossips.
type region struct {
	s      *sim
	idx    int
	name   string
	now    time.Duration // true virtual time, as the region's work sees it
	skew   time.Duration
	engine *regional.Engine
	store  *faultyStore // nil: the engine's own memory
	rng    *rand.Rand
	srcs   []*source
	req    regional.Request
	dec    regional.Decision

	published uint64                   // own slots gossiped up to this version
	heard     map[string]time.Duration // endpoint → last message from it
	rejoined  map[string]bool          // regions heard again whose digest has not come since
	holding   bool                     // held a lease at the last sample
}

func newRegion(s *sim, idx int, name string, faulty bool, bcfg budget.Config) (*region, error) {
	r := &region{s: s, idx: idx, name: name, skew: s.sc.ClockSkew[name], heard: map[string]time.Duration{}, rejoined: map[string]bool{},
		rng: rand.New(rand.NewPCG(s.seed, uint64(idx)+1))}
	cfg := regional.DefaultConfig()
	cfg.Region = name
	cfg.Clock = func() time.Time { return s.clock(r.now, r.skew) }
	cfg.Logger = discard
	cfg.Global = regional.GlobalConfig{Regions: s.sc.Regions, Budget: bcfg, StaleAfter: s.staleAfter()}
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

// start schedules the region's gossip: deltas, heartbeats, anti-entropy,
// each at a phase of its own.
func (r *region) start() {
	s, g := r.s, r.s.sc.Gossip
	phase := func(d time.Duration) time.Duration { return time.Duration(r.rng.Int64N(int64(d))) }
	s.every(r.idx, phase(g.Interval), g.Interval, r.publishDelta)
	s.every(r.idx, phase(g.Heartbeat), g.Heartbeat, r.publishHeartbeat)
	s.atFor(r.idx, 0, r.publishDigest) // a replica that starts asks at once
	s.every(r.idx, phase(g.AntiEntropy), g.AntiEntropy, func() {
		r.engine.ExpireGlobal(r.clock())
		r.publishDigest()
	})
	// regiond tends its engine every 250ms (--maintain-every).
	s.every(r.idx, phase(maintainEvery), maintainEvery, func() { r.engine.Maintain(background) })
	for _, src := range r.srcs {
		src.next = src.gap(0)
	}
}

func (r *region) clock() time.Time { return r.s.clock(r.now, r.skew) }

// publishDelta sends the region's slots changed since the last delta.
func (r *region) publishDelta() {
	var d crdt.Delta
	r.engine.GlobalUsage().With(func(c *crdt.Counters) { d = c.OwnDeltaSince(r.published) })
	if len(d.Entries) == 0 {
		return
	}
	r.published = max(r.published, d.To)
	r.s.net.broadcast(r.name, true, func(to endpoint) { to.delta(r.name, d, false) })
}

func (r *region) publishDigest() {
	var dg crdt.Digest
	var err error
	r.engine.GlobalUsage().With(func(c *crdt.Counters) { dg, err = c.Digest(crdt.DefaultDigestBuckets) })
	if err != nil {
		return
	}
	r.s.net.broadcast(r.name, true, func(to endpoint) { to.digest(r.name, dg) })
}

// heartbeat is what a replica tells globalsync of one rule.
type heartbeat struct {
	region    string
	total     float64 // admitted + denied, in limits, since the start
	acked     uint64
	used      float64
	usedEpoch int64
}

func (r *region) publishHeartbeat() {
	d := r.engine.Demand(ruleID)
	hb := heartbeat{region: r.name, total: d.Admitted + d.Denied, used: d.Used, usedEpoch: d.UsedEpoch}
	if _, acked, ok := r.engine.Lease(ruleID); ok {
		hb.acked = acked
	}
	r.s.net.broadcast(r.name, true, func(to endpoint) { to.heartbeat(hb) })
}

// endpoint is what a message can reach: a region or globalsync.
type endpoint interface {
	delta(from string, d crdt.Delta, repair bool)
	digest(from string, dg crdt.Digest)
	heartbeat(hb heartbeat)
	leases(ls []budget.Lease)
}

// hear notes a message from another endpoint; a region silent for longer
// than three heartbeats is back (a partition healed), and the region
// trades digests at once, as the transport does (globalsync, which speaks
// once an anti-entropy round, does not count).
func (r *region) hear(from string) (back bool) {
	if last, ok := r.heard[from]; ok && from != r.name && from != gsName && r.now-last > r.s.staleAfter() {
		r.publishDigest()
		// The way there may come a second after the way here: again a
		// second and two seconds on, as the transport does.
		for i := 1; i <= 2; i++ {
			r.s.atFor(r.idx, r.now+time.Duration(i)*time.Second, r.publishDigest)
		}
		r.rejoined[from] = true
		back = true
	}
	r.heard[from] = r.now
	r.engine.HeardFrom(from, r.clock())
	return back
}

func (r *region) delta(from string, d crdt.Delta, repair bool) {
	r.hear(from)
	r.engine.MergeRemote(background, d)
}

func (r *region) digest(from string, dg crdt.Digest) {
	if back := r.hear(from); r.rejoined[from] && !back {
		// Its first digest since it was heard again: the one sent then
		// may have been lost on a way still cut; send it again.
		delete(r.rejoined, from)
		r.publishDigest()
	}
	var d crdt.Delta
	var err error
	r.engine.GlobalUsage().With(func(c *crdt.Counters) { d, err = c.Diff(dg) })
	if err != nil || len(d.Entries) == 0 {
		return
	}
	r.s.net.send(r.name, from, true, func(to endpoint) { to.delta(r.name, d, true) })
}

func (r *region) heartbeat(hb heartbeat) { r.hear(hb.region) }

func (r *region) leases(ls []budget.Lease) {
	for _, l := range ls {
		r.engine.SetLease(l)
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
	trafficSources(t, s.duration, func(region string) *rand.Rand {
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
func trafficSources(t TrafficSpec, end time.Duration, rng func(region string) *rand.Rand, add func(region string, src *source)) {
	source := func(region string, peak float64, rate func(time.Duration) float64) {
		r := rng(region)
		src := &source{rate: rate, peak: peak, end: end, keys: t.Keys, hot: t.Hot, rng: r}
		if t.Zipf > 0 && t.Keys > 1 {
			src.zipf = rand.NewZipf(r, t.Zipf, 1, uint64(t.Keys-1))
		}
		add(region, src)
	}
	switch t.Kind {
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
		if src == nil {
			return
		}
		r.now = src.next
		k := src.key()
		r.req.APIKey = r.s.keys[k]
		if err := r.engine.Check(background, &r.req, &r.dec); err != nil {
			panic(err) // the scenario's requests are well formed
		}
		epoch := r.dec.Time.UnixMicro() / r.s.window
		tr.record(r.idx, epoch, k, r.dec.Allowed)
		src.next = src.gap(r.now)
	}
}
