package transport

import (
	"fmt"
	"math"
	"testing"
	"time"

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
// limit's RateLimit message, and gRPC marshals the answers at once (by
// Codec, and with -tags vtprotobuf by vtprotobuf's code): the
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
				data, err := Codec().Marshal(out) // as the daemons' gRPC servers marshal
				var back rlsv3.RateLimitResponse
				if err == nil {
					err = proto.Unmarshal(data.Materialize(), &back)
					data.Free()
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

// TestUnlimitedReplaces: an unlimited entry of an envoyproxy/ratelimit
// configuration replaces the limits it names, as that service does.
func TestUnlimitedReplaces(t *testing.T) {
	s := newRLSServer(t, `domain: vip
descriptors:
  - key: user
    rate_limit: { name: per_user, unit: hour, requests_per_unit: 1 }
  - key: vip
    rate_limit: { unlimited: true, replaces: [{ name: per_user }] }
`)
	desc := func(k, v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	for i := range 3 {
		out, err := s.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "vip", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "a"), desc("vip", "yes")}})
		if err != nil || out.OverallCode != rlsv3.RateLimitResponse_OK || out.Statuses[0].CurrentLimit != nil || out.Statuses[1].LimitRemaining != math.MaxUint32 {
			t.Fatalf("call %d, a VIP: %v, %v", i+1, out, err)
		}
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		out, err := s.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "vip", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "a")}})
		if err != nil || out.OverallCode != want {
			t.Fatalf("call %d without the VIP entry: %v, %v; want %v (the replaced limit counted nothing before)", i+1, out, err, want)
		}
	}
}

// TestEnvoyLimitUnits: a limit's window as Envoy's unit: the largest that
// divides it, times a multiplier, and envoyproxy/ratelimit's week, month
// (30 days) and year (365 days) as themselves.
func TestEnvoyLimitUnits(t *testing.T) {
	day := 24 * time.Hour
	for _, c := range []struct {
		window time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{2 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{day, rlsv3.RateLimitResponse_RateLimit_DAY, 0},
		{7 * day, rlsv3.RateLimitResponse_RateLimit_WEEK, 0},
		{14 * day, rlsv3.RateLimitResponse_RateLimit_DAY, 14},
		{30 * day, rlsv3.RateLimitResponse_RateLimit_MONTH, 0},
		{365 * day, rlsv3.RateLimitResponse_RateLimit_YEAR, 0},
		{1500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 2},
	} {
		rl := envoyLimit(&regional.LimitStatus{Rule: &regional.Rule{ID: "r"}, Limit: 5, Window: c.window})
		if rl.Unit != c.unit || rl.GetUnitMultiplier().GetValue() != c.mult {
			t.Errorf("%v: %v × %d, want %v × %d", c.window, rl.Unit, rl.GetUnitMultiplier().GetValue(), c.unit, c.mult)
		}
	}
}
