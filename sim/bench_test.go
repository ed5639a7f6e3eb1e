package sim

import (
	"testing"
	"time"
)

// benchScenario runs a scenario in strict mode for the given virtual time
// per iteration, and reports simulated requests per second of wall time.
func benchScenario(b *testing.B, name string, d time.Duration) {
	sc, err := Load(name)
	if err != nil {
		b.Fatal(err)
	}
	var requests int64
	start := time.Now()
	for b.Loop() {
		rep, err := Run(sc, "strict", 1, Options{Duration: d})
		if err != nil {
			b.Fatal(err)
		}
		requests += rep.Requests
	}
	b.ReportMetric(float64(requests)/time.Since(start).Seconds(), "simreq/s")
}

// BenchmarkMillion runs the million scenario (five regions, 1 M requests a
// second over 100,000 keys) for two seconds of virtual time per iteration.
func BenchmarkMillion(b *testing.B) { benchScenario(b, "million", 2*time.Second) }

// BenchmarkManyKeys runs the first 10 s of the many-keys scenario.
func BenchmarkManyKeys(b *testing.B) { benchScenario(b, "many-keys", 10*time.Second) }

// BenchmarkTenants runs the first 5 s of the tenants scenario: 100,000
// tenants homed over five regions, 1,000,000 requests a second.
func BenchmarkTenants(b *testing.B) { benchScenario(b, "tenants", 5*time.Second) }

// BenchmarkTenantsFree runs the first 15 s of the tenants-free scenario:
// 100,000 tenants over five regions, 1,000,000 requests a second, with
// budgets of their own for the busiest.
func BenchmarkTenantsFree(b *testing.B) { benchScenario(b, "tenants-free", 15*time.Second) }
