package transport

import (
	"testing"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// TestBudgetMetricsOfARegionAlone: a region alone (--dev) enforces each
// global rule whole, share 1, and exports no lease gauge, which would say
// 0, "no lease", to an alert; a region among others exports both.
func TestBudgetMetricsOfARegionAlone(t *testing.T) {
	const rules = `rules:
  - { id: g, match: { endpoint: /g }, by: [api_key], algorithm: fixed_window, limit: 100, window: 1m, scope: global }
`
	gauges := func(cfg regional.Config) map[string]float64 {
		rs, err := regional.Parse("rules.yaml", []byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		e := regional.New(cfg, rs)
		m := NewMetrics(e)
		m.AttachGossip(&gossip.Stats{}, e)
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, f := range fams {
			for _, mt := range f.GetMetric() {
				if g := mt.GetGauge(); g != nil {
					out[f.GetName()] = g.GetValue()
				}
			}
		}
		return out
	}
	alone := gauges(regional.Config{Region: "eu", Logger: discardLogger()})
	if share, ok := alone["geoquota_budget_share"]; !ok || share != 1 {
		t.Errorf("alone: geoquota_budget_share %v (%v), want 1", share, ok)
	}
	if v, ok := alone["geoquota_budget_lease_valid"]; ok {
		t.Errorf("alone: geoquota_budget_lease_valid %v exported", v)
	}
	among := gauges(regional.Config{Region: "eu", Logger: discardLogger(), Global: regional.GlobalConfig{Regions: []string{"eu", "us"}}})
	if v, ok := among["geoquota_budget_lease_valid"]; !ok || v != 0 {
		t.Errorf("among others, without a lease: geoquota_budget_lease_valid %v (%v), want 0", v, ok)
	}
	if share := among["geoquota_budget_share"]; share <= 0 || share >= 1 {
		t.Errorf("among others, on the floor: geoquota_budget_share %v", share)
	}
}
