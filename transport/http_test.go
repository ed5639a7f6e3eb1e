package transport

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/geoquota/geoquota/deploy/local/harness"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

func TestHTTPAllowedThenLimited(t *testing.T) {
	v := newEnv(t, envOptions{})
	// The checks must fall in one window of the minute rule, which runs on
	// Redis's clock: real time. Close to a minute's end, start after it.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 3*time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	for i := range 2 {
		resp := v.check("acme", "/minute")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", i+1, resp.Status)
		}
		b := decodeBody(t, resp)
		if b["allowed"] != true || b["rule"] != "minute" || b["limit"] != 2.0 || b["remaining"] != float64(1-i) ||
			b["degraded"] != false || b["retry_after_seconds"] != 0.0 {
			t.Fatalf("request %d body %v", i+1, b)
		}
		// The store's clock turned into this replica's may put the reset a
		// moment before the minute: reset_at rounds up to it.
		if ra, err := time.Parse(time.RFC3339, b["reset_at"].(string)); err != nil || ra.Unix()%60 != 0 {
			t.Fatalf("reset_at %v: want the next minute boundary", b["reset_at"])
		}
		h := resp.Header
		if h.Get("X-RateLimit-Limit") != "2" || h.Get("X-RateLimit-Remaining") != strconv.Itoa(1-i) ||
			h.Get("RateLimit-Policy") != `"minute";q=2;w=60` {
			t.Fatalf("request %d headers %v", i+1, h)
		}
		if !regexp.MustCompile(`^"minute";r=\d+;t=\d+$`).MatchString(h.Get("RateLimit")) {
			t.Fatalf("RateLimit %q", h.Get("RateLimit"))
		}
		reset, _ := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
		if reset <= time.Now().Unix() || reset > time.Now().Add(61*time.Second).Unix() || reset%60 != 0 {
			t.Fatalf("X-RateLimit-Reset %d: want the next minute boundary", reset)
		}
	}
	resp := v.check("acme", "/minute")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("3rd: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if retry < 1 || retry > 60 || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("3rd headers %v", resp.Header)
	}
	e := decodeBody(t, resp)["error"].(map[string]any)
	d := e["details"].(map[string]any)
	if e["code"] != "RATE_LIMIT_EXCEEDED" || e["message"] == "" || d["rule"] != "minute" || d["limit"] != 2.0 ||
		d["window_seconds"] != 60.0 || d["retry_after_seconds"] != float64(retry) {
		t.Fatalf("429 body %v", e)
	}
	if _, err := time.Parse(time.RFC3339, d["reset_at"].(string)); err != nil {
		t.Fatalf("reset_at %v", d["reset_at"])
	}
}

// TestHTTPRetryAfterIsHonest waits as long as Retry-After says — the
// behaviour under test — and finds the request allowed.
func TestHTTPRetryAfterIsHonest(t *testing.T) {
	v := newEnv(t, envOptions{})
	// Four requests may straddle a second's boundary: then the fourth is
	// rightly allowed, and a new key tries again.
	var resp *http.Response
	var key string
	for try := range 3 {
		key = "hasty" + strconv.Itoa(try)
		for range 3 {
			v.check(key, "/burst")
		}
		if resp = v.check(key, "/burst"); resp.StatusCode == http.StatusTooManyRequests {
			break
		}
	}
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th in the second, three times: %s", resp.Status)
	}
	retry, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if retry != 1 {
		t.Fatalf("Retry-After %d, want 1 for a one-second window", retry)
	}
	time.Sleep(time.Duration(retry) * time.Second)
	if resp := v.check(key, "/burst"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after waiting Retry-After: %s", resp.Status)
	}
}

func TestHTTPListsAndShadow(t *testing.T) {
	v := newEnv(t, envOptions{})
	for range 10 {
		resp := v.check("internal_batch", "/minute")
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "" {
			t.Fatalf("allow-listed key: %s, headers %v", resp.Status, resp.Header)
		}
	}
	resp := v.check("revoked_1", "/minute")
	if resp.StatusCode != http.StatusForbidden || decodeBody(t, resp)["error"].(map[string]any)["code"] != "KEY_BLOCKED" {
		t.Fatalf("blocked key: %s", resp.Status)
	}
	for i := range 5 {
		resp := v.check("watched", "/shadow")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("shadow rule, request %d: %s", i+1, resp.Status)
		}
		b := decodeBody(t, resp)
		limits := b["limits"].([]any)
		if got := limits[0].(map[string]any); got["shadow"] != true || got["allowed"] != (i == 0) {
			t.Fatalf("shadow status %v", got)
		}
	}
}

func TestHTTPUsage(t *testing.T) {
	v := newEnv(t, envOptions{})
	v.check("acme", "/minute")
	resp := v.get("/v1/usage?rule=minute&api_key=acme")
	b := decodeBody(t, resp)
	if resp.StatusCode != http.StatusOK || b["rule"] != "minute" || b["key"] != "acme" || b["limit"] != 2.0 ||
		b["used"] != 1.0 || b["global_used"] != 1.0 || b["algorithm"] != "fixed_window" {
		t.Fatalf("usage %s %v", resp.Status, b)
	}
	regions := b["regions"].([]any)
	if r := regions[0].(map[string]any); len(regions) != 1 || r["region"] != "test-region" || r["used"] != 1.0 || r["stale"] != false {
		t.Fatalf("regions %v", regions)
	}
	if ws, err := time.Parse(time.RFC3339, b["window_start"].(string)); err != nil || ws.Unix()%60 != 0 {
		t.Fatalf("window_start %v", b["window_start"])
	}
	for path, field := range map[string]string{
		"/v1/usage?api_key=acme":                    "rule",
		"/v1/usage?rule=minute":                     "api_key",
		"/v1/usage?rule=minute&api_key=a&api_key=b": "api_key",
	} {
		resp := v.get(path)
		if b := decodeBody(t, resp); resp.StatusCode != http.StatusBadRequest || b["error"].(map[string]any)["details"].(map[string]any)["field"] != field {
			t.Errorf("%s: %s %v, want 400 naming %s", path, resp.Status, b, field)
		}
	}
	if resp := v.get("/v1/usage?rule=nope&api_key=a"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown rule: %s", resp.Status)
	}
}

// TestHTTPUsageOfAPastWindow: window_start= reads a global rule's window
// after it has ended, as every region's copy has it, over HTTP and gRPC;
// a window no longer kept is 404 WINDOW_EXPIRED (gRPC NotFound, the same
// message), not a window nobody used; a window not begun, a rule that is
// not global (it keeps no past windows) and a malformed time are refused
// by name.
func TestHTTPUsageOfAPastWindow(t *testing.T) {
	v := newEnv(t, envOptions{rules: `
rules:
  - { id: g, match: { api_key: "g*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 100, window: 1s }
  - { id: minute, match: { endpoint: /minute }, by: [api_key], algorithm: fixed_window, limit: 2, window: 1m }
`})
	usage := func(query string) map[string]any {
		t.Helper()
		resp := v.get("/v1/usage?" + query)
		b := decodeBody(t, resp)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s %v", query, resp.Status, b)
		}
		return b
	}
	first := usage("rule=g&api_key=g1")["window_start"].(string)
	for range 3 {
		v.check("g1", "/x")
	}
	// Wait for a window in which the three are past (they may have
	// fallen into the window after first).
	var past string
	harness.WaitFor(t, 5*time.Second, "a later window", func() bool {
		b := usage("rule=g&api_key=g1")
		ws := b["window_start"].(string)
		if ws != first && b["global_used"] == 0.0 {
			past = ws
			return true
		}
		return false
	})
	total := 0.0
	for _, ws := range []string{first, mustAdd(t, first, time.Second)} {
		if ws == past {
			continue
		}
		b := usage("rule=g&api_key=g1&window_start=" + ws)
		if b["window_start"] != ws {
			t.Fatalf("window_start=%s answered for %v", ws, b["window_start"])
		}
		total += b["global_used"].(float64)
	}
	if total != 3 {
		t.Fatalf("past windows hold %v of the 3 admitted", total)
	}
	// The same kept window over gRPC.
	c := pb.NewRateLimiterClient(v.conn)
	g1 := &pb.Request{Descriptors: descriptors("api_key", "g1")}
	firstAt, err := time.Parse(time.RFC3339, first)
	if err != nil {
		t.Fatal(err)
	}
	if u, err := c.GetUsage(t.Context(), &pb.GetUsageRequest{Rule: "g", Request: g1, WindowStartUnixMs: firstAt.UnixMilli()}); err != nil ||
		u.WindowStartUnixMs != firstAt.UnixMilli() {
		t.Fatalf("gRPC, window %s: %v, %v", first, u, err)
	}

	// An hour ago: a window of 1 s is kept 61 s from its start.
	hourAgo := mustAdd(t, first, -time.Hour)
	resp := v.get("/v1/usage?rule=g&api_key=g1&window_start=" + hourAgo)
	b := decodeBody(t, resp)
	e, _ := b["error"].(map[string]any)
	msg, _ := e["message"].(string)
	details, _ := e["details"].(map[string]any)
	if resp.StatusCode != http.StatusNotFound || e["code"] != "WINDOW_EXPIRED" || details["field"] != "window_start" ||
		details["window_start"] != hourAgo || details["kept_seconds"] != 61.0 ||
		!strings.Contains(msg, "no longer kept") || !strings.Contains(msg, "1m1s") || !strings.Contains(msg, "usage history") {
		t.Fatalf("an hour ago: %s %v, want 404 WINDOW_EXPIRED", resp.Status, b)
	}
	hourAgoAt, _ := time.Parse(time.RFC3339, hourAgo)
	_, err = c.GetUsage(t.Context(), &pb.GetUsageRequest{Rule: "g", Request: g1, WindowStartUnixMs: hourAgoAt.UnixMilli()})
	if st, _ := status.FromError(err); st.Code() != codes.NotFound || st.Message() != msg {
		t.Fatalf("gRPC, an hour ago: %v, want NotFound %q", err, msg)
	}
	// A window not begun.
	inAnHour := time.Now().Add(time.Hour).UTC()
	_, err = c.GetUsage(t.Context(), &pb.GetUsageRequest{Rule: "g", Request: g1, WindowStartUnixMs: inAnHour.UnixMilli()})
	wantInvalid(t, err, "window_start_unix_ms")

	for query, field := range map[string]string{
		"rule=minute&api_key=a&window_start=2026-01-01T00:00:00Z":         "window_start",
		"rule=g&api_key=g1&window_start=yesterday":                        "window_start",
		"rule=g&api_key=g1&window_start=" + inAnHour.Format(time.RFC3339): "window_start",
	} {
		resp := v.get("/v1/usage?" + query)
		if b := decodeBody(t, resp); resp.StatusCode != http.StatusBadRequest || b["error"].(map[string]any)["code"] != "INVALID_ARGUMENT" ||
			b["error"].(map[string]any)["details"].(map[string]any)["field"] != field {
			t.Errorf("%s: %s %v, want 400 naming %s", query, resp.Status, b, field)
		}
	}
}

func mustAdd(t *testing.T, rfc string, d time.Duration) string {
	t.Helper()
	ts, err := time.Parse(time.RFC3339, rfc)
	if err != nil {
		t.Fatal(err)
	}
	return ts.Add(d).UTC().Format(time.RFC3339)
}

func TestHTTPBadInputCountsNothing(t *testing.T) {
	v := newEnv(t, envOptions{})
	long := strings.Repeat("k", 513)
	for _, tc := range []struct {
		name, body, field string
	}{
		{"not JSON", `{"descriptors":`, "body"},
		{"empty body", ``, "body"},
		{"two values", `{"descriptors":{"api_key":"a"}} {}`, "body"},
		{"unknown field", `{"descriptors":{"api_key":"a"},"costs":1}`, "costs"},
		{"no descriptors", `{"cost":1}`, "descriptors"},
		{"descriptor not a string", `{"descriptors":{"api_key":7}}`, "descriptors.api_key"},
		{"empty value", `{"descriptors":{"api_key":""}}`, "descriptors.api_key"},
		{"oversize key", `{"descriptors":{"api_key":"` + long + `","endpoint":"/minute"}}`, "api_key"},
		{"cost 0", `{"descriptors":{"api_key":"a","endpoint":"/minute"},"cost":0}`, "cost"},
		{"negative cost", `{"descriptors":{"api_key":"a","endpoint":"/minute"},"cost":-3}`, "cost"},
		{"cost above the limit", `{"descriptors":{"api_key":"a","endpoint":"/minute"},"cost":3}`, "cost"},
		{"huge cost", `{"descriptors":{"api_key":"a","endpoint":"/minute"},"cost":99999999999999999999}`, "cost"},
		{"unknown descriptor", `{"descriptors":{"api_key":"a","colour":"red"}}`, "descriptors.colour"},
		{"endpoint without slash", `{"descriptors":{"api_key":"a","endpoint":"minute"}}`, "endpoint"},
		{"bad ip", `{"descriptors":{"api_key":"a","ip":"1.2.3"}}`, "ip"},
		{"not UTF-8", "{\"descriptors\":{\"api_key\":\"a\xff\"}}", "body"},
	} {
		resp := v.post("/v1/check", tc.body)
		b := decodeBody(t, resp)
		e, _ := b["error"].(map[string]any)
		if resp.StatusCode != http.StatusBadRequest || e["code"] != "INVALID_ARGUMENT" || e["details"].(map[string]any)["field"] != tc.field {
			t.Errorf("%s: %s %v, want 400 INVALID_ARGUMENT naming %s", tc.name, resp.Status, b, tc.field)
		}
	}
	// A body declared as something other than JSON: 415, naming the
	// header; JSON, a +json type and curl -d's form type are read.
	good := `{"descriptors":{"api_key":"ct","endpoint":"/minute"}}`
	for _, ct := range []string{"text/plain", "application/xml", "multipart/form-data; boundary=x", "nonsense;;"} {
		resp := v.post("/v1/check", good, "Content-Type", ct)
		b := decodeBody(t, resp)
		e, _ := b["error"].(map[string]any)
		if resp.StatusCode != http.StatusUnsupportedMediaType || e["code"] != "UNSUPPORTED_MEDIA_TYPE" || e["details"].(map[string]any)["field"] != "Content-Type" {
			t.Errorf("Content-Type %s: %s %v, want 415 naming Content-Type", ct, resp.Status, b)
		}
	}
	admin := newEnv(t, envOptions{adminToken: "secret"})
	if resp := admin.post("/v1/admin/grant", `{}`, "Content-Type", "text/plain", "Authorization", "Bearer secret"); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("admin grant as text/plain: %s, want 415", resp.Status)
	}
	if n := v.dbsize(); n != 0 {
		t.Fatalf("bad requests left %d keys in Redis", n)
	}
	for i, ct := range []string{"application/json", "application/json; charset=utf-8", "application/vnd.api+json", "application/x-www-form-urlencoded"} {
		body := fmt.Sprintf(`{"descriptors":{"api_key":"ct%d","endpoint":"/minute"}}`, i)
		if resp := v.post("/v1/check", body, "Content-Type", ct); resp.StatusCode != http.StatusOK {
			t.Errorf("Content-Type %s: %s, want 200", ct, resp.Status)
		}
	}
	// An endpoint the API does not have, a method it does not take.
	if resp := v.post("/v1/chek", `{}`); resp.StatusCode != http.StatusNotFound || decodeBody(t, resp)["error"] == nil {
		t.Errorf("unknown path: %s", resp.Status)
	}
	if resp := v.get("/v1/check"); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/check: %s", resp.Status)
	}
}

func TestHTTPHealthAndMetrics(t *testing.T) {
	v := newEnv(t, envOptions{})
	v.check("acme", "/minute")
	if resp := v.get("/healthz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %s", resp.Status)
	}
	if resp := v.get("/readyz"); resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %s", resp.Status)
	}
	v.srv.SetServing(false)
	if resp := v.get("/readyz"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz while not serving: %s", resp.Status)
	}
	v.srv.SetServing(true)
	resp := v.get("/metrics")
	body := readAll(t, resp)
	for _, want := range []string{
		`geoquota_checks_total{decision="allowed",rule="minute"} 1`,
		`geoquota_check_duration_seconds_count{api="http"} 1`,
		`geoquota_breaker_state 0`,
		`geoquota_redis_pipeline_duration_seconds_count`,
		`geoquota_rule_reloads_total`,
		`geoquota_rule_warnings 0`,
		`geoquota_denial_cache_hits_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "acme") {
		t.Error("/metrics names an API key")
	}
}

// TestKeyLimitIsItsOwnCode: a new key of a rule that tracks its max_keys
// keys is told KEY_LIMIT (429 over HTTP, its own gRPC code), not an
// ordinary over-limit, and counted as key_limit.
func TestKeyLimitIsItsOwnCode(t *testing.T) {
	v := newEnv(t, envOptions{rules: `
rules:
  - { id: capped, match: { endpoint: /capped }, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m, max_keys: 1 }
`})
	if resp := v.check("first", "/capped"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the first key: %s", resp.Status)
	}
	resp := v.check("second", "/capped")
	b := decodeBody(t, resp)
	e, _ := b["error"].(map[string]any)
	if resp.StatusCode != http.StatusTooManyRequests || e == nil || e["code"] != "KEY_LIMIT" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a second key past max_keys 1: %s %v %v", resp.Status, b, resp.Header)
	}
	if d, _ := e["details"].(map[string]any); d["max_keys"] != float64(1) || d["rule"] != "capped" {
		t.Fatalf("details %v", e["details"])
	}
	out, err := pb.NewRateLimiterClient(v.conn).Check(t.Context(), &pb.CheckRequest{Requests: []*pb.Request{
		{Descriptors: descriptors("api_key", "third", "endpoint", "/capped")}}})
	if err != nil || out.Decisions[0].Code != pb.Code_KEY_LIMIT || out.Decisions[0].Allowed {
		t.Fatalf("over gRPC: %v, %v", out, err)
	}
	if got := metricLine(t, v, `geoquota_checks_total{decision="key_limit",rule="capped"}`); got != "2" {
		t.Fatalf("geoquota_checks_total of key_limit: %q, want 2", got)
	}
	if got := metricLine(t, v, `geoquota_tracked_keys{rule="capped"}`); got != "1" {
		t.Fatalf("geoquota_tracked_keys: %q, want 1", got)
	}
	if got := metricLine(t, v, `geoquota_max_keys{rule="capped"}`); got != "1" {
		t.Fatalf("geoquota_max_keys: %q, want 1", got)
	}

	// Another limit over too, with a longer wait: the answer still names
	// the rule that refused the key.
	v = newEnv(t, envOptions{rules: `
rules:
  - { id: capped, match: { endpoint: /capped }, by: [api_key], algorithm: fixed_window, limit: 5, window: 1m, max_keys: 1 }
  - { id: shared, match: { endpoint: /capped }, by: [endpoint], algorithm: fixed_window, limit: 1, window: 1h }
`})
	v.check("first", "/capped")
	v.check("first", "/capped") // shared is over, and its denial remembered
	resp = v.check("second", "/capped")
	b = decodeBody(t, resp)
	e, _ = b["error"].(map[string]any)
	if d, _ := e["details"].(map[string]any); e["code"] != "KEY_LIMIT" || d["rule"] != "capped" || d["max_keys"] != float64(1) {
		t.Fatalf("a key refused beside another limit over: %v", b)
	}
}

// metricLine returns the value of one series on the server's /metrics.
func metricLine(t *testing.T, v *env, series string) string {
	t.Helper()
	resp := v.get("/metrics")
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if val, ok := strings.CutPrefix(line, series+" "); ok {
			return val
		}
	}
	return ""
}

// TestGlobalDenialSaysWhoseLimit: a global limit's 429 says the limit is
// worldwide and the region admits its share, since the region may have
// spent its share while the limit has room elsewhere; a regional one's
// does not.
func TestGlobalDenialSaysWhoseLimit(t *testing.T) {
	v := newEnv(t, envOptions{rules: `
rules:
  - { id: g, match: { api_key: "g*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 1, window: 1h }
  - { id: minute, match: { endpoint: /minute }, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h }
`})
	for _, c := range []struct{ key, path, rule string }{{"g1", "/x", "g"}, {"r1", "/minute", "minute"}} {
		v.check(c.key, c.path)
		resp := v.check(c.key, c.path)
		b := decodeBody(t, resp)
		e, _ := b["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(msg, `rule "`+c.rule+`"`) ||
			strings.Contains(msg, "worldwide, of which this region admits its share") != (c.rule == "g") {
			t.Errorf("%s: %s %q", c.rule, resp.Status, msg)
		}
	}
}
