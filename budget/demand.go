package budget

import (
	"maps"
	"slices"
	"time"
)

// DemandSpan is how far back a DemandRate looks: long enough that one
// report's noise does not move the budgets, short enough that they follow
// a shift within a rebalance or two.
const DemandSpan = time.Second

// DemandRate turns a replica's cumulative demand (admitted plus denied, in
// limits, as it reports it) into a rate in limits per window, over the
// reports of about the last DemandSpan. The zero value is ready to use.
type DemandRate struct {
	// Span is how far back the rate looks; 0 means DemandSpan.
	Span    time.Duration
	samples []demandSample // oldest first
	rate    float64
	last    time.Time
}

type demandSample struct {
	total float64
	at    time.Time
}

// minCounted is the least time a replica must have counted a total for
// its first report to give a rate: a few checks over a few milliseconds
// say little of a pace.
const minCounted = 100 * time.Millisecond

// Add records a report of total demand so far, made at now, for a rule
// whose window is window; counted is how long the replica has counted
// the total (0: it does not say). The first report, or the first after
// the replica restarted, gives a rate from counted: a region's demand is
// known one report sooner.
func (d *DemandRate) Add(total float64, counted, window time.Duration, now time.Time) {
	if n := len(d.samples); n > 0 && total < d.samples[n-1].total {
		d.samples = d.samples[:0] // the replica restarted: its totals began again
	}
	if len(d.samples) == 0 && counted >= minCounted && total >= 0 {
		d.rate = total / counted.Seconds() * window.Seconds()
	}
	d.samples = append(d.samples, demandSample{total, now})
	d.last = now
	// Keep one sample at least the span old, as the base.
	span := d.Span
	if span <= 0 {
		span = DemandSpan
	}
	drop := 0
	for drop+1 < len(d.samples) && now.Sub(d.samples[drop+1].at) >= span {
		drop++
	}
	d.samples = d.samples[drop:]
	base := d.samples[0]
	if el := now.Sub(base.at); el > 0 {
		d.rate = max(0, total-base.total) / el.Seconds() * window.Seconds()
	}
}

// Rate is the demand in limits per window.
func (d *DemandRate) Rate() float64 { return d.rate }

// Last is when the last report was added (zero: never).
func (d *DemandRate) Last() time.Time { return d.last }

// Attribute splits over-admission (over, in requests) among the regions of
// a window that admitted more than its limit: on the regions that went
// beyond what they were granted (granted: fractions of the limit, by
// region; nil if unknown), in proportion to how far; or, if none did, on
// every region in proportion to what it used. used is what each region
// admitted. Regions are taken in name order, and parts are rounded down.
func Attribute(over, limit int64, used map[string]int64, granted map[string]float64) map[string]int64 {
	excess, sumExcess, sumUsed := map[string]int64{}, int64(0), int64(0)
	for r, u := range used {
		sumUsed += u
		if granted == nil {
			continue
		}
		if e := u - int64(granted[r]*float64(limit)); e > 0 {
			excess[r] = e
			sumExcess += e
		}
	}
	weights, sum := excess, sumExcess
	if sum == 0 {
		weights, sum = used, sumUsed
	}
	out := map[string]int64{}
	for _, r := range slices.Sorted(maps.Keys(weights)) {
		if part := over * weights[r] / max(1, sum); part > 0 {
			out[r] = part
		}
	}
	return out
}
