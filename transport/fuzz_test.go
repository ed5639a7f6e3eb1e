package transport

import (
	"errors"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/geoquota/geoquota/regional"
)

// FuzzParseCheck feeds arbitrary bodies to the /v1/check decoder: it never
// panics, and either gives a request or an input error naming a field.
func FuzzParseCheck(f *testing.F) {
	for _, seed := range []string{
		`{"descriptors":{"api_key":"sk_free_1","endpoint":"/search","method":"GET","ip":"203.0.113.7","tier":"free"},"cost":1}`,
		`{"descriptors":{"api_key":"a","plan":"gold"},"domain":"edge"}`,
		`{"descriptors":{"api_key":7}}`,
		`{"descriptors":{}}`,
		`{"cost":-1}`,
		`{"descriptors":{"api_key":"a"}} {}`,
		`[1,2,3]`,
		``,
		`{"descriptors":{"":"x"}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCheck(body)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not an input error", err)
			}
			if field, ok := invalidField(err); !ok || field == "" {
				t.Fatalf("error %v names no field", err)
			}
			return
		}
		if req.Cost < 0 {
			t.Fatalf("negative cost accepted: %+v", req)
		}
	})
}

// FuzzRLS feeds arbitrary bytes, as Envoy's RateLimitRequest, to the RLS
// handler on an in-memory engine: it never panics, and answers either
// InvalidArgument or a status per descriptor.
func FuzzRLS(f *testing.F) {
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "a"}, {Key: "path", Value: "/minute"}}}}},
		{Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "foo", Value: "bar"}}}}, HitsAddend: 40},
		{},
	} {
		b, _ := proto.Marshal(req)
		f.Add(b)
	}
	rules, err := regional.Parse("fuzz.yaml", []byte(testRules))
	if err != nil {
		f.Fatal(err)
	}
	s := rlsServer{Server: NewServer(regional.New(regional.Config{Region: "fuzz", Logger: discardLogger()}, rules), Options{Logger: discardLogger()})}
	f.Fuzz(func(t *testing.T, b []byte) {
		var in rlsv3.RateLimitRequest
		if proto.Unmarshal(b, &in) != nil {
			return
		}
		out, err := s.ShouldRateLimit(t.Context(), &in)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
			return
		}
		if len(out.Statuses) != len(in.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(out.Statuses), len(in.Descriptors))
		}
	})
}
