package sim

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// What a live run needs of a scenario: the same scenario shrunk to real
// time and to the deployment's regions (Scale, Restrict), its requests
// drawn in advance (Arrivals), and the links the simulator drew (Report's
// Links) to give the deployment's links the same latencies.

// LinkLatency is the one-way latency of the link between two regions.
type LinkLatency struct {
	A, B    string
	Latency time.Duration
}

// clone copies a scenario deeply enough that changing the copy's traffic,
// faults and clock skews leaves the original alone.
func (s *Scenario) clone() *Scenario {
	c := *s
	c.Regions = slices.Clone(s.Regions)
	c.ClockSkew = maps.Clone(s.ClockSkew)
	c.Modes = slices.Clone(s.Modes)
	c.Traffic = slices.Clone(s.Traffic)
	c.Faults = make([]FaultSpec, len(s.Faults))
	for i, f := range s.Faults {
		f.Regions = slices.Clone(f.Regions)
		f.Groups = slices.Clone(f.Groups)
		for j := range f.Groups {
			f.Groups[j] = slices.Clone(f.Groups[j])
		}
		c.Faults[i] = f
	}
	return &c
}

// Scale divides a scenario's time by factor (at least 1): its duration,
// window, the times of its traffic and faults, and its limit, so that a
// window sees as many requests against the same limit per second in a
// factor-th of the time. Request rates are kept. Gossip, budget and
// network timing are not scaled: they are the system's own, and a live
// deployment's cannot be.
func Scale(sc *Scenario, factor float64) (*Scenario, error) {
	if !(factor >= 1) || math.IsInf(factor, 0) {
		return nil, fmt.Errorf("%w: scale %v: want a finite factor of at least 1", ErrInvalidScenario, factor)
	}
	c := sc.clone()
	d := func(v time.Duration) time.Duration { return time.Duration(math.Round(float64(v) / factor)) }
	c.Duration = d(c.Duration)
	c.Rule.Window = d(c.Rule.Window)
	c.Rule.Limit = max(1, int64(math.Round(float64(c.Rule.Limit)/factor)))
	for i := range c.Traffic {
		t := &c.Traffic[i]
		t.At, t.Over, t.For, t.Period = d(t.At), d(t.Over), d(t.For), d(t.Period)
	}
	for i := range c.Faults {
		f := &c.Faults[i]
		f.At, f.For = d(f.At), d(f.For)
	}
	c.Expect.UtilizationFrom, c.Expect.UtilizationUntil = d(c.Expect.UtilizationFrom), d(c.Expect.UtilizationUntil)
	c.Expect.SettledFrom = d(c.Expect.SettledFrom)
	if factor != 1 {
		c.Description = fmt.Sprintf("%s\n(time scaled down %gx: window %v, limit %d)", c.Description, factor, c.Rule.Window, c.Rule.Limit)
	}
	if err := c.check(c.Name + " scaled"); err != nil {
		return nil, err
	}
	return c, nil
}

// ScaleRate scales a scenario's traffic down by factor (0 < factor ≤ 1):
// every source's rate and peak, and the limit with them, so that demand
// stays the same multiple of the limit; for sim live, which cannot play a
// million requests a second.
func ScaleRate(sc *Scenario, factor float64) (*Scenario, error) {
	if !(factor > 0 && factor <= 1) {
		return nil, fmt.Errorf("%w: rate scale %v: want more than 0, at most 1", ErrInvalidScenario, factor)
	}
	c := sc.clone()
	for i := range c.Traffic {
		c.Traffic[i].Rate *= factor
		c.Traffic[i].Peak *= factor
	}
	c.Rule.Limit = max(1, int64(math.Round(float64(c.Rule.Limit)*factor)))
	if factor != 1 {
		c.Description = fmt.Sprintf("%s\n(traffic scaled down %gx: limit %d)", c.Description, 1/factor, c.Rule.Limit)
	}
	if err := c.check(c.Name + " scaled"); err != nil {
		return nil, err
	}
	return c, nil
}

// Rate is a scenario's traffic at its busiest, in requests a second: the
// sum of its sources' peaks.
func (sc *Scenario) Rate() float64 {
	n := 0.0
	for _, t := range sc.Traffic {
		n += max(t.Rate, t.Peak)
	}
	return n
}

// Restrict plays a scenario on other regions: its i-th region becomes
// names[i]. Regions beyond len(names) are dropped, with their traffic and
// the faults that concern only them; a partition or split keeps the
// regions that remain.
func Restrict(sc *Scenario, names []string) (*Scenario, error) {
	if len(names) < 2 {
		return nil, fmt.Errorf("%w: %s: want at least two regions to play it on, have %d", ErrInvalidScenario, sc.Name, len(names))
	}
	c := sc.clone()
	rename := map[string]string{}
	for i, r := range sc.Regions {
		if i < len(names) {
			rename[r] = names[i]
		}
	}
	keep := func(rs []string) []string {
		var out []string
		for _, r := range rs {
			if n, ok := rename[r]; ok {
				out = append(out, n)
			}
		}
		return out
	}
	c.Regions = keep(sc.Regions)
	c.ClockSkew = map[string]time.Duration{}
	for r, v := range sc.ClockSkew {
		if n, ok := rename[r]; ok {
			c.ClockSkew[n] = v
		}
	}
	if n, ok := rename[sc.GlobalSync.Region]; ok {
		c.GlobalSync.Region = n
	} else {
		c.GlobalSync.Region = c.Regions[0]
	}
	c.Traffic = c.Traffic[:0]
	for _, t := range sc.Traffic {
		if t.Tokens != nil {
			return nil, fmt.Errorf("%w: %s: traffic with tokens runs in the simulator only: a live run does not report answers' tokens yet", ErrInvalidScenario, sc.Name)
		}
		if t.Kind == "tenants" {
			// Homed over whichever regions remain.
			c.Traffic = append(c.Traffic, t)
			continue
		}
		r, ok := rename[t.Region]
		if !ok {
			continue
		}
		t.Region = r
		if t.Kind == "shift" {
			to, ok := rename[t.To]
			if !ok {
				return nil, fmt.Errorf("%w: %s: traffic shifts from %s to %s, which is not among the first %d regions", ErrInvalidScenario, sc.Name, t.Region, t.To, len(names))
			}
			t.To = to
		}
		c.Traffic = append(c.Traffic, t)
	}
	if len(c.Traffic) == 0 {
		return nil, fmt.Errorf("%w: %s: no traffic in its first %d regions", ErrInvalidScenario, sc.Name, len(names))
	}
	c.Faults = c.Faults[:0]
	for _, f := range sc.clone().Faults {
		switch f.Kind {
		case "partition":
			if f.Regions = keep(f.Regions); len(f.Regions) == 0 || len(f.Regions) == len(c.Regions) {
				continue
			}
		case "split":
			var groups [][]string
			for _, g := range f.Groups {
				if g = keep(g); len(g) > 0 {
					groups = append(groups, g)
				}
			}
			if len(groups) < 2 {
				continue
			}
			f.Groups = groups
		case "heal", "globalsync-down":
		default: // faults of one region
			r, ok := rename[f.Region]
			if !ok {
				continue
			}
			f.Region = r
		}
		c.Faults = append(c.Faults, f)
	}
	if err := c.check(c.Name + " restricted"); err != nil {
		return nil, err
	}
	return c, nil
}

// Arrival is one request of a scenario: when, at which region (its index
// in the scenario's regions) and for which key (k0, k1, …).
type Arrival struct {
	At     time.Duration
	Region int
	Key    int
}

// Arrivals draws every request of a scenario's traffic, in time order:
// the requests Run makes of the scenario with the same seed (each source
// draws from its own random source), so that a live run and the
// simulator's see the same traffic.
func Arrivals(sc *Scenario, seed uint64) []Arrival {
	idx := map[string]int{}
	for i, r := range sc.Regions {
		idx[r] = i
	}
	type regionSource struct {
		region int
		src    *source
	}
	var srcs []regionSource
	count := make([]int, len(sc.Regions))
	for _, t := range sc.Traffic {
		trafficSources(t, sc.Regions, sc.Duration, func(r string) *rand.Rand { return sourceRand(seed, idx[r], count[idx[r]]) },
			func(r string, src *source) { srcs = append(srcs, regionSource{idx[r], src}); count[idx[r]]++ })
	}
	var out []Arrival
	for _, rs := range srcs {
		for t := rs.src.gap(0); t < sc.Duration; t = rs.src.gap(t) {
			out = append(out, Arrival{At: t, Region: rs.region, Key: rs.src.key()})
		}
	}
	slices.SortStableFunc(out, func(a, b Arrival) int { return cmp.Compare(a.At, b.At) })
	return out
}
