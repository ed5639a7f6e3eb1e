package transport

import (
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/geoquota/geoquota/regional"
)

// newRLSServer is the RLS handler on an in-memory engine with the rules.
func newRLSServer(t testing.TB, rules string) rlsServer {
	t.Helper()
	rs, err := regional.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	return rlsServer{Server: NewServer(regional.New(regional.Config{Logger: discardLogger()}, rs), Options{Logger: discardLogger()})}
}

// TestRLSAnswersShareLimitsSafely: concurrent RLS calls share each
// limit's RateLimit message, and gRPC marshals the answers at once: the
// messages must only be read (the race detector watches, as make test
// runs it), and each answer says its own remaining.
func TestRLSAnswersShareLimitsSafely(t *testing.T) {
	s := newRLSServer(t, `rules:
  - { id: search, match: { endpoint: /search }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`)
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			in := &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: "api_key", Value: fmt.Sprint("k", g)}, {Key: "endpoint", Value: "/search"}}}}}
			for i := range 100 {
				out, err := s.ShouldRateLimit(t.Context(), in)
				if err != nil {
					errs <- err
					return
				}
				b, err := proto.Marshal(out)
				var back rlsv3.RateLimitResponse
				if err == nil {
					err = proto.Unmarshal(b, &back)
				}
				st := back.GetStatuses()
				if err != nil || len(st) != 1 || st[0].GetCurrentLimit().GetRequestsPerUnit() != 1000 ||
					st[0].GetCurrentLimit().GetName() != "search" || st[0].GetLimitRemaining() != uint32(999-i) {
					errs <- fmt.Errorf("caller %d, call %d: %v, %v", g, i, &back, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
