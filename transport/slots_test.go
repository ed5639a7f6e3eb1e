package transport

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

const slotRules = `
rules:
  - { id: streams, match: { endpoint: /stream }, by: [api_key], algorithm: concurrency, limit: 3, ttl: 30s }
`

// In-flight limits over HTTP and gRPC on a real redis-server (SPEC §13):
// three checks in flight, each answered with the id that releases it and
// the draft's concurrent-requests unit; the fourth denied; a release that
// frees one, sent twice, counted once; gRPC's checks alike.
func TestConcurrencyOverHTTP(t *testing.T) {
	v := newEnv(t, envOptions{rules: slotRules})
	var ids []string
	for i := range 3 {
		resp := v.check("sk_c", "/stream")
		b := decodeBody(t, resp)
		id, _ := b["reservation"].(string)
		if resp.StatusCode != http.StatusOK || id == "" || b["expires_at"] == nil || b["remaining"] != float64(2-i) {
			t.Fatalf("request %d in flight: %d %v", i+1, resp.StatusCode, b)
		}
		if p := resp.Header.Get("RateLimit-Policy"); p != `"streams";q=3;qu="concurrent-requests"` {
			t.Fatalf("RateLimit-Policy %q", p)
		}
		ids = append(ids, id)
	}
	resp := v.check("sk_c", "/stream")
	b := decodeBody(t, resp)
	if e, _ := b["error"].(map[string]any); resp.StatusCode != http.StatusTooManyRequests || e["code"] != "RATE_LIMIT_EXCEEDED" ||
		!strings.Contains(e["message"].(string), "3 requests in flight") || resp.Header.Get("Retry-After") != "1" || b["reservation"] != nil {
		t.Fatalf("a fourth in flight: %d %v %v", resp.StatusCode, b, resp.Header)
	}
	for range 2 {
		if resp := v.post("/v1/release", `{"reservation":"`+ids[0]+`"}`); resp.StatusCode != http.StatusOK || decodeBody(t, resp)["released"] != true {
			t.Fatalf("release: %d", resp.StatusCode)
		}
	}
	if u := decodeBody(t, v.get("/v1/usage?rule=streams&api_key=sk_c")); u["remaining"] != 1.0 || u["used"] != 2.0 || u["algorithm"] != "concurrency" {
		t.Fatalf("usage after a release: %v", u)
	}
	c := pb.NewRateLimiterClient(v.conn)
	req := &pb.Request{Descriptors: map[string]string{"api_key": "sk_c", "endpoint": "/stream"}}
	res, err := c.Check(t.Context(), &pb.CheckRequest{Requests: []*pb.Request{req, req}})
	if err != nil || !res.Decisions[0].Allowed || res.Decisions[0].Reservation == "" || res.Decisions[0].ExpiresAtUnixMs == 0 ||
		res.Decisions[1].Allowed || res.Decisions[1].Reservation != "" {
		t.Fatalf("two over gRPC, one slot free: %v (%v)", res, err)
	}
	if _, err := c.Release(t.Context(), &pb.SettleRequest{Reservation: res.Decisions[0].Reservation}); err != nil {
		t.Fatal(err)
	}
	if resp := v.check("sk_c", "/stream"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after a release over gRPC: %d", resp.StatusCode)
	}
}

// The reverse proxy releases a request's slot when its response ends:
// streamed to its end, or cut short by a client that went away
// mid-stream.
func TestProxyReleasesSlots(t *testing.T) {
	var hits atomic.Int64
	finish := make(chan struct{}) // ends the stream ?end=1
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("first tokens\n"))
		w.(http.Flusher).Flush()
		ends := finish
		if r.URL.Query().Get("end") == "" {
			ends = nil
		}
		select { // a stream that goes on until told, or until its client goes
		case <-ends:
			w.Write([]byte("last tokens\n"))
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(upstream.Close)
	v := newEnv(t, envOptions{rules: slotRules, upstream: upstream.URL})
	open := func(ctx context.Context, query string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.http.URL+"/stream"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", "sk_p")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	inFlight := func() float64 {
		return decodeBody(t, v.get("/v1/usage?rule=streams&api_key=sk_p"))["used"].(float64)
	}
	var streams []*http.Response
	cancels := make([]context.CancelFunc, 3)
	for i := range 3 {
		ctx, cancel := context.WithCancel(t.Context())
		cancels[i] = cancel
		resp := open(ctx, []string{"?end=1", "", ""}[i])
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %s", i+1, resp.Status)
		}
		streams = append(streams, resp)
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	if resp := open(t.Context(), ""); resp.StatusCode != http.StatusTooManyRequests || hits.Load() != 3 {
		t.Fatalf("a fourth stream: %s, upstream saw %d", resp.Status, hits.Load())
	}
	// One stream ends: its slot comes back.
	finish <- struct{}{}
	if body, err := io.ReadAll(streams[0].Body); err != nil || string(body) != "first tokens\nlast tokens\n" {
		t.Fatalf("the stream that ended: %q (%v)", body, err)
	}
	waitFor(t, 5*time.Second, "the ended stream's slot released", func() bool { return inFlight() == 2 })
	// A client goes away mid-stream: its slot comes back too.
	cancels[1]()
	waitFor(t, 5*time.Second, "the abandoned stream's slot released", func() bool { return inFlight() == 1 })
	for i := range 2 {
		if resp := open(t.Context(), ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d after two ended: %s", i+1, resp.Status)
		}
	}
	if resp := open(t.Context(), ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a fourth again: %s", resp.Status)
	}
}

// Usage reported after a request (/v1/report) is of a request no longer
// in flight: it takes no slot.
func TestReportsTakeNoSlot(t *testing.T) {
	v := newEnv(t, envOptions{rules: `
rules:
  - { id: streams, match: { endpoint: /stream }, by: [api_key], algorithm: concurrency, limit: 2, ttl: 30s }
  - { id: tokens, match: { endpoint: /stream }, by: [api_key], algorithm: fixed_window, limit: 100000, window: 1h, count_over_limit: true }
`})
	for i := range 3 {
		if resp := v.post("/v1/report", `{"descriptors":{"api_key":"sk_r","endpoint":"/stream"},"cost":500}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("report %d: %d %v", i+1, resp.StatusCode, decodeBody(t, resp))
		}
	}
	if u := decodeBody(t, v.get("/v1/usage?rule=streams&api_key=sk_r")); u["used"] != 0.0 {
		t.Fatalf("after three reports: %v slots used, want none", u["used"])
	}
	if u := decodeBody(t, v.get("/v1/usage?rule=tokens&api_key=sk_r")); u["used"] != 1500.0 {
		t.Fatalf("tokens after three reports of 500: %v", u["used"])
	}
}
