package budget

import (
	"maps"
	"math"
	"testing"
	"time"
)

// TestDemandRate: cumulative reports become a rate in limits per window,
// over about the last second; a replica that restarts starts afresh.
func TestDemandRate(t *testing.T) {
	var d DemandRate
	if d.Rate() != 0 || !d.Last().IsZero() {
		t.Fatal("a new DemandRate should be empty")
	}
	window := time.Minute
	// 0.01 limits every 100ms: 0.1 limits a second, 6 limits per window.
	for i := range 20 {
		d.Add(float64(i)*0.01, window, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got := d.Rate(); math.Abs(got-6) > 1e-9 {
		t.Fatalf("rate %v, want 6 limits per window", got)
	}
	// Demand doubles: the rate follows within a second.
	at := t0.Add(2 * time.Second)
	total := 0.19
	for i := range 11 {
		total += 0.02
		d.Add(total, window, at.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got := d.Rate(); math.Abs(got-12) > 1e-9 {
		t.Fatalf("after the rise, rate %v, want 12", got)
	}
	// The replica restarts: its total begins again.
	d.Add(0.01, window, at.Add(1200*time.Millisecond))
	d.Add(0.03, window, at.Add(1400*time.Millisecond))
	if got := d.Rate(); math.Abs(got-6) > 1e-9 || d.Last() != at.Add(1400*time.Millisecond) {
		t.Fatalf("after a restart, rate %v (last %v), want 6 from the new reports", got, d.Last())
	}
}

func TestAttribute(t *testing.T) {
	cases := []struct {
		name    string
		over    int64
		used    map[string]int64
		granted map[string]float64
		want    map[string]int64
	}{
		{"on the region past its grant", 100, map[string]int64{"eu": 500, "us": 600}, map[string]float64{"eu": 0.5, "us": 0.5},
			map[string]int64{"us": 100}},
		{"in proportion to how far past", 90, map[string]int64{"eu": 560, "us": 530}, map[string]float64{"eu": 0.5, "us": 0.5},
			map[string]int64{"eu": 60, "us": 30}},
		{"none past: by usage", 100, map[string]int64{"eu": 300, "us": 800}, map[string]float64{"eu": 0.5, "us": 1},
			map[string]int64{"eu": 27, "us": 72}},
		{"grants unknown: by usage", 100, map[string]int64{"eu": 550, "us": 550}, nil,
			map[string]int64{"eu": 50, "us": 50}},
	}
	for _, c := range cases {
		if got := Attribute(c.over, 1000, c.used, c.granted); !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
