package coord_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/transport/gossip"
)

// TestDocumentsFitAMessage: told that a message takes three fifths of a
// rule's document, the leader sheds the counters that would lose least
// and adds none, until its documents fit; those asking most keep their
// budgets.
func TestDocumentsFitAMessage(t *testing.T) {
	const (
		tenants = 1000
		window  = time.Minute
	)
	regions := []string{"eu", "us"}
	start := tenantStart
	c := newTenantLeader(t, coord.Config{ID: "gs1", Regions: regions}, 1000)
	// Tenant i asks for 0.5 to 0.9 of its limit a window, most of it at eu.
	key := func(i int) string { return fmt.Sprintf("tenant-%04d", i) }
	rate := func(i int) float64 { return (0.5 + 0.4*float64(i)/tenants) / window.Seconds() }
	held, acked := uint64(0), uint64(0)
	maxSize := 0
	var size int
	for half := range 2 * 180 {
		now := start.Add(time.Duration(half) * time.Second / 2)
		elapsed := now.Sub(start).Seconds()
		for _, r := range regions {
			part := 0.8
			if r == "us" {
				part = 0.2
			}
			counters := map[string]gossip.CounterReport{}
			for i := range tenants {
				counters[key(i)] = gossip.CounterReport{Admitted: part * rate(i) * elapsed, Acked: acked, UsedEpoch: now.UnixMilli() / window.Milliseconds()}
			}
			c.Heartbeat(now, gossip.Heartbeat{Region: r, Replica: r, Regions: regions,
				Rules: map[string]gossip.RuleReport{"g": {Admitted: part * 10 * elapsed / window.Seconds(), Acked: acked,
					UsedEpoch: now.UnixMilli() / window.Milliseconds(), WindowMillis: window.Milliseconds(),
					Algorithm: "fixed_window", Limit: 1000, Counters: counters}}})
		}
		acked = held
		if half%2 == 1 {
			continue
		}
		c.Tick(now)
		docs, _, err := c.Rebalance(now)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			b, err := json.Marshal(d)
			if err != nil {
				t.Fatal(err)
			}
			held, size = d.Seq, len(b)
			if half == 2*10 {
				if n := len(d.Counters); n != tenants {
					t.Fatalf("%d counters with budgets of their own at 0:10, want all %d", n, tenants)
				}
				maxSize = size * 3 / 5
				t.Logf("0:10: %d bytes; a message may take %d from now", size, maxSize)
			}
			if maxSize > 0 {
				c.Sized("g", size, maxSize, now)
			}
		}
	}
	d := c.Budget("g")
	if size > maxSize {
		t.Fatalf("3:00: a document of %d bytes (%d counters), want at most %d", size, len(d.Counters), maxSize)
	}
	// Three fifths of the bytes hold fewer than three fifths of the
	// counters: fewer compress less, the document's own part stays, and
	// counters fill 70% of a message at most, less once it overflowed.
	if n := len(d.Counters); n < tenants/10 {
		t.Fatalf("3:00: %d counters with budgets of their own, want at least a tenth of %d: as many as fit", n, tenants)
	}
	for i := tenants - tenants/10; i < tenants; i++ {
		if _, ok := d.Counters[key(i)]; !ok {
			t.Fatalf("3:00: %s, among those asking most, lost its budget", key(i))
		}
	}
	t.Logf("3:00: %d bytes, %d counters", size, len(d.Counters))
}
