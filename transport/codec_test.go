package transport

import (
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// TestCodecMarshalsAsProto: what Codec marshals, by vtprotobuf's code or
// by gRPC's codec, reads back as the message it was: RLS answers allowed
// and denied, one above gRPC's pooling threshold, and a message of no
// vtprotobuf code. make test runs it with -tags vtprotobuf as well, and
// VTMarshals must follow the tag.
func TestCodecMarshalsAsProto(t *testing.T) {
	if VTMarshals() != vtprotobufTag {
		t.Fatalf("VTMarshals() = %v in a build whose vtprotobuf tag is %v", VTMarshals(), vtprotobufTag)
	}
	s := newRLSServer(t, `rules:
  - { id: search, match: { endpoint: /search }, by: [api_key], algorithm: fixed_window, limit: 2, window: 1h }
`)
	desc := func(key string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "api_key", Value: key}, {Key: "endpoint", Value: "/search"}}}
	}
	var msgs []proto.Message
	for i := range 3 { // allowed, allowed, denied
		out, err := s.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k")}})
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 2; (out.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT) != want {
			t.Fatalf("call %d: %v", i, out)
		}
		msgs = append(msgs, out)
	}
	var many []*ratelimitv3.RateLimitDescriptor
	for i := range 40 {
		many = append(many, desc(fmt.Sprint("key-", i)))
	}
	big, err := s.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Descriptors: many})
	if err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, big, &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING})
	c := Codec()
	for _, m := range msgs {
		data, err := c.Marshal(m)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		b := data.Materialize()
		data.Free()
		back := m.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, back); err != nil || !proto.Equal(back, m) {
			t.Fatalf("%T marshalled as %d bytes reads back as %v (%v), want %v", m, len(b), back, err, m)
		}
	}
	if n := proto.Size(big); n <= 1024 {
		t.Fatalf("the large answer is %d bytes: not above gRPC's pooling threshold", n)
	}
}
