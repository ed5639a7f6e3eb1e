package deploy

import (
	"encoding/json"
	"net"
	"os"
	"regexp"
	"strconv"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
)

// llmRoute reads deploy/envoy/llm.yaml as Envoy would (strictly, into
// go-control-plane's types, validated) and returns its ratelimit filter's
// domain and the route's rate_limits.
func llmRoute(t *testing.T) (string, []*routev3.RateLimit) {
	t.Helper()
	hcm := envoyHCM(t, "envoy/llm.yaml")
	var filter ratelimitfilterv3.RateLimit
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(&filter); err != nil {
		t.Fatal(err)
	}
	var perRoute ratelimitfilterv3.RateLimitPerRoute
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	if err := route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(&perRoute); err != nil {
		t.Fatalf("the route's ratelimit config: %v", err)
	}
	return filter.GetDomain(), perRoute.GetRateLimits()
}

// descriptor is what Envoy sends for one of the route's rate_limits: an
// entry per action, from the request's headers; hits_addend from the
// number, or from the response header the format names.
func descriptor(t *testing.T, rl *routev3.RateLimit, request, response map[string]string) *ratelimitv3.RateLimitDescriptor {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, a := range rl.GetActions() {
		switch {
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: h.GetDescriptorKey(), Value: request[h.GetHeaderName()]})
		case a.GetGenericKey() != nil:
			g := a.GetGenericKey()
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: g.GetDescriptorKey(), Value: g.GetDescriptorValue()})
		default:
			t.Fatalf("an action the test does not play: %v", a)
		}
	}
	switch h := rl.GetHitsAddend(); {
	case h.GetNumber() != nil:
		d.HitsAddend = h.GetNumber()
	case h.GetFormat() != "":
		m := regexp.MustCompile(`^%RESP\(([^)]+)\)%$`).FindStringSubmatch(h.GetFormat())
		if m == nil {
			t.Fatalf("hits_addend format %q: want %%RESP(header)%%", h.GetFormat())
		}
		var n uint64
		if err := json.Unmarshal([]byte(response[m[1]]), &n); err != nil {
			t.Fatalf("response header %s: %v", m[1], err)
		}
		d.HitsAddend = wrapperspb.UInt64(n)
	}
	return d
}

// deploy/envoy/llm.yaml and llm-rules.yaml, played as Envoy plays them
// against a regiond on a real redis-server: before each request a check
// that counts nothing, when its answer is done the tokens it used. Once
// the tokens reported pass the tenant's limit, the check says OVER_LIMIT
// (Envoy answers 429); another tenant is unaffected.
func TestEnvoyLLMTokenLimit(t *testing.T) {
	domain, limits := llmRoute(t)
	if len(limits) != 2 || limits[0].GetApplyOnStreamDone() || limits[0].GetHitsAddend().GetNumber() == nil ||
		limits[0].GetHitsAddend().GetNumber().GetValue() != 0 || !limits[1].GetApplyOnStreamDone() || limits[1].GetHitsAddend().GetFormat() == "" {
		t.Fatalf("want a check counting nothing before the request and the tokens at stream end, have %v", limits)
	}
	b, err := os.ReadFile("envoy/llm-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := regional.Parse("llm-rules.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	limit := rules.Rules()[0].Base.Limit
	redis := harness.NewRedis(t, harness.RedisOptions{})
	store, err := regional.NewRedisStore(t.Context(), redis.URL(), regional.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	srv := transport.NewServer(regional.New(regional.Config{Region: "us", Store: store}, rules), transport.Options{Region: "us"})
	srv.SetServing(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ForceServerCodecV2(transport.Codec()))
	srv.RegisterGRPC(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rls := rlsv3.NewRateLimitServiceClient(conn)
	call := func(rl *routev3.RateLimit, key string, tokens int64) rlsv3.RateLimitResponse_Code {
		t.Helper()
		d := descriptor(t, rl, map[string]string{"x-api-key": key}, map[string]string{"x-usage-tokens": strconv.FormatInt(tokens, 10)})
		resp, err := rls.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	before, after := limits[0], limits[1]
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if c := call(before, "sk_a", 0); c != ok {
		t.Fatalf("the first request: %v", c)
	}
	call(after, "sk_a", limit*4/5)
	if c := call(before, "sk_a", 0); c != ok {
		t.Fatalf("at 80%% of the limit: %v", c)
	}
	if c := call(after, "sk_a", limit*3/10); c != over { // Envoy ignores it: the answer is done
		t.Fatalf("the answer that went past the limit: %v, want OVER_LIMIT", c)
	}
	for range 3 { // checks count nothing: the tenant stays over, no more
		if c := call(before, "sk_a", 0); c != over {
			t.Fatalf("past the limit by 10%%: %v, want OVER_LIMIT", c)
		}
	}
	if c := call(before, "sk_b", 0); c != ok {
		t.Fatalf("another tenant: %v", c)
	}
	keys, err := store.Client().Keys(t.Context(), "gq:{tokens:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("counters in Redis %q (%v): want sk_a's alone", keys, err)
	}
}
