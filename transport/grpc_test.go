package transport

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/geoquota/geoquota/regional"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

func descriptors(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// wantInvalid checks an error is InvalidArgument naming field.
func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("error %v, want InvalidArgument", err)
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok && len(br.FieldViolations) > 0 && br.FieldViolations[0].Field == field {
			return
		}
	}
	t.Fatalf("error %v does not name field %s", err, field)
}

func TestGRPCCheck(t *testing.T) {
	v := newEnv(t, envOptions{})
	c := pb.NewRateLimiterClient(v.conn)
	ctx := t.Context()
	batch := &pb.CheckRequest{Requests: []*pb.Request{
		{Descriptors: descriptors("api_key", "acme", "endpoint", "/minute")},
		{Descriptors: descriptors("api_key", "acme", "endpoint", "/minute")},
		{Descriptors: descriptors("api_key", "acme", "endpoint", "/minute")},
		{Descriptors: descriptors("api_key", "revoked_x", "endpoint", "/minute")},
		{Descriptors: descriptors("api_key", "internal_x", "endpoint", "/minute")},
	}}
	resp, err := c.Check(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	d := resp.Decisions
	if len(d) != 5 || !d[0].Allowed || !d[1].Allowed || d[2].Allowed || d[2].Code != pb.Code_RATE_LIMIT_EXCEEDED ||
		d[3].Code != pb.Code_KEY_BLOCKED || !d[4].Bypassed {
		t.Fatalf("decisions %v", d)
	}
	l := d[2].Limits[0]
	if l.Rule != "minute" || l.Limit != 2 || l.Remaining != 0 || l.WindowMs != 60_000 || l.RetryAfterMs <= 0 || l.ResetAtUnixMs == 0 {
		t.Fatalf("denying limit %v", l)
	}
	// One bad request fails the batch, and nothing is counted.
	before := v.dbsize()
	_, err = c.Check(ctx, &pb.CheckRequest{Requests: []*pb.Request{
		{Descriptors: descriptors("api_key", "fresh", "endpoint", "/minute")},
		{Descriptors: descriptors("api_key", "fresh", "endpoint", "/minute"), Cost: 5},
	}})
	wantInvalid(t, err, "requests[1].cost")
	if after := v.dbsize(); after != before {
		t.Fatalf("a rejected batch counted: %d keys, then %d", before, after)
	}
	for _, tc := range []struct {
		req   *pb.CheckRequest
		field string
	}{
		{&pb.CheckRequest{}, "requests"},
		{&pb.CheckRequest{Requests: []*pb.Request{{Descriptors: descriptors("api_key", "")}}}, "requests[0].descriptors.api_key"},
		{&pb.CheckRequest{Requests: []*pb.Request{{Descriptors: descriptors("api_key", "a", "colour", "red")}}}, "requests[0].descriptors.colour"},
		{&pb.CheckRequest{Requests: []*pb.Request{{Descriptors: descriptors("api_key", string(make([]byte, 513)))}}}, "requests[0].api_key"},
		{&pb.CheckRequest{Requests: []*pb.Request{{Descriptors: descriptors("api_key", "a"), Cost: -1}}}, "requests[0].cost"},
	} {
		_, err := c.Check(ctx, tc.req)
		wantInvalid(t, err, tc.field)
	}

	u, err := c.GetUsage(ctx, &pb.GetUsageRequest{Rule: "minute", Request: &pb.Request{Descriptors: descriptors("api_key", "acme")}})
	if err != nil || u.Used != 2 || u.Limit != 2 || u.Key != "acme" || u.Region != "test-region" || len(u.Regions) != 1 || u.WindowStartUnixMs%60_000 != 0 {
		t.Fatalf("usage %v, %v", u, err)
	}
	if _, err := c.GetUsage(ctx, &pb.GetUsageRequest{Rule: "nope", Request: &pb.Request{}}); status.Code(err) != codes.NotFound {
		t.Fatalf("usage of an unknown rule: %v", err)
	}
}

// TestEnvoyRateLimitExamples: regiond enforces envoyproxy/ratelimit's
// documented examples, read as its runtime directory holds them and
// published as one stream, through go-control-plane's client on Redis:
// the most specific entry, a limit of 0, unlimited, replaces.
func TestEnvoyRateLimitExamples(t *testing.T) {
	src, err := regional.ReadRules("../regional/testdata/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	v := newEnv(t, envOptions{rules: string(src)})
	c := rlsv3.NewRateLimitServiceClient(v.conn)
	ctx := t.Context()
	ask := func(domain string, descs ...[]string) *rlsv3.RateLimitResponse {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: domain}
		for _, kv := range descs {
			d := &ratelimitv3.RateLimitDescriptor{}
			for i := 0; i+1 < len(kv); i += 2 {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%s %v: %v", domain, descs, err)
		}
		return resp
	}
	// The address with a limit of 0 is denied; another has its 10 a second.
	if r := ask("edge_proxy_per_ip", []string{"remote_address", "50.0.0.5"}); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
		r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 || r.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND {
		t.Fatalf("the banned address: %v", r)
	}
	if r := ask("edge_proxy_per_ip", []string{"remote_address", "50.0.0.1"}); r.OverallCode != rlsv3.RateLimitResponse_OK ||
		r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 10 || r.Statuses[0].CurrentLimit.GetName() != "edge_proxy_per_ip.ip" {
		t.Fatalf("another address: %v", r)
	}
	// A day's marketing messages to one number: 5.
	for i := range 6 {
		r := ask("messaging", []string{"message_type", "marketing", "to_number", "2061111111"}, []string{"to_number", "2061111111"})
		want := rlsv3.RateLimitResponse_OK
		if i == 5 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r.OverallCode != want || r.Statuses[1].Code != rlsv3.RateLimitResponse_OK || r.Statuses[1].LimitRemaining != uint32(99-i) {
			t.Fatalf("marketing message %d: %v", i+1, r)
		}
	}
	// Unlimited, and a path no limit ends: OK, no limit named; unlimited
	// says MaxUint32 remaining, as envoyproxy/ratelimit does.
	for _, d := range [][]string{{"ldap", "x"}, {"message_type", "marketing"}} {
		r := ask(map[string]string{"ldap": "internal", "message_type": "messaging"}[d[0]], d)
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil || (r.Statuses[0].LimitRemaining == math.MaxUint32) != (d[0] == "ldap") {
			t.Fatalf("%v: %v", d, r)
		}
	}
	// The entries' order decides, as in envoyproxy/ratelimit: the same
	// entries the other way round meet no limit.
	if r := ask("messaging", []string{"to_number", "2061111111", "message_type", "marketing"}); r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("entries out of the tree's order: %v", r)
	}
	// replaces: with both descriptors, only the replacing limit counts.
	r := ask("example7", []string{"key_1", "value_1", "user", "bkthomps"}, []string{"key_2", "value_2", "user", "bkthomps"})
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit.GetRequestsPerUnit() != 10 {
		t.Fatalf("replaced: %v", r)
	}
	if keys, err := v.store.Client().Keys(ctx, "*key_1_value_1*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("the replaced limit counted: %v, %v", keys, err)
	}
	if r := ask("example7", []string{"key_1", "value_1", "user", "bkthomps"}); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("the replaced limit alone: %v", r)
	}
}

func TestEnvoyRLS(t *testing.T) {
	v := newEnv(t, envOptions{})
	c := rlsv3.NewRateLimitServiceClient(v.conn)
	ctx := t.Context()
	entries := func(kv ...string) *ratelimitv3.RateLimitDescriptor {
		d := &ratelimitv3.RateLimitDescriptor{}
		for i := 0; i+1 < len(kv); i += 2 {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
		}
		return d
	}
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		entries("api_key", "envoy-a", "endpoint", "/minute"),
		entries("api_key", "envoy-a", "endpoint", "/search"),
	}}
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 2 {
		t.Fatalf("first: %v", resp)
	}
	st := resp.Statuses[0]
	if st.CurrentLimit.Name != "minute" || st.CurrentLimit.RequestsPerUnit != 2 || st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE ||
		st.LimitRemaining != 1 || st.DurationUntilReset.AsDuration() <= 0 {
		t.Fatalf("status of the first descriptor: %v", st)
	}
	if s2 := resp.Statuses[1]; s2.CurrentLimit.Name != "search" || s2.LimitRemaining != 29 {
		t.Fatalf("statuses in request order: %v", resp.Statuses)
	}
	headers := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	if headers["RateLimit-Policy"] != `"minute";q=2;w=60, "search";q=30;w=60` || headers["X-RateLimit-Limit"] != "2" {
		t.Fatalf("headers %v", headers)
	}
	// hits_addend is the cost: 2 more spend the minute limit.
	req.HitsAddend = 1
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(1)
	c.ShouldRateLimit(ctx, req)
	resp, err = c.ShouldRateLimit(ctx, req)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("over the limit: %v, %v", resp, err)
	}
	if !slices.ContainsFunc(resp.ResponseHeadersToAdd, func(h *corev3.HeaderValue) bool { return h.Key == "Retry-After" }) {
		t.Fatalf("no Retry-After in %v", resp.ResponseHeadersToAdd)
	}
	// remote_address is the ip.
	resp, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{
		entries("remote_address", "203.0.113.9", "plan", "gold")}})
	if err != nil || resp.Statuses[0].CurrentLimit.Name != "plan" {
		t.Fatalf("remote_address and a custom descriptor: %v, %v", resp, err)
	}
	// As Envoy's reference service answers: a descriptor no rule knows is
	// OK, limited by nothing; a cost more than a rule can ever allow is
	// OVER_LIMIT. Neither counts anything, nor changes another
	// descriptor's answer.
	before := v.dbsize()
	resp, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		entries("api_key", "a", "colour", "red"), entries("api_key", "envoy-b", "endpoint", "/search")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.GetName() != "search" || resp.Statuses[1].LimitRemaining != 29 {
		t.Fatalf("a descriptor no rule knows, beside one: %v, %v", resp, err)
	}
	before++ // envoy-b's search counter
	resp, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
		entries("api_key", "z", "endpoint", "/minute")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("hits_addend 3 on a limit of 2: %v, %v", resp, err)
	}
	resp, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{entries("foo", "bar")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 {
		t.Fatalf("a descriptor of keys no rule knows: %v, %v", resp, err)
	}
	if after := v.dbsize(); after != before {
		t.Fatalf("answers without a limit counted: %d keys, then %d", before, after)
	}
	// A call of no descriptors is InvalidArgument. A descriptor of bad
	// input is OVER_LIMIT and counts nothing, and the call's other
	// descriptors are decided: an error would have Envoy let them all
	// through (failure_mode_deny: false).
	_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{})
	wantInvalid(t, err, "descriptors")
	invalidBefore := metricValue(t, v, `geoquota_checks_total{decision="invalid",rule=""}`)
	for _, bad := range []*ratelimitv3.RateLimitDescriptor{
		{},
		entries("api_key", "a", "api_key", "b"),
		entries("api_key", "a", "remote_address", "not-an-ip"),
		entries("api_key", "", "endpoint", "/search"),
		entries("api_key", strings.Repeat("k", 600), "endpoint", "/search"),
	} {
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			bad, entries("api_key", "envoy-c", "endpoint", "/search")}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].CurrentLimit.GetName() != "search" {
			t.Fatalf("a bad descriptor %v beside a good one: %v, %v", bad, resp, err)
		}
	}
	if got := metricValue(t, v, `geoquota_checks_total{decision="invalid",rule=""}`); got != invalidBefore+5 {
		t.Fatalf(`geoquota_checks_total{decision="invalid"}: %v, want %v`, got, invalidBefore+5)
	}
	if after := v.dbsize(); after != before+1 { // envoy-c's search counter
		t.Fatalf("bad descriptors counted: %d keys, then %d", before, after)
	}
}

func TestGRPCHealthAndReflection(t *testing.T) {
	v := newEnv(t, envOptions{})
	ctx := t.Context()
	h := healthpb.NewHealthClient(v.conn)
	for _, svc := range []string{"", "geoquota.v1.RateLimiter", "envoy.service.ratelimit.v3.RateLimitService"} {
		r, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v, %v", svc, r, err)
		}
	}
	v.srv.SetServing(false)
	if r, _ := h.Check(ctx, &healthpb.HealthCheckRequest{}); r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health while shutting down: %v", r)
	}
	// What grpcurl does: list the services through reflection.
	stream, err := reflectionpb.NewServerReflectionClient(v.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.CloseSend()
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"geoquota.v1.RateLimiter", "geoquota.v1.Admin", "envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, without %s", names, want)
		}
	}
}

// TestCheckBatchAnswersWhatItCounts: a batch whose deadline runs out
// before its last requests (Redis 30 ms away, a deadline of 600 ms, 30
// requests) still answers before the deadline: the requests it checked
// are counted and answered, the rest are marked not counted and counted
// nothing. A single request with a deadline shorter than the store's
// timeout is checked all the same.
func TestCheckBatchAnswersWhatItCounts(t *testing.T) {
	v := newEnv(t, envOptions{latency: 15 * time.Millisecond, timeout: 200 * time.Millisecond, rules: `
rules:
  - { id: batch, match: { endpoint: /batch }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`})
	c := pb.NewRateLimiterClient(v.conn)
	in := &pb.CheckRequest{}
	for i := range 30 {
		in.Requests = append(in.Requests, &pb.Request{Descriptors: descriptors("api_key", fmt.Sprint("k", i), "endpoint", "/batch")})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 600*time.Millisecond)
	defer cancel()
	out, err := c.Check(ctx, in)
	if err != nil {
		t.Fatalf("a batch that ran short of time: %v, want an answer", err)
	}
	counted, uncounted := 0, 0
	for i, d := range out.Decisions {
		st, err := v.engine.Inspect(t.Context(), "batch", &regional.Request{APIKey: fmt.Sprint("k", i), Endpoint: "/batch"})
		if err != nil {
			t.Fatal(err)
		}
		used := st.Limit - st.Remaining
		switch {
		case d.NotCounted && (d.Allowed || d.Code != pb.Code_RATE_LIMITER_UNAVAILABLE || used != 0):
			t.Errorf("request %d: not counted, but %v and %d used", i, d, used)
		case d.NotCounted:
			uncounted++
		case !d.Allowed || used != 1:
			t.Errorf("request %d: answered %v, %d used; want allowed and counted once", i, d, used)
		default:
			if uncounted > 0 {
				t.Errorf("request %d counted after one that was not", i)
			}
			counted++
		}
	}
	t.Logf("%d counted, %d not", counted, uncounted)
	if counted == 0 || uncounted == 0 {
		t.Fatalf("%d counted, %d not: want the batch cut short in its middle", counted, uncounted)
	}
	short, cancel := context.WithTimeout(t.Context(), 150*time.Millisecond)
	defer cancel()
	one, err := c.Check(short, &pb.CheckRequest{Requests: in.Requests[29:]})
	if err != nil || one.Decisions[0].NotCounted || !one.Decisions[0].Allowed {
		t.Fatalf("one request, its deadline (150 ms) under the store's timeout (200 ms): %v, %v; want checked and allowed", one, err)
	}
}

// metricValue is a series' value in /metrics, 0 if it is not there.
func metricValue(t *testing.T, v *env, series string) float64 {
	t.Helper()
	var f float64
	if s := metricLine(t, v, series); s != "" {
		if _, err := fmt.Sscan(s, &f); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
