package budget

import (
	"strconv"
	"testing"
	"time"
)

// BenchmarkRebalance is one rule's rebalance among five regions, with
// reports and acknowledgements: what globalsync spends per global rule per
// second.
func BenchmarkRebalance(b *testing.B) {
	a, _ := NewAllocator(DefaultConfig())
	rule := Rule{ID: "tenant-global", Window: time.Minute}
	regions := []string{"ap-south", "eu-west", "sa-east", "us-east", "us-west"}
	now := t0
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		for i, r := range regions {
			a.Report(rule.ID, Report{Region: r, Demand: float64(i+1) / 5, Acked: seq, HasUsed: true, UsedEpoch: epochOf(now, rule.Window)})
		}
		ls, err := a.Rebalance(now, rule, regions)
		if err != nil {
			b.Fatal(err)
		}
		seq = ls[0].Seq
		now = now.Add(time.Second)
	}
}

// BenchmarkRebalanceCounters is one rule's rebalance among five regions
// with 1,000 counters of their own (the default most), every counter
// reported by every region and acknowledged: globalsync's cost per rule
// per second at that scale.
func BenchmarkRebalanceCounters(b *testing.B) {
	a, _ := NewAllocator(DefaultConfig())
	rule := Rule{ID: "tenant-global", Window: time.Minute}
	regions := []string{"ap-south", "eu-west", "sa-east", "us-east", "us-west"}
	keys := make([]string, DefaultMaxCounters)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i)
	}
	now := t0
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		reportTenants(a, rule, regions, keys, seq, now, func(int) (float64, bool) { return 0.05, true })
		ls, err := a.Rebalance(now, rule, regions)
		if err != nil {
			b.Fatal(err)
		}
		seq = ls[0].Seq
		now = now.Add(time.Second)
	}
	if got := len(a.Counters(rule.ID)); got != len(keys) {
		b.Fatalf("%d counters with budgets of their own, want %d", got, len(keys))
	}
}

// reportTenants has every region report the rule and every tenant's
// counter, acknowledging seq: a tenant asks most of its home region (the
// one of its index modulo the regions', 1.5 of its limit a window) and
// away what away says, if it asks at all.
func reportTenants(a *Allocator, rule Rule, regions, keys []string, seq uint64, now time.Time, away func(k int) (float64, bool)) {
	for i, r := range regions {
		a.Report(rule.ID, Report{Region: r, Demand: float64(i+1) / 5, Acked: seq})
		for k, key := range keys {
			d, ok := away(k)
			if !ok {
				continue
			}
			if k%len(regions) == i {
				d = 1.5 // its home
			}
			a.ReportCounter(rule.ID, key, Report{Region: r, Demand: d, Acked: seq, HasUsed: seq > 0, UsedEpoch: epochOf(now, rule.Window)})
		}
	}
}
