package transport

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/geoquota/geoquota/regional"
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
	// The scheme in any case (RFC 9110): the same key.
	v.get("/minute", "Authorization", "bearer other")
	if resp := v.get("/minute", "Authorization", "BEARER other"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a bearer key whose scheme is written otherwise: %s", resp.Status)
	}
	// regiond's own endpoints stay regiond's.
	if resp := v.get("/healthz"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-Upstream") != "" {
		t.Fatalf("healthz through the proxy: %s %v", resp.Status, resp.Header)
	}
	if resp := v.get("/minute", "X-API-Key", "revoked_9"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("blocked key through the proxy: %s", resp.Status)
	}
}

// TestProxyPathsNormalized: a path written another way than a rule's
// prefix (repeated slashes, dot segments, percent-encoded letters) never
// reaches the upstream unchecked: unclean paths are redirected to their
// clean form, encoded ones are matched decoded, and all count against
// the same key.
func TestProxyPathsNormalized(t *testing.T) {
	var hits atomic.Int64
	var paths []string
	var mu sync.Mutex
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
	}))
	defer upstream.Close()
	v := newEnv(t, envOptions{upstream: upstream.URL})
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	send := func(client *http.Client, path string) int {
		req, err := http.NewRequest(http.MethodGet, v.http.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", "norm")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, p := range []string{"//minute/a", "/x/../minute/b", "/minute/./c", "/minute//d"} {
		if code := send(noFollow, p); code/100 != 3 || hits.Load() != 0 {
			t.Fatalf("GET %s: %d, upstream hit %d times; want a redirect to the clean path, unforwarded", p, code, hits.Load())
		}
	}
	// Followed, each redirect lands on a checked path: the limit (2 a
	// minute) holds across the spellings.
	codes := []int{send(http.DefaultClient, "//minute/a"), send(http.DefaultClient, "/%6Dinute/b"), send(http.DefaultClient, "/x/../minute/c")}
	if codes[0] != 200 || codes[1] != 200 || codes[2] != http.StatusTooManyRequests || hits.Load() != 2 {
		t.Fatalf("three spellings of /minute: %v, upstream hit %d times; want 200, 200, 429 and 2", codes, hits.Load())
	}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/minute/") {
			t.Errorf("the upstream saw %q", p)
		}
	}
}

// TestProxyKeylessRequests: a request without an API key that no rule
// applies to goes through unlimited, but not unseen: regiond warns at
// start when its rules leave such requests unlimited, and counts each in
// geoquota_checks_total{decision="unlimited"}.
func TestProxyKeylessRequests(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	keyed := `rules:
  - { id: per-key, by: [api_key], algorithm: fixed_window, limit: 5, window: 1h }
`
	v := newEnv(t, envOptions{upstream: upstream.URL, rules: keyed})
	resp := v.get("/anything")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Fatalf("a keyless request: %s %v", resp.Status, resp.Header)
	}
	if got := metricLine(t, v, `geoquota_checks_total{decision="unlimited",rule=""}`); got != "1" {
		t.Fatalf(`geoquota_checks_total{decision="unlimited"}: %q, want 1`, got)
	}
	u, _ := url.Parse(upstream.URL)
	for _, c := range []struct {
		rules string
		warn  bool
	}{
		{keyed, true},
		{"rules:\n  - { id: per-ip, by: [ip], capacity: 10, refill_per_second: 1 }\n", false},
		{"rules:\n  - { id: all, match: { endpoint: /api }, algorithm: fixed_window, limit: 1000, window: 1m }\n", false},
		{"rules:\n  - { id: edge, domain: edge, by: [ip], capacity: 10, refill_per_second: 1 }\n", true},
		{"rules:\n  - { id: gold, match: { descriptors: { plan: gold } }, by: [ip], capacity: 10, refill_per_second: 1 }\n", true},
		{"rules:\n  - { id: tiered, by: [ip], tiers: { free: 10 }, algorithm: fixed_window, window: 1m }\n", true},
	} {
		rs, err := regional.Parse("rules.yaml", []byte(c.rules))
		if err != nil {
			t.Fatal(err)
		}
		var logs strings.Builder
		s := NewServer(regional.New(regional.Config{Logger: discardLogger()}, rs),
			Options{ProxyUpstream: u, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		s.Handler()
		if warned := strings.Contains(logs.String(), "requests without an API key"); warned != c.warn {
			t.Errorf("%s: warned %v, want %v:\n%s", c.rules, warned, c.warn, logs.String())
		}
	}
}

// TestRequestBehindProxies: behind trusted proxies the client's address
// is the last X-Forwarded-For hop that is not one of them; an untrusted
// connection's X-Forwarded-For is not believed.
func TestRequestBehindProxies(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	for _, c := range []struct {
		peer string
		xff  []string
		want string
	}{
		{"10.1.2.3:5000", []string{"203.0.113.7"}, "203.0.113.7"},
		{"10.1.2.3:5000", []string{"198.51.100.1, 203.0.113.7, 10.9.9.9"}, "203.0.113.7"},   // a forged first hop stays unread
		{"10.1.2.3:5000", []string{"198.51.100.1", "203.0.113.7, 10.9.9.9"}, "203.0.113.7"}, // several header lines
		{"198.51.100.50:5000", []string{"203.0.113.7"}, "198.51.100.50"},                    // not a trusted peer
		{"10.1.2.3:5000", nil, "10.1.2.3"},
		{"10.1.2.3:5000", []string{"10.4.4.4, 10.5.5.5"}, "10.4.4.4"},    // all trusted: the farthest
		{"10.1.2.3:5000", []string{"bogus, 203.0.113.7"}, "203.0.113.7"}, // the walk stops at the first untrusted
		{"10.1.2.3:5000", []string{"203.0.113.7, bogus"}, "10.1.2.3"},    // garbage next: nothing beyond is believed
		{"[2001:db8::1]:5000", []string{"2001:db8::2, 192.0.2.9"}, "192.0.2.9"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.RemoteAddr = c.peer
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if got := RequestBehind(trusted)(r).IP; got != c.want {
			t.Errorf("peer %s, X-Forwarded-For %q: ip %q, want %q", c.peer, c.xff, got, c.want)
		}
		if got, want := DefaultRequest(r).IP, strings.Trim(c.peer[:strings.LastIndex(c.peer, ":")], "[]"); got != want {
			t.Errorf("without trusted proxies: ip %q, want the connection's %q", got, want)
		}
	}
}

// TestProxyBehindTrustedProxies: regiond's proxy with trusted proxies in
// front counts each client by its own address and passes the chain on.
func TestProxyBehindTrustedProxies(t *testing.T) {
	seen := make(chan string, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("X-Forwarded-For")
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	rs, err := regional.Parse("rules.yaml", []byte("rules:\n  - { id: per-ip, by: [ip], algorithm: fixed_window, limit: 1, window: 1h }\n"))
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(regional.New(regional.Config{Logger: discardLogger()}, rs),
		Options{ProxyUpstream: u, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Logger: discardLogger()})
	front := httptest.NewServer(s.Handler())
	defer front.Close()
	get := func(xff string) int {
		req, _ := http.NewRequest(http.MethodGet, front.URL+"/x", nil)
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get("203.0.113.7"); code != http.StatusOK {
		t.Fatalf("first client: %d", code)
	}
	if got := <-seen; got != "203.0.113.7, 127.0.0.1" {
		t.Fatalf("upstream saw X-Forwarded-For %q", got)
	}
	if code := get("203.0.113.8"); code != http.StatusOK {
		t.Fatalf("another client behind the same proxy, counted apart: %d", code)
	}
	<-seen
	if code := get("203.0.113.7"); code != http.StatusTooManyRequests {
		t.Fatalf("the first client again: %d", code)
	}
}
