package coord_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/regional"
)

// tenantStart is when the tests and benchmarks of many tenants begin.
var tenantStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newTenantLeader is a coordinator of cfg, leading with nothing restored,
// that knows from tenantStart one global rule, g: limit calls a minute
// for each API key, in a fixed window.
func newTenantLeader(t testing.TB, cfg coord.Config, limit int64) *coord.Coordinator {
	t.Helper()
	rs, err := regional.Parse("rules.yaml", []byte(fmt.Sprintf(
		"rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: %d, window: 1m }\n", limit)))
	if err != nil {
		t.Fatal(err)
	}
	c, err := coord.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(nil); err != nil {
		t.Fatal(err)
	}
	c.SetRules(tenantStart, rs)
	return c
}
