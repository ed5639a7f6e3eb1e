package coord_test

import (
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/transport/gossip"
)

// TestFirstHeartbeatGivesDemand: a replica's first heartbeat says how long
// it has counted its demand, so the first rebalance after it shares the
// limit by demand (here 3 to 1); a region whose first heartbeat does not
// say is left on its floor while the others take the room.
func TestFirstHeartbeatGivesDemand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		counted map[string]int64
		want    map[string]bool // regions with a share
	}{
		{"counted", map[string]int64{"eu": 500, "us": 500}, map[string]bool{"eu": true, "us": true}},
		{"us not counted", map[string]int64{"eu": 500}, map[string]bool{"eu": true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := coord.New(coord.Config{ID: "gs1", Regions: []string{"eu", "us"}, Budget: budget.DefaultConfig()})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Restore(nil); err != nil {
				t.Fatal(err)
			}
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for region, total := range map[string]float64{"eu": 0.003, "us": 0.001} { // 0.36 and 0.12 limits a minute
				c.Heartbeat(now, gossip.Heartbeat{Region: region, Replica: region, Regions: []string{"eu", "us"},
					Rules: map[string]gossip.RuleReport{"g": {Admitted: total, CountedMillis: tc.counted[region], WindowMillis: 60_000, Algorithm: "fixed_window"}}})
			}
			docs, _, err := c.Rebalance(now.Add(100 * time.Millisecond))
			if err != nil || len(docs) != 1 {
				t.Fatalf("Rebalance: %v, %v", docs, err)
			}
			shares := map[string]float64{}
			for _, l := range docs[0].All() {
				if l.Key == "" {
					shares[l.Region] = l.Share
				}
			}
			for _, r := range []string{"eu", "us"} {
				if (shares[r] > 0) != tc.want[r] {
					t.Errorf("%s's share %v; want a share: %v", r, shares[r], tc.want[r])
				}
			}
			if tc.want["us"] && !(shares["eu"] > 2*shares["us"]) {
				t.Errorf("shares %v: want eu's about 3 times us's", shares)
			}
		})
	}
}
