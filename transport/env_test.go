package transport

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
)

// env is a regiond in this process: a real redis-server, the engine, the
// gRPC API on a loopback port and the HTTP API on another.
type env struct {
	t      *testing.T
	redis  *harness.Redis
	store  *regional.RedisStore
	engine *regional.Engine
	srv    *Server
	http   *httptest.Server
	conn   *grpc.ClientConn
}

const testRules = `
rules:
  - { id: burst, match: { endpoint: /burst }, by: [api_key], algorithm: fixed_window, limit: 3, window: 1s }
  - { id: minute, match: { endpoint: /minute }, by: [api_key], algorithm: fixed_window, limit: 2, window: 1m }
  - { id: shadowed, match: { endpoint: /shadow }, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h, shadow: true }
  - { id: open, match: { endpoint: /open }, by: [api_key], capacity: 1000, refill_per_second: 100 }
  - { id: closed, match: { endpoint: /closed }, by: [api_key], capacity: 1000, refill_per_second: 100, fallback: fail_closed }
  - { id: search, match: { endpoint: /search }, by: [api_key], capacity: 30, refill_per_second: 0.5 }
  - { id: plan, match: { descriptors: { plan: "*" } }, by: [plan], algorithm: fixed_window, limit: 100, window: 1h }
allow: ["internal_*"]
block: ["revoked_*"]
`

type envOptions struct {
	rules       string
	adminToken  string
	strictRules bool
	upstream    string
	breaker     regional.BreakerConfig
	// latency, if set, puts Redis behind a link that delays everything by
	// it each way; timeout bounds each store call (0: the engine's default).
	latency, timeout time.Duration
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	if o.rules == "" {
		o.rules = testRules
	}
	rules, err := regional.Parse("test.yaml", []byte(o.rules))
	if err != nil {
		t.Fatal(err)
	}
	v := &env{t: t, redis: harness.NewRedis(t, harness.RedisOptions{})}
	metrics := NewMetrics(nil)
	url := v.redis.URL()
	if o.latency > 0 {
		link := harness.NewLink(t, v.redis.Addr())
		if err := link.SetLatency(o.latency); err != nil {
			t.Fatal(err)
		}
		url = "redis://" + link.Addr() + "/0"
	}
	v.store, err = regional.NewRedisStore(t.Context(), url, regional.RedisOptions{Observe: metrics.ObserveRedis, Timeout: o.timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.store.Close() })
	violations := regional.NewRedisViolations(v.store.Client(), "test-region", 1000)
	v.engine = regional.New(regional.Config{Region: "test-region", Store: v.store, Violations: violations, Breaker: o.breaker,
		Timeout: o.timeout, Logger: discardLogger()}, rules)
	metrics.Attach(v.engine)
	opts := Options{Region: "test-region", AdminToken: o.adminToken, StrictRules: o.strictRules, Violations: violations, Metrics: metrics, Logger: discardLogger()}
	if o.upstream != "" {
		opts.ProxyUpstream = mustURL(t, o.upstream)
	}
	v.srv = NewServer(v.engine, opts)
	v.srv.SetServing(true)
	v.http = httptest.NewServer(v.srv.Handler())
	t.Cleanup(v.http.Close)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ForceServerCodecV2(Codec())) // the daemons' codec
	v.srv.RegisterGRPC(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	v.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.conn.Close() })
	return v
}

// post sends a JSON body to the HTTP API.
func (v *env) post(path, body string, header ...string) *http.Response {
	v.t.Helper()
	return v.send(http.MethodPost, path, strings.NewReader(body), header...)
}

func (v *env) get(path string, header ...string) *http.Response {
	v.t.Helper()
	return v.send(http.MethodGet, path, nil, header...)
}

// send makes a request to the HTTP API with the given header name, value
// pairs; the response body is closed when the test ends.
func (v *env) send(method, path string, body io.Reader, header ...string) *http.Response {
	v.t.Helper()
	req, err := http.NewRequestWithContext(v.t.Context(), method, v.http.URL+path, body)
	if err != nil {
		v.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		v.t.Fatal(err)
	}
	v.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// check posts a /v1/check for the API key and endpoint.
func (v *env) check(apiKey, endpoint string) *http.Response {
	v.t.Helper()
	return v.post("/v1/check", `{"descriptors":{"api_key":"`+apiKey+`","endpoint":"`+endpoint+`"}}`)
}

// decodeBody reads a JSON body into a generic map.
func decodeBody(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q is not JSON: %v", b, err)
	}
	return m
}

// dbsize is how many keys Redis holds: whether anything was counted.
func (v *env) dbsize() int64 {
	n, err := v.store.Client().DBSize(context.Background()).Result()
	if err != nil {
		v.t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.WaitFor(t, within, what, cond)
}
