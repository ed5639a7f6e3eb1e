package budget

import (
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestReasonsTellTheStep: whatever the demand, the acknowledgements and
// the silences, every lease of a rule says why it is what it is, and what
// it says agrees with the lease: held back by the marks exactly when the
// lease is below what the region wanted; on its floor alone when idle,
// silent or within its floor; the water-filling's share when demand,
// spare or the water level decided it, and less than its demand asks at
// the level; not that share when the hysteresis held it. (budget/coord's
// script testdata/reasons.txt tells each step's story.)
func TestReasonsTellTheStep(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, cfg, rule, names, _ := drawModel(t, 15000, 5)
		floor := cfg.Floor(len(names))
		acked := map[string]uint64{}
		now := t0
		for range rapid.IntRange(1, 40).Draw(t, "steps") {
			for _, r := range names {
				if rapid.IntRange(0, 3).Draw(t, "silent") == 0 {
					continue
				}
				a.Report(rule.ID, Report{Region: r, Demand: rapid.SampledFrom([]float64{0, 0.01, 0.2, 0.5, 1, 3}).Draw(t, "demand"),
					Acked: acked[r], Used: rapid.Float64Range(0, 1).Draw(t, "used"), UsedEpoch: epochOf(now, rule.Window), HasUsed: acked[r] > 0})
			}
			leases, err := a.Rebalance(now, rule, names)
			if err != nil {
				t.Fatal(err)
			}
			demand := a.Demand(rule.ID)
			for _, l := range leases {
				if rapid.Bool().Draw(t, "acknowledge") {
					acked[l.Region] = l.Seq
				}
				r, f := l.Reason, l.Floor+l.Share
				switch {
				case r.Why == "":
					t.Fatalf("%s: lease without a reason: %+v", l.Region, l)
				case (r.Why == WhyMarks) != (f < r.Want-eps):
					t.Fatalf("%s: %s, lease %v, wanted %v", l.Region, r.Why, f, r.Want)
				case r.Demand != demand[l.Region]:
					t.Fatalf("%s: reason's demand %v, the allocator's %v", l.Region, r.Demand, demand[l.Region])
				}
				switch r.Why {
				case WhyIdle, WhySilent, WhyFloor:
					if l.Share > 1e-6 {
						t.Fatalf("%s: %s with a share of %v", l.Region, r.Why, l.Share)
					}
				case WhyDemand, WhySpare, WhyLevel, WhyEven:
					if math.Abs(l.Share-r.Target) > 1e-6 || math.Abs(r.Want-floor-r.Target) > 1e-6 {
						t.Fatalf("%s: %s with a share of %v, water-filling's %v, wanted %v", l.Region, r.Why, l.Share, r.Target, r.Want)
					}
					if r.Why == WhyLevel && r.Target >= r.Demand-floor {
						t.Fatalf("%s: at the level with a share of %v, asking %v", l.Region, r.Target, r.Demand)
					}
					if r.Why == WhyDemand && math.Abs(r.Target-(r.Demand-floor)) > 1e-6 {
						t.Fatalf("%s: demand met with a share of %v, asking %v", l.Region, r.Target, r.Demand)
					}
				case WhyHeld:
					if math.Abs(l.Share-r.Target) <= eps {
						t.Fatalf("%s: held at water-filling's share %v", l.Region, r.Target)
					}
				}
			}
			now = now.Add(time.Duration(rapid.IntRange(200, 3000).Draw(t, "dt_ms")) * time.Millisecond)
		}
	})
}
