package budget_test

import (
	"fmt"
	"time"

	"github.com/geoquota/geoquota/budget"
)

func Example() {
	a, _ := budget.NewAllocator(budget.DefaultConfig())
	rule := budget.Rule{ID: "tenant-global", Window: time.Minute}
	regions := []string{"ap-south", "eu-west", "us-east"}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	// us-east asks for the whole limit each window, eu-west for a fifth,
	// ap-south for nothing.
	a.Report(rule.ID, budget.Report{Region: "us-east", Demand: 1})
	a.Report(rule.ID, budget.Report{Region: "eu-west", Demand: 0.2})
	leases, _ := a.Rebalance(now, rule, regions)
	for _, l := range leases {
		fmt.Printf("%s: %.3f of the limit until %s\n", l.Region, l.Allowance(), l.Expires.Format(time.TimeOnly))
	}
	// Output:
	// ap-south: 0.033 of the limit until 00:00:10
	// eu-west: 0.200 of the limit until 00:00:10
	// us-east: 0.767 of the limit until 00:00:10
}
