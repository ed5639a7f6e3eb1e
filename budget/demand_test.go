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
		d.Add(float64(i)*0.01, 0, window, t0.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got := d.Rate(); math.Abs(got-6) > 1e-9 {
		t.Fatalf("rate %v, want 6 limits per window", got)
	}
	// Demand doubles: the rate follows within a second.
	at := t0.Add(2 * time.Second)
	total := 0.19
	for i := range 11 {
		total += 0.02
		d.Add(total, 0, window, at.Add(time.Duration(i)*100*time.Millisecond))
	}
	if got := d.Rate(); math.Abs(got-12) > 1e-9 {
		t.Fatalf("after the rise, rate %v, want 12", got)
	}
	// The replica restarts: its total begins again.
	d.Add(0.01, 0, window, at.Add(1200*time.Millisecond))
	d.Add(0.03, 0, window, at.Add(1400*time.Millisecond))
	if got := d.Rate(); math.Abs(got-6) > 1e-9 || d.Last() != at.Add(1400*time.Millisecond) {
		t.Fatalf("after a restart, rate %v (last %v), want 6 from the new reports", got, d.Last())
	}
}

// TestDemandRateCounted: a first report that says how long its total
// was counted gives a rate at once; a restart does again; one counted
// for too short a time gives none.
func TestDemandRateCounted(t *testing.T) {
	window := time.Minute
	var d DemandRate
	d.Add(0.05, 500*time.Millisecond, window, t0) // 0.1 limits a second
	if got := d.Rate(); math.Abs(got-6) > 1e-9 {
		t.Fatalf("rate of a first report counted over 500ms: %v, want 6", got)
	}
	d.Add(0.15, 0, window, t0.Add(500*time.Millisecond)) // then 0.2 a second
	if got := d.Rate(); math.Abs(got-12) > 1e-9 {
		t.Fatalf("rate from two reports: %v, want 12", got)
	}
	d.Add(0.01, 250*time.Millisecond, window, t0.Add(time.Second)) // restarted
	if got := d.Rate(); math.Abs(got-2.4) > 1e-9 {
		t.Fatalf("rate after a restart: %v, want 2.4", got)
	}
	var short DemandRate
	short.Add(0.05, 10*time.Millisecond, window, t0)
	if short.Rate() != 0 {
		t.Fatalf("a total counted over 10ms gave rate %v, want none yet", short.Rate())
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
