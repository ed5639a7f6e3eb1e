package transport

import (
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

const meteredRules = `
rules:
  - { id: tokens, match: { endpoint: /llm }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h, count_over_limit: true }
  - { id: calls, match: { endpoint: /calls }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`

// Usage known after the response, on a real redis-server: a report past
// the limit of a rule with count_over_limit is counted as debt, and the
// key is denied until it is paid; over Envoy RLS, a descriptor's own
// hits_addend of 0 is a check that counts nothing.
func TestReportsPastTheLimitAreDebt(t *testing.T) {
	v := newEnv(t, envOptions{rules: meteredRules})
	report := func(key, endpoint string, cost string) map[string]any {
		t.Helper()
		resp := v.post("/v1/report", `{"descriptors":{"api_key":"`+key+`","endpoint":"`+endpoint+`"},"cost":`+cost+`}`)
		b := decodeBody(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("report of %s: %d %v", cost, resp.StatusCode, b)
		}
		return b
	}
	if b := report("sk_1", "/llm", "700"); b["charged"] != 700.0 || b["allowed"] != true || b["remaining"] != 300.0 || b["debt"] != 0.0 || b["rule"] != "tokens" {
		t.Fatalf("a report within the limit: %v", b)
	}
	// 730 tokens against 300 left: all counted, 430 of them as debt.
	if b := report("sk_1", "/llm", "730"); b["charged"] != 730.0 || b["allowed"] != false || b["remaining"] != 0.0 || b["debt"] != 430.0 || b["limit"] != 1000.0 {
		t.Fatalf("a report past the limit: %v", b)
	}
	if resp := v.check("sk_1", "/llm"); resp.StatusCode != 429 {
		t.Fatalf("a check in debt: %d, want 429", resp.StatusCode)
	}
	// The check denied was counted too: every hit sent to the rule is.
	if b := report("sk_1", "/llm", "1"); b["debt"] != 432.0 {
		t.Fatalf("debt after a denied check and a report of 1: %v, want 432", b["debt"])
	}
	// A rule without count_over_limit counts nothing of a report it denies.
	report("sk_1", "/calls", "999")
	if b := report("sk_1", "/calls", "2"); b["charged"] != 0.0 || b["allowed"] != false || b["remaining"] != 1.0 || b["debt"] != 0.0 {
		t.Fatalf("a report past a plain rule's limit: %v", b)
	}

	if m := readAll(t, v.get("/metrics")); !strings.Contains(m, `geoquota_denied_charged_total{rule="tokens"} 732`) {
		t.Fatalf("metrics: want 732 charged of denied hits of rule tokens (730, 1 and 1), have\n%s", grepLines(m, "denied_charged"))
	}
	if b := decodeBody(t, v.get("/v1/usage?rule=tokens&api_key=sk_1")); b["used"] != 1432.0 || b["remaining"] != 0.0 || b["debt"] != 432.0 {
		t.Fatalf("usage in debt: %v, want used 1432, remaining 0, debt 432", b)
	}

	c := rlsv3.NewRateLimitServiceClient(v.conn)
	probe := func(key string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}, {Key: "endpoint", Value: "/llm"}},
			HitsAddend: wrapperspb.UInt64(0),
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	before := v.dbsize()
	if resp := probe("sk_1"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("a check counting nothing, in debt: %v", resp)
	}
	if resp := probe("sk_new"); resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("a check counting nothing, of a new key: %v", resp)
	}
	if after := v.dbsize(); after != before {
		t.Fatalf("checks counting nothing wrote %d keys", after-before)
	}
	if b := report("sk_1", "/llm", "1"); b["debt"] != 433.0 {
		t.Fatalf("checks counting nothing changed the debt: %v, want 433", b["debt"])
	}
	// Tokens reported at stream end, as Envoy's apply_on_stream_done sends
	// them: the descriptor's hits_addend, counted past the limit.
	resp, err := c.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "sk_2"}, {Key: "endpoint", Value: "/llm"}},
		HitsAddend: wrapperspb.UInt64(1500),
	}}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1500 tokens reported on a limit of 1000: %v, %v", resp, err)
	}
	if resp := probe("sk_2"); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after 1500 tokens of 1000, a check counting nothing: %v", resp)
	}
	if b := report("sk_2", "/llm", "1"); b["debt"] != 501.0 {
		t.Fatalf("debt after 1500 and 1 of 1000: %v, want 501", b["debt"])
	}
}

// A report with no cost, or a cost that is not positive, is refused
// naming the field, and counts nothing.
func TestBadReportsCountNothing(t *testing.T) {
	v := newEnv(t, envOptions{rules: meteredRules})
	for _, body := range []string{
		`{"descriptors":{"api_key":"k","endpoint":"/llm"}}`,
		`{"descriptors":{"api_key":"k","endpoint":"/llm"},"cost":0}`,
		`{"descriptors":{"api_key":"k","endpoint":"/llm"},"cost":-5}`,
		`{"descriptors":{"api_key":"k","endpoint":"/llm"},"cost":"7"}`,
	} {
		resp := v.post("/v1/report", body)
		b := decodeBody(t, resp)
		e, _ := b["error"].(map[string]any)
		d, _ := e["details"].(map[string]any)
		if resp.StatusCode != 400 || e["code"] != "INVALID_ARGUMENT" || d["field"] != "cost" {
			t.Errorf("%s: %d %v, want 400 naming cost", body, resp.StatusCode, b)
		}
	}
	if n := v.dbsize(); n != 0 {
		t.Fatalf("bad reports wrote %d keys", n)
	}
}

// Over gRPC, Report counts as /v1/report does, each limit saying what it
// charged and the debt; a request with count_nothing counts nothing; a
// report without a cost is refused naming it, and nothing of its batch is
// counted.
func TestGRPCReports(t *testing.T) {
	v := newEnv(t, envOptions{rules: meteredRules})
	c := pb.NewRateLimiterClient(v.conn)
	req := func(cost int64, nothing bool) *pb.Request {
		return &pb.Request{Descriptors: map[string]string{"api_key": "sk_g", "endpoint": "/llm"}, Cost: cost, CountNothing: nothing}
	}
	resp, err := c.Report(t.Context(), &pb.CheckRequest{Requests: []*pb.Request{req(600, false), req(600, false)}})
	if err != nil {
		t.Fatal(err)
	}
	first, second := resp.Decisions[0], resp.Decisions[1]
	if !first.Allowed || first.Limits[0].Charged != 600 || first.Limits[0].Remaining != 400 || first.Limits[0].Debt != 0 {
		t.Fatalf("600 of 1000: %v", first)
	}
	if second.Allowed || second.Code != pb.Code_RATE_LIMIT_EXCEEDED || second.Limits[0].Charged != 600 || second.Limits[0].Debt != 200 {
		t.Fatalf("600 more: %v, want charged 600, debt 200", second)
	}
	check, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.Request{req(0, true)}})
	if err != nil || check.Decisions[0].Allowed || check.Decisions[0].Limits[0].Charged != 0 || check.Decisions[0].Limits[0].Debt != 200 {
		t.Fatalf("a check counting nothing, in debt: %v, %v", check, err)
	}
	_, err = c.Report(t.Context(), &pb.CheckRequest{Requests: []*pb.Request{req(5, false), req(0, false)}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "requests[1].cost") {
		t.Fatalf("a report without a cost: %v, want InvalidArgument naming requests[1].cost", err)
	}
	check, err = c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.Request{req(0, true)}})
	if err != nil || check.Decisions[0].Limits[0].Debt != 200 {
		t.Fatalf("a refused batch counted: %v, %v", check, err)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
