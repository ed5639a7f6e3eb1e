package sim

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/geoquota/geoquota/crdt"
)

// recorder watches the run: the regions' shares over time, lease
// expiries, heals and how long the copies took to agree after them.
type recorder struct {
	s           *sim
	sampleEvery time.Duration
	samples     []Sample
	notes       []Note
	heals       []Heal
}

// Sample is what every region may admit at one time, as a fraction of the
// limit: its lease's allowance while one holds, its floor otherwise.
type Sample struct {
	At     time.Duration
	Shares []float64 // by region, in the scenario's order
	Leased []bool
}

// Note is something that happened: a fault, a heal.
type Note struct {
	At   time.Duration
	Text string
}

// Heal is one heal of the links, and how long after it every region and
// globalsync held everything every region had counted before it (-1: not
// within a minute).
type Heal struct {
	At        time.Duration
	Converged time.Duration
}

// Expiry is a region's lease lapsing: it falls back to its floor.
type Expiry struct {
	At     time.Duration
	Region string
}

// newRecorder samples every 500ms, or every 1/maxSamples of the scenario
// if that is longer (a day's run: every 8.7 s), so that a long run is not
// stopped every 500ms for a sample its chart cannot show.
func newRecorder(s *sim) *recorder {
	every := max(500*time.Millisecond, (s.sc.Duration / maxSamples).Truncate(100*time.Millisecond))
	return &recorder{s: s, sampleEvery: every}
}

// maxSamples bounds a run's samples of the regions' shares.
const maxSamples = 10_000

// start makes room for every sample of the run, one every sampleEvery
// from 0 until the run ends: each place fills in its regions' as it comes
// to them (sample), in parallel with the others.
func (rec *recorder) start() {
	s := rec.s
	for at := time.Duration(0); at < s.duration; at += rec.sampleEvery {
		rec.samples = append(rec.samples, Sample{At: at, Shares: make([]float64, len(s.regions)), Leased: make([]bool, len(s.regions))})
	}
	for _, p := range s.places {
		p.nextSample = 0
	}
}

func (rec *recorder) note(at time.Duration, format string, args ...any) {
	rec.notes = append(rec.notes, Note{At: at, Text: fmt.Sprintf(format, args...)})
}

// sample records the shares of a place's regions if a sample is due at
// the start of the step it runs; it touches the place's own part of the
// samples alone.
func (rec *recorder) sample(p *place) {
	if p.now != p.nextSample || p.now >= rec.s.duration {
		return
	}
	p.nextSample += rec.sampleEvery
	smp := &rec.samples[p.now/rec.sampleEvery]
	for _, r := range p.regions {
		rec.sampleRegion(smp, r)
	}
}

// sampleRegion records one region's share in smp, and its lease's
// expiry if it held one at the last sample and no longer does.
func (rec *recorder) sampleRegion(smp *Sample, r *region) {
	// Key 0 is the busiest counter of every scenario: with a budget of
	// its own, its allowance is what the region gives it.
	share, holds := r.engine.CounterAllowance(ruleID, rec.s.keys[0])
	smp.Shares[r.idx], smp.Leased[r.idx] = share, holds
	if r.holding && !holds {
		r.expiries = append(r.expiries, Expiry{At: smp.At, Region: r.name})
	}
	r.holding = holds
}

// expiries are every region's expiries seen in the samples, in time
// order, then the regions'.
func (rec *recorder) expiries() []Expiry {
	var all []Expiry
	for _, r := range rec.s.regions {
		all = append(all, r.expiries...)
	}
	slices.SortStableFunc(all, func(a, b Expiry) int { return cmp.Compare(a.At, b.At) })
	return all
}

// target is one region's slot of one window, as it stood at a heal.
type target struct {
	id     crdt.ID
	region string
	p      uint64
}

// heal snapshots every region's own slots of the windows still open (and
// the one before), and checks every 10ms until every copy holds them.
func (rec *recorder) heal(at time.Duration) {
	s := rec.s
	var targets []target
	// The window in course and the one before: older ones may be
	// expired before the copies agree on them (Maintain drops windows the
	// stores no longer keep), which would not be a disagreement.
	w := s.sc.Rule.Window
	oldest := (at/w*w - w).Milliseconds() + epoch0.UnixMilli()
	for _, r := range s.regions {
		for _, e := range r.engine.OwnDeltas(0, 0)[0].Entries {
			if e.Epoch < oldest {
				continue
			}
			for _, sl := range e.Slots {
				if sl.Region == r.name && sl.P > 0 {
					targets = append(targets, target{id: e.ID, region: r.name, p: sl.P})
				}
			}
		}
	}
	i := len(rec.heals)
	rec.heals = append(rec.heals, Heal{At: at, Converged: -1})
	var check func()
	check = func() {
		if rec.converged(targets) {
			rec.heals[i].Converged = s.now - at
			return
		}
		if s.now-at < time.Minute && s.now+10*time.Millisecond < s.duration {
			s.at(s.now+10*time.Millisecond, check)
		}
	}
	check()
}

func (rec *recorder) converged(targets []target) bool {
	for _, t := range targets {
		for _, r := range rec.s.regions {
			if r.engine.GlobalCounter(t.id).P.Get(t.region) < t.p {
				return false
			}
		}
		if !rec.s.gs.holds(t) {
			return false
		}
	}
	return true
}
