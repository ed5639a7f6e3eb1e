package sim

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

// TestScaleAndRestrict: the partition scenario on three regions, scaled
// to 10s windows, is the same story in a sixth of the time: ap cut off
// from 0:10 to 0:30, a limit of 1,000 per 10s, the rates kept, the
// regions beyond the third and their traffic gone, and the original
// untouched.
func TestScaleAndRestrict(t *testing.T) {
	sc, err := Load("partition")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restrict(sc, []string{"us", "eu", "ap"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Scale(r, 6)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Regions, []string{"us", "eu", "ap"}) || s.Rule.Window != 10*time.Second || s.Rule.Limit != 1000 || s.Duration != 50*time.Second {
		t.Fatalf("scaled: regions %v, window %v, limit %d, duration %v", s.Regions, s.Rule.Window, s.Rule.Limit, s.Duration)
	}
	if len(s.Traffic) != 3 || s.Traffic[0].Rate != 60 || len(s.Faults) != 2 ||
		s.Faults[0].At != 10*time.Second || !slices.Equal(s.Faults[0].Regions, []string{"ap"}) || s.Faults[1].At != 30*time.Second {
		t.Fatalf("scaled traffic %+v, faults %+v", s.Traffic, s.Faults)
	}
	if len(sc.Regions) != 5 || sc.Rule.Limit != 6000 || sc.Faults[0].At != time.Minute {
		t.Fatal("scaling changed the original scenario")
	}

	// Renamed: the i-th region plays as the i-th name, faults follow.
	n, err := Restrict(sc, []string{"x", "y", "z", "w"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.Faults[0].Regions, []string{"z"}) || n.Traffic[3].Region != "w" || n.GlobalSync.Region != "x" {
		t.Fatalf("renamed: faults %+v, traffic %+v, globalsync %s", n.Faults, n.Traffic, n.GlobalSync.Region)
	}
	// A partition of regions that are all dropped is dropped.
	two, err := Restrict(sc, []string{"us", "eu"})
	if err != nil {
		t.Fatal(err)
	}
	if len(two.Faults) != 1 || two.Faults[0].Kind != "heal" {
		t.Fatalf("two regions: faults %+v, want the heal alone", two.Faults)
	}

	for _, f := range []float64{0.5, 0, math.NaN(), math.Inf(1)} {
		if _, err := Scale(sc, f); !errors.Is(err, ErrInvalidScenario) {
			t.Errorf("Scale by %v: %v", f, err)
		}
	}
	if _, err := Restrict(sc, []string{"solo"}); !errors.Is(err, ErrInvalidScenario) {
		t.Errorf("Restrict to one region: %v", err)
	}
	shift, err := Load("shift")
	if err != nil {
		t.Fatal(err)
	}
	// us shifts its traffic to ap, the third region: two regions cannot
	// play it.
	if _, err := Restrict(shift, []string{"a", "b"}); !errors.Is(err, ErrInvalidScenario) {
		t.Errorf("shift on two regions: %v, want refused", err)
	}
	if _, err := Restrict(shift, []string{"a", "b", "c"}); err != nil {
		t.Errorf("shift on three regions: %v", err)
	}
}

// TestArrivalsFollowTheTraffic: a scenario's requests, drawn in advance,
// come in time order, at each region's rate, and the same seed draws the
// same ones.
func TestArrivalsFollowTheTraffic(t *testing.T) {
	sc, err := Load("partition")
	if err != nil {
		t.Fatal(err)
	}
	a := Arrivals(sc, 1)
	if !slices.IsSortedFunc(a, func(x, y Arrival) int { return int(x.At - y.At) }) {
		t.Fatal("arrivals out of time order")
	}
	per := make([]float64, len(sc.Regions))
	for _, x := range a {
		if x.At < 0 || x.At >= sc.Duration || x.Key != 0 {
			t.Fatalf("arrival %+v outside the scenario", x)
		}
		per[x.Region]++
	}
	for i, tr := range sc.Traffic {
		got := per[i] / sc.Duration.Seconds()
		if math.Abs(got-tr.Rate) > 0.1*tr.Rate {
			t.Errorf("%s: %.1f requests/s, want about %v", tr.Region, got, tr.Rate)
		}
	}
	// The simulator makes the same requests of the same seed: as many in
	// every window (the shift scenario: a region with two sources).
	for _, name := range []string{"partition", "shift"} {
		sc, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		_, rep := runScenario(t, name, "strict", 3, Options{})
		arr := Arrivals(sc, 3)
		for _, w := range rep.Windows {
			n := int64(0)
			for _, x := range arr {
				if x.At >= w.Start && x.At < w.Start+rep.Window {
					n++
				}
			}
			if n != w.Requests {
				t.Errorf("%s: window %s: %d arrivals drawn, the simulator made %d requests", name, clockString(w.Start), n, w.Requests)
			}
		}
	}
	if b := Arrivals(sc, 1); !slices.Equal(a, b) {
		t.Error("the same seed drew other arrivals")
	}
	if c := Arrivals(sc, 2); slices.Equal(a, c) {
		t.Error("another seed drew the same arrivals")
	}
}

// TestReportListsItsLinks: every pair of regions has its link's latency,
// within the scenario's bounds.
func TestReportListsItsLinks(t *testing.T) {
	_, rep := runScenario(t, "partition", "strict", 1, Options{Duration: 2 * time.Second})
	if want := len(rep.Regions) * (len(rep.Regions) - 1) / 2; len(rep.Links) != want {
		t.Fatalf("%d links, want %d", len(rep.Links), want)
	}
	for _, l := range rep.Links {
		if l.A == l.B || l.Latency < rep.Latency[0] || l.Latency > rep.Latency[1] {
			t.Errorf("link %+v outside %v", l, rep.Latency)
		}
	}
}

// TestScaleTenants: the tenants scenario played on fewer regions keeps its
// tenants, homed over the regions that remain; scaled down in rate, its
// demand stays the same multiple of the limit.
func TestScaleTenants(t *testing.T) {
	sc, err := Load("tenants")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Restrict(sc, []string{"us", "eu", "ap"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Traffic) != 1 || r.Traffic[0].Kind != "tenants" || len(r.Regions) != 3 {
		t.Fatalf("restricted: %+v on %v", r.Traffic, r.Regions)
	}
	s, err := ScaleRate(r, 0.002)
	if err != nil {
		t.Fatal(err)
	}
	if s.Rate() != 2000 || s.Rule.Limit != 20 || sc.Rule.Limit != 10000 || sc.Traffic[0].Rate != 1e6 {
		t.Fatalf("scaled: %v a second, limit %d (the original: %v, %d)", s.Rate(), s.Rule.Limit, sc.Traffic[0].Rate, sc.Rule.Limit)
	}
	if _, err := ScaleRate(r, 2); err == nil {
		t.Fatal("a rate scale of 2 was taken")
	}
	// Each region's part of the arrivals: its tenants at home, the rest
	// spread.
	a := Arrivals(s, 1)
	per := make([]int, 3)
	for _, x := range a {
		per[x.Region]++
	}
	for i, n := range per {
		if n == 0 {
			t.Errorf("region %d: no arrivals", i)
		}
	}
}
