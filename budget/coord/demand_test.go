package coord_test

import (
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
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

// TestWindowsAheadOfTimeAreRefused: once ticked, the coordinator refuses a
// delta's windows that start more than regional.MaxAhead after its clock
// (a forged window of the year 2100 would be held for good) and takes the
// rest.
func TestWindowsAheadOfTimeAreRefused(t *testing.T) {
	c, err := coord.New(coord.Config{ID: "gs1", Regions: []string{"eu", "us"}, Budget: budget.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC)
	c.Tick(now)
	key := regional.CounterKey("g", "k1")
	soon := now.Add(regional.MaxAhead - time.Second).UnixMilli()
	later := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	rep, err := c.MergeRemote(t.Context(), crdt.Delta{Origin: "us", From: 0, To: 2, Entries: []crdt.Entry{
		{ID: crdt.ID{Key: key, Epoch: soon}, Slots: []crdt.Slot{{Region: "us", P: 5}}},
		{ID: crdt.ID{Key: key, Epoch: later}, Slots: []crdt.Slot{{Region: "us", P: 7}}},
	}})
	if err != nil || rep.Applied != 1 || rep.Ahead != 1 || rep.Rejected() != 1 {
		t.Fatalf("merge: %+v %v; want one slot applied, one ahead", rep, err)
	}
	if got := c.GlobalUsage(key, time.UnixMilli(later))["us"]; got != 0 {
		t.Errorf("the window of 2100 holds %d", got)
	}
	if got := c.GlobalUsage(key, time.UnixMilli(soon))["us"]; got != 5 {
		t.Errorf("the window a few seconds ahead holds %d, want 5 (within the clocks' allowance)", got)
	}
}

// TestKeysOfUnknownRulesAreRefused: with rules, globalsync refuses the
// counters of none of them (of the rules it replaced lately it still
// takes, for their books); without rules it cannot tell, and takes all.
func TestKeysOfUnknownRulesAreRefused(t *testing.T) {
	c, err := coord.New(coord.Config{ID: "gs1", Regions: []string{"eu", "us"}, Budget: budget.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC)
	c.Tick(now)
	epoch := now.Truncate(time.Minute).UnixMilli()
	delta := func(seq uint64, rule string) crdt.Delta {
		return crdt.Delta{Origin: "us", To: seq, Entries: []crdt.Entry{{ID: crdt.ID{Key: regional.CounterKey(rule, "k1"), Epoch: epoch},
			Slots: []crdt.Slot{{Region: "us", P: seq}}}}}
	}
	if rep, _ := c.MergeRemote(t.Context(), delta(1, "nope")); rep.Applied != 1 || rep.UnknownRule != 0 {
		t.Fatalf("without rules: %+v; want taken", rep)
	}
	rules := func(id string) *regional.RuleSet {
		rs, err := regional.Parse("r.yaml", []byte("rules:\n  - { id: "+id+", by: [api_key], scope: global, algorithm: fixed_window, limit: 9, window: 1m }\n"))
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	c.SetRules(now, rules("old"))
	c.SetRules(now.Add(time.Second), rules("g"))
	for _, tc := range []struct {
		rule    string
		applied int
	}{{"g", 1}, {"old", 1}, {"nope", 0}} {
		rep, _ := c.MergeRemote(t.Context(), delta(2, tc.rule))
		if rep.Applied != tc.applied || rep.UnknownRule != 1-tc.applied {
			t.Errorf("rule %s: %+v; want %d applied", tc.rule, rep, tc.applied)
		}
	}
}

// TestObserveKeepsOnlyReportedRules: a follower takes in the leader's
// documents of the rules its regions report, and no other: a message
// cannot make it keep a rule no region runs.
func TestObserveKeepsOnlyReportedRules(t *testing.T) {
	f, err := coord.New(coord.Config{ID: "gs2", Regions: []string{"eu", "us"}, Budget: budget.DefaultConfig()})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Heartbeat(now, gossip.Heartbeat{Region: "eu", Replica: "eu-1", Regions: []string{"eu", "us"},
		Rules: map[string]gossip.RuleReport{"g": {WindowMillis: 60_000, Algorithm: "fixed_window"}}})
	for _, rule := range []string{"g", "made-up"} {
		f.Observe(budget.Document{Rule: rule, Seq: 7, Leader: "gs1", Issued: now})
	}
	docs := f.Budgets()
	if len(docs) != 1 || docs[0].Rule != "g" || docs[0].Seq != 7 {
		t.Fatalf("a follower keeps %+v, want the document of g alone", docs)
	}
}
