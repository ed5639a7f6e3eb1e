package sim

import (
	"testing"
	"time"
)

// BenchmarkMillion runs the million scenario (five regions, 1 M requests a
// second over 100,000 keys) for two seconds of virtual time per iteration,
// and reports simulated requests per second of wall time.
func BenchmarkMillion(b *testing.B) {
	sc, err := Load("million")
	if err != nil {
		b.Fatal(err)
	}
	var requests int64
	start := time.Now()
	for b.Loop() {
		rep, err := Run(sc, "strict", 1, Options{Duration: 2 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		requests += rep.Requests
	}
	b.ReportMetric(float64(requests)/time.Since(start).Seconds(), "simreq/s")
}

func BenchmarkManyKeys(b *testing.B) {
	sc, err := Load("many-keys")
	if err != nil {
		b.Fatal(err)
	}
	var requests int64
	start := time.Now()
	for b.Loop() {
		rep, err := Run(sc, "strict", 1, Options{Duration: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		requests += rep.Requests
	}
	b.ReportMetric(float64(requests)/time.Since(start).Seconds(), "simreq/s")
}

// BenchmarkTenants runs the first 5 s of the tenants scenario: 100,000
// tenants homed over five regions, 1,000,000 requests a second.
func BenchmarkTenants(b *testing.B) {
	sc, err := Load("tenants")
	if err != nil {
		b.Fatal(err)
	}
	var requests int64
	start := time.Now()
	for b.Loop() {
		rep, err := Run(sc, "strict", 1, Options{Duration: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		requests += rep.Requests
	}
	b.ReportMetric(float64(requests)/time.Since(start).Seconds(), "simreq/s")
}
