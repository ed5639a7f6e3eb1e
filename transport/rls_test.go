package transport

import (
	"fmt"
	"math"
	"os"
	"slices"
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

// TestEnvoyQuotaMode: envoyproxy/ratelimit's example of quota mode, its
// example directory's service_1 (1 a minute) and service_2 (2 a minute):
// a quota descriptor over its limit is OVER_LIMIT on its own and lets the
// call through while another quota of the call is left, as that service
// answers; the call is OVER_LIMIT once every quota of it is spent, or when
// a limit that is not a quota denies.
func TestEnvoyQuotaMode(t *testing.T) {
	src, err := os.ReadFile("../regional/testdata/ratelimit-examples/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := regional.Parse("example.yaml", src)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 26, 12, 0, 10, 0, time.UTC) // one minute's window throughout
	s := rlsServer{Server: NewServer(regional.New(regional.Config{Logger: discardLogger(), Clock: func() time.Time { return at }}, rs),
		Options{Logger: discardLogger()})}
	desc := func(kv ...string) *ratelimitv3.RateLimitDescriptor {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	s1, s2 := desc("service", "service_1"), desc("service", "service_2")
	for i, c := range []struct {
		descs    []*ratelimitv3.RateLimitDescriptor
		overall  rlsv3.RateLimitResponse_Code
		statuses []rlsv3.RateLimitResponse_Code
	}{
		{[]*ratelimitv3.RateLimitDescriptor{s1, s2}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}},
		{[]*ratelimitv3.RateLimitDescriptor{s1, s2}, ok, []rlsv3.RateLimitResponse_Code{over, ok}},     // service_2 is left
		{[]*ratelimitv3.RateLimitDescriptor{s1, s2}, over, []rlsv3.RateLimitResponse_Code{over, over}}, // none is
		{[]*ratelimitv3.RateLimitDescriptor{s1}, over, []rlsv3.RateLimitResponse_Code{over}},
		{[]*ratelimitv3.RateLimitDescriptor{desc("unspec", "a"), s2}, over, []rlsv3.RateLimitResponse_Code{ok, over}}, // a limit left is no quota
		{[]*ratelimitv3.RateLimitDescriptor{desc("unspec", "a")}, ok, []rlsv3.RateLimitResponse_Code{ok}},
		{[]*ratelimitv3.RateLimitDescriptor{desc("unspec", "a"), desc("service", "service_3")}, over, []rlsv3.RateLimitResponse_Code{over, ok}},
	} {
		out, err := s.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: c.descs})
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		var codes []rlsv3.RateLimitResponse_Code
		for _, st := range out.Statuses {
			codes = append(codes, st.Code)
		}
		if out.OverallCode != c.overall || !slices.Equal(codes, c.statuses) {
			t.Errorf("call %d: %v %v, want %v %v", i+1, out.OverallCode, codes, c.overall, c.statuses)
		}
		// The headers of a call let through speak for the limits
		// that let it through: service_2's on the second.
		for _, h := range out.ResponseHeadersToAdd {
			if c.overall == ok && h.Key == "Retry-After" || i == 1 && h.Key == "X-RateLimit-Limit" && h.Value != "2" {
				t.Errorf("call %d: %s: %s", i+1, h.Key, h.Value)
			}
		}
	}
}
