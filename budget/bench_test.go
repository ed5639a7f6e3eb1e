package budget

import (
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
