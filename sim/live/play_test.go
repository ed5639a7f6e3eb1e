package live

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/sim"
)

// TestWithRule: the scenario's rule goes first in the rules: list, and
// the rules still load, with it.
func TestWithRule(t *testing.T) {
	rule := `  - { id: sim-live-strict, match: { api_key: "simlive-1-*" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: 1000, window: 10s, carry_debt: false }` + "\n"
	for _, base := range [][]byte{regional.ExampleRules, []byte("rules:\n  - { id: a, by: [api_key], algorithm: fixed_window, limit: 1, window: 1s }\n")} {
		out, err := withRule(base, rule)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := regional.Parse("with-rule.yaml", out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if rs.Rule("sim-live-strict") == nil {
			t.Fatalf("the scenario's rule is not among %d rules", len(rs.Rules()))
		}
	}
	if _, err := withRule([]byte("allow: [x]\n"), rule); err == nil {
		t.Fatal("a file without rules: was given a rule")
	}
}

// TestFit: a scenario fitted to a deployment plays on its regions, its
// window as long as asked and its traffic within the rate asked, demand
// the same multiple of the limit; a fault the deployment cannot play is
// refused, and a scenario is never scaled up.
func TestFit(t *testing.T) {
	base, err := sim.Load("tenants-free-live")
	if err != nil {
		t.Fatal(err)
	}
	regions := []string{"x", "y", "z"}
	sc, timeScale, rateScale, err := Fit(base, regions, 10*time.Second, 500)
	if err != nil {
		t.Fatal(err)
	}
	if timeScale != 6 || rateScale != 500.0/1500 || !slices.Equal(sc.Regions, regions) ||
		sc.Rule.Window != 10*time.Second || sc.Duration != 20*time.Second || sc.Rate() != 500 || sc.Rule.Limit != 8 {
		t.Fatalf("fitted: scales %v and %v, regions %v, window %v, %v long, %v a second, limit %d",
			timeScale, rateScale, sc.Regions, sc.Rule.Window, sc.Duration, sc.Rate(), sc.Rule.Limit)
	}
	if base.Rule.Limit != 150 || base.Rate() != 1500 {
		t.Fatal("fitting changed the scenario")
	}
	same, timeScale, rateScale, err := Fit(base, regions, 5*time.Minute, 1e6)
	if err != nil || timeScale != 1 || rateScale != 1 || same.Rule.Window != time.Minute || same.Rate() != 1500 {
		t.Fatalf("fitted to a longer window and a higher rate: scales %v and %v, window %v, %v a second, %v", timeScale, rateScale, same.Rule.Window, same.Rate(), err)
	}
	loss, err := sim.Load("redis-loss")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := Fit(loss, regions, 10*time.Second, 0); err == nil || !strings.Contains(err.Error(), "redis-down") {
		t.Fatalf("redis-loss fitted to a deployment: %v, want its Redis fault refused", err)
	}
}
