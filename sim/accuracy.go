package sim

import (
	"container/heap"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/geoquota/geoquota/regional"
)

// AccuracyOptions shape the traffic of the accuracy study.
type AccuracyOptions struct {
	// Keys is how many API keys send; each has its own counter. 1,000.
	Keys int
	// Limit per Window is every key's limit. 60 per minute.
	Limit  int64
	Window time.Duration
	// Duration is how much virtual time the trace covers. 10 minutes.
	Duration time.Duration
	// MinRate and MaxRate bound the keys' mean rates, in multiples of
	// the limit: each key's is drawn log-uniformly between them. 0.05
	// and 2: most keys well within their limit, some past it, as in
	// real traffic.
	MinRate, MaxRate float64
}

func (o AccuracyOptions) withDefaults() AccuracyOptions {
	if o.Keys <= 0 {
		o.Keys = 1000
	}
	if o.Limit <= 0 {
		o.Limit = 60
	}
	if o.Window <= 0 {
		o.Window = time.Minute
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Minute
	}
	if o.MinRate <= 0 {
		o.MinRate = 0.05
	}
	if o.MaxRate <= 0 {
		o.MaxRate = 2
	}
	return o
}

// AccuracyReport compares, on one trace, the sliding window counter (two
// fixed windows, the previous weighted by how much of it still overlaps)
// with the exact sliding window log.
type AccuracyReport struct {
	Options  AccuracyOptions
	Seed     uint64
	Requests int64
	// AllowedByLog and AllowedByCounter are what each admitted.
	AllowedByLog, AllowedByCounter int64
	// WronglyAllowed counts requests the counter allowed and the log
	// denied; WronglyDenied the other way round.
	WronglyAllowed, WronglyDenied int64
	// BeyondLimit counts requests the counter admitted while it had
	// already admitted the limit in the sliding window before them: what
	// it let through past an exact limit.
	BeyondLimit int64
	// OverLimitKeys counts the keys whose demand went past the limit.
	OverLimitKeys int
}

// WronglyAllowedPct and WronglyDeniedPct are percent of all requests.
func (r *AccuracyReport) WronglyAllowedPct() float64 { return pct(r.WronglyAllowed, r.Requests) }
func (r *AccuracyReport) WronglyDeniedPct() float64  { return pct(r.WronglyDenied, r.Requests) }

// Accuracy runs the study: keys whose rates range over MinRate to MaxRate
// times the limit, each switching between bursts and lulls, sent
// through two engines (the real regional code, in memory, on a virtual
// clock), one with each algorithm. Each engine keeps its own state: a
// request one admits and the other denies changes what each sees next, as
// it would in production.
func Accuracy(seed uint64, opt AccuracyOptions) (*AccuracyReport, error) {
	opt = opt.withDefaults()
	switch {
	case opt.Keys > MaxKeys:
		return nil, fmt.Errorf("%w: keys %d: want at most %d", ErrInvalidScenario, opt.Keys, MaxKeys)
	case opt.MaxRate < opt.MinRate || opt.MaxRate > 1000:
		return nil, fmt.Errorf("%w: rates %v to %v: want min ≤ max ≤ 1000", ErrInvalidScenario, opt.MinRate, opt.MaxRate)
	case opt.Duration > 24*time.Hour:
		return nil, fmt.Errorf("%w: duration %v: want at most 24h", ErrInvalidScenario, opt.Duration)
	}
	var now time.Duration
	clock := func() time.Time { return epoch0.Add(now) }
	engine := func(alg string) (*regional.Engine, error) {
		rs, err := regional.Parse(alg, fmt.Appendf(nil, "rules:\n  - id: r\n    by: [api_key]\n    algorithm: %s\n    limit: %d\n    window: %dms\n",
			alg, opt.Limit, opt.Window.Milliseconds()))
		if err != nil {
			return nil, err
		}
		cfg := regional.DefaultConfig()
		cfg.Clock, cfg.Logger = clock, discard
		return regional.New(cfg, rs), nil
	}
	counter, err := engine("sliding_window_counter")
	if err != nil {
		return nil, err
	}
	exact, err := engine("sliding_window_log")
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x616363))
	perSecond := float64(opt.Limit) / opt.Window.Seconds()
	keys := make([]accKey, opt.Keys)
	q := make(accQueue, 0, opt.Keys)
	for i := range keys {
		k := &keys[i]
		k.name = KeyName(i)
		k.rate = perSecond * opt.MinRate * math.Exp(rng.Float64()*math.Log(opt.MaxRate/opt.MinRate))
		k.burst = rng.Float64() < 0.5
		k.period = opt.Window
		k.switchAt = time.Duration(rng.ExpFloat64() * float64(k.period))
		k.next = k.gap(rng, 0)
		q = append(q, k)
	}
	heap.Init(&q)
	rep := &AccuracyReport{Options: opt, Seed: seed}
	var req regional.Request
	var dc, de regional.Decision
	req.Endpoint = "/"
	for len(q) > 0 {
		k := q[0]
		if k.next >= opt.Duration {
			heap.Pop(&q)
			continue
		}
		now = k.next
		req.APIKey = k.name
		if err := counter.Check(background, &req, &dc); err != nil {
			return nil, err
		}
		if err := exact.Check(background, &req, &de); err != nil {
			return nil, err
		}
		rep.Requests++
		if dc.Allowed {
			rep.AllowedByCounter++
			// The counter's own admissions in the window before now.
			for len(k.admitted) > 0 && k.admitted[0] <= now-opt.Window {
				k.admitted = k.admitted[1:]
			}
			if int64(len(k.admitted)) >= opt.Limit {
				rep.BeyondLimit++
			}
			k.admitted = append(k.admitted, now)
		}
		switch {
		case de.Allowed:
			rep.AllowedByLog++
			if !dc.Allowed {
				rep.WronglyDenied++
			}
		case dc.Allowed:
			rep.WronglyAllowed++
		}
		if !de.Allowed && !k.over {
			k.over = true
			rep.OverLimitKeys++
		}
		k.next = k.gap(rng, now)
		heap.Fix(&q, 0)
	}
	return rep, nil
}

// accKey is one key of the accuracy trace: Poisson arrivals at its rate,
// three times it in a burst and a third of it in a lull (bursts and lulls
// last a window on average).
type accKey struct {
	name     string
	rate     float64
	burst    bool
	switchAt time.Duration
	period   time.Duration // mean length of a burst or a lull
	next     time.Duration
	over     bool
	admitted []time.Duration // the counter's admissions of the last window
}

func (k *accKey) gap(rng *rand.Rand, t time.Duration) time.Duration {
	for t >= k.switchAt {
		k.burst = !k.burst
		k.switchAt += time.Duration(rng.ExpFloat64() * float64(k.period))
	}
	rate := k.rate / 3
	if k.burst {
		rate = k.rate * 3
	}
	return t + time.Duration(rng.ExpFloat64()/rate*1e9) + 1
}

type accQueue []*accKey

func (q accQueue) Len() int { return len(q) }
func (q accQueue) Less(i, j int) bool {
	if q[i].next != q[j].next {
		return q[i].next < q[j].next
	}
	return q[i].name < q[j].name
}
func (q accQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *accQueue) Push(x any)   { *q = append(*q, x.(*accKey)) }
func (q *accQueue) Pop() any {
	old := *q
	k := old[len(old)-1]
	*q = old[:len(old)-1]
	return k
}

// WriteText writes the study's figures.
func (r *AccuracyReport) WriteText(w io.Writer) error {
	o := r.Options
	_, err := fmt.Fprintf(w, `accuracy of the sliding window counter against the exact sliding window log, seed %d
%d keys, limit %d per %v each, %v of traffic (mean rates %gx to %gx the limit, bursts at 3x and lulls at 1/3 of it); %d keys went over their limit
requests %d, admitted by the log %d, by the counter %d
wrongly allowed %d (%.4f%% of requests), wrongly denied %d (%.4f%% of requests)
admitted by the counter past an exact limit (more than %d in the window before them): %d (%.4f%% of requests)
`, r.Seed, o.Keys, o.Limit, o.Window, o.Duration, o.MinRate, o.MaxRate, r.OverLimitKeys, r.Requests, r.AllowedByLog, r.AllowedByCounter,
		r.WronglyAllowed, r.WronglyAllowedPct(), r.WronglyDenied, r.WronglyDeniedPct(), o.Limit, r.BeyondLimit, pct(r.BeyondLimit, r.Requests))
	return err
}
