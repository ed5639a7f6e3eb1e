package transport

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkRLS is one Envoy RLS call in the handler, on an in-memory
// engine (a token bucket the load never drains, as deploy/bench's /search),
// its response marshalled by the daemons' codec (Codec; with -tags
// vtprotobuf, by vtprotobuf's code): what the handler and the engine cost
// and allocate per check, transport aside.
func BenchmarkRLS(b *testing.B) {
	s := newRLSServer(b, `rules:
  - { id: search, match: { endpoint: /search }, by: [api_key], algorithm: token_bucket, capacity: 1000000000, refill_per_second: 1000000 }
`)
	in := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "api_key", Value: "sk_load_42"}, {Key: "endpoint", Value: "/search"}, {Key: "method", Value: "GET"}}}}}
	ctx := context.Background()
	codec := Codec()
	b.ReportAllocs()
	for b.Loop() {
		out, err := s.ShouldRateLimit(ctx, in)
		if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%v, %v", out, err)
		}
		data, err := codec.Marshal(out)
		if err != nil {
			b.Fatal(err)
		}
		data.Free()
	}
}
