package regional_test

import (
	"context"
	"fmt"
	"time"

	"github.com/geoquota/geoquota/regional"
)

func Example() {
	rules, err := regional.Parse("rules.yaml", []byte(`
rules:
  - id: search
    match: { endpoint: /search }
    by: [api_key]
    algorithm: token_bucket
    capacity: 3
    refill_per_second: 0.5
`))
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := regional.New(regional.Config{Clock: func() time.Time { return now }}, rules)

	req := regional.Request{APIKey: "sk_free_1", Endpoint: "/search", Method: "GET"}
	for range 4 {
		var d regional.Decision
		if err := e.Check(context.Background(), &req, &d); err != nil {
			panic(err)
		}
		l := d.Limit()
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", d.Allowed, l.Remaining, l.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=2s
}
