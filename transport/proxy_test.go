package transport

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

func TestReverseProxy(t *testing.T) {
	var hits atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("X-Upstream", "yes")
		w.Write([]byte("hello from " + r.URL.Path))
	}))
	defer upstream.Close()
	v := newEnv(t, envOptions{upstream: upstream.URL})

	// The key from X-API-Key; allowed requests forwarded with the headers.
	for i := range 2 {
		resp := v.get("/minute/things", "X-API-Key", "acme")
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK || body != "hello from /minute/things" ||
			resp.Header.Get("X-Upstream") != "yes" || resp.Header.Get("X-RateLimit-Limit") != "2" {
			t.Fatalf("request %d: %s %q %v", i+1, resp.Status, body, resp.Header)
		}
	}
	resp := v.get("/minute/things", "X-API-Key", "acme")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || hits.Load() != 2 {
		t.Fatalf("3rd: %s, upstream saw %d", resp.Status, hits.Load())
	}
	// The key from Authorization: Bearer, counted apart.
	if resp := v.get("/minute", "Authorization", "Bearer other"); resp.StatusCode != http.StatusOK {
		t.Fatalf("bearer key: %s", resp.Status)
	}
	// regiond's own endpoints stay regiond's.
	if resp := v.get("/healthz"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Upstream") != "" {
		t.Fatalf("healthz through the proxy: %s %v", resp.Status, resp.Header)
	}
	if resp := v.get("/minute", "X-API-Key", "revoked_9"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("blocked key through the proxy: %s", resp.Status)
	}
}
