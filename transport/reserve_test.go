package transport

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

// A bucket that refills 0.02 tokens a second: whole tokens stay put for
// the length of a test.
const reserveRules = `
rules:
  - { id: tokens, match: { endpoint: /llm }, by: [api_key], algorithm: token_bucket, capacity: 1000, refill_per_second: 0.02 }
`

// Reservations over HTTP on a real redis-server (SPEC §13): an estimate
// held, committed above it, the same commit counted once, a release, a
// reservation denied that holds nothing, one never settled charged its
// estimate and then unknown, and bad input refused with nothing counted.
func TestReservations(t *testing.T) {
	v := newEnv(t, envOptions{rules: reserveRules})
	call := func(path, body string, want int) map[string]any {
		t.Helper()
		resp := v.post(path, body)
		b := decodeBody(t, resp)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %v, want %d", path, body, resp.StatusCode, b, want)
		}
		return b
	}
	reserve := func(key string, cost int, ttl string, want int) map[string]any {
		t.Helper()
		return call("/v1/reserve", `{"descriptors":{"api_key":"`+key+`","endpoint":"/llm"},"cost":`+strconv.Itoa(cost)+`,"ttl_seconds":`+ttl+`}`, want)
	}
	left := func(key string) float64 {
		t.Helper()
		return decodeBody(t, v.get("/v1/usage?rule=tokens&api_key="+key))["remaining"].(float64)
	}

	b := reserve("sk_1", 500, "60", 200)
	id, _ := b["reservation"].(string)
	if b["allowed"] != true || b["remaining"] != 500.0 || b["rule"] != "tokens" || id == "" || b["expires_at"] == nil {
		t.Fatalf("reserve 500 of 1000: %v", b)
	}
	// 730 used of 500 held: 230 more taken.
	for range 2 {
		if b := call("/v1/commit", `{"reservation":"`+id+`","cost":730}`, 200); b["charged"] != 730.0 || b["remaining"] != 270.0 || b["debt"] != 0.0 || b["limit"] != 1000.0 {
			t.Fatalf("commit 730: %v", b)
		}
	}
	if n := left("sk_1"); n != 270 {
		t.Fatalf("after one commit sent twice: %v left, want 270 (counted once)", n)
	}
	// More than is left: denied, nothing held.
	before := v.dbsize()
	if b := reserve("sk_1", 300, "60", 429); b["error"].(map[string]any)["code"] != "RATE_LIMIT_EXCEEDED" {
		t.Fatalf("a reservation past the limit: %v", b)
	}
	if n := left("sk_1"); n != 270 || v.dbsize() != before {
		t.Fatalf("a denied reservation held something: %v left, %d keys (had %d)", n, v.dbsize(), before)
	}
	// Released: its estimate comes back; twice, answered alike.
	id2 := reserve("sk_1", 200, "60", 200)["reservation"].(string)
	if n := left("sk_1"); n != 70 {
		t.Fatalf("with 200 held: %v left, want 70", n)
	}
	for range 2 {
		if b := call("/v1/release", `{"reservation":"`+id2+`"}`, 200); b["released"] != true {
			t.Fatalf("release: %v", b)
		}
	}
	if n := left("sk_1"); n != 270 {
		t.Fatalf("after a release: %v left, want 270", n)
	}
	// Committed past what is left: taken as debt.
	id3 := reserve("sk_1", 100, "60", 200)["reservation"].(string)
	if b := call("/v1/commit", `{"reservation":"`+id3+`","cost":500}`, 200); b["charged"] != 500.0 || b["remaining"] != 0.0 || b["debt"] != 230.0 {
		t.Fatalf("commit 500 of 100 held, 170 left: %v, want debt 230", b)
	}
	if resp := v.check("sk_1", "/llm"); resp.StatusCode != 429 {
		t.Fatalf("a check in debt: %d, want 429", resp.StatusCode)
	}

	// Never settled: charged its estimate, then unknown.
	b = reserve("sk_2", 50, "0.2", 200)
	id4 := b["reservation"].(string)
	ends, err := time.Parse(time.RFC3339Nano, b["expires_at"].(string))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "Redis's clock to pass the reservation's end", func() bool {
		now, err := v.store.Client().Time(t.Context()).Result()
		return err == nil && now.After(ends)
	})
	if b := call("/v1/commit", `{"reservation":"`+id4+`","cost":10}`, 404); b["error"].(map[string]any)["code"] != "RESERVATION_NOT_FOUND" {
		t.Fatalf("commit after the end: %v", b)
	}
	if b := call("/v1/release", `{"reservation":"`+id4+`"}`, 404); b["error"].(map[string]any)["code"] != "RESERVATION_NOT_FOUND" {
		t.Fatalf("release after the end: %v", b)
	}
	if n := left("sk_2"); n != 950 {
		t.Fatalf("after a reservation of 50 ended unsettled: %v left, want 950", n)
	}

	// Bad input names its field and counts nothing.
	before = v.dbsize()
	// An id as region eu would make it (regional/reserve.go: the region, a
	// mark, when it ends, a counter, a seal), its seal unknown here.
	forged := "r1." + base64.RawURLEncoding.EncodeToString([]byte("\x02eu"+strings.Repeat("m", 16)+"\x04"+
		"\x0agq:{t:k:v}\x04\x02\x00\x02\x02\x02"+strings.Repeat("s", 16)))
	for _, c := range []struct{ path, body, field string }{
		{"/v1/reserve", `{"descriptors":{"api_key":"sk_3","endpoint":"/llm"},"cost":5}`, "ttl_seconds"},
		{"/v1/reserve", `{"descriptors":{"api_key":"sk_3","endpoint":"/llm"},"cost":5,"ttl_seconds":0}`, "ttl_seconds"},
		{"/v1/reserve", `{"descriptors":{"api_key":"sk_3","endpoint":"/llm"},"cost":5,"ttl_seconds":3601}`, "ttl_seconds"},
		{"/v1/reserve", `{"descriptors":{"api_key":"sk_3","endpoint":"/llm"},"ttl_seconds":5}`, "cost"},
		{"/v1/reserve", `{"descriptors":{"api_key":"sk_3","endpoint":"/llm"},"cost":0,"ttl_seconds":5}`, "cost"},
		{"/v1/commit", `{"reservation":"` + id + `","cost":0}`, "cost"},
		{"/v1/commit", `{"reservation":"` + id + `"}`, "cost"},
		{"/v1/release", `{"reservation":"` + id + `","cost":3}`, "cost"},
		{"/v1/commit", `{"reservation":"nonsense","cost":3}`, "reservation"},
		{"/v1/release", `{}`, "reservation"},
		{"/v1/release", `{"reservation":"` + forged + `"}`, "reservation"}, // another region's
	} {
		b := call(c.path, c.body, 400)
		if e := b["error"].(map[string]any); e["code"] != "INVALID_ARGUMENT" || e["details"].(map[string]any)["field"] != c.field {
			t.Fatalf("%s %s: %v, want the field %s named", c.path, c.body, b, c.field)
		}
	}
	if v.dbsize() != before {
		t.Fatalf("bad input changed the store: %d keys, had %d", v.dbsize(), before)
	}
	if b := call("/v1/commit", `{"reservation":"`+forged+`","cost":3}`, 400); !strings.Contains(b["error"].(map[string]any)["message"].(string), `made in region "eu"`) {
		t.Fatalf("another region's reservation: %v", b)
	}
	if b := call("/v1/commit", `{"reservation":"`+strings.Replace(id, "r1.", "r1.A", 1)+`","cost":3}`, 400); b["error"] == nil {
		t.Fatalf("a mangled id: %v", b)
	}
	m := readAll(t, v.get("/metrics"))
	for _, want := range []string{`result="reserved"} 4`, `result="denied"} 1`, `result="committed"} 2`, `result="again"} 2`,
		`result="released"} 1`, `result="not_found"} 2`} {
		if !strings.Contains(m, "geoquota_reservations_total{"+want) {
			t.Fatalf("metrics: want geoquota_reservations_total{%s, have\n%s", want, grepLines(m, "reservations_total"))
		}
	}
}

// The same calls over gRPC: a reservation made, committed twice and
// counted once, a release after it changing nothing, NotFound for one
// never made, InvalidArgument naming the field for bad input.
func TestReservationsOverGRPC(t *testing.T) {
	v := newEnv(t, envOptions{rules: reserveRules})
	c := pb.NewRateLimiterClient(v.conn)
	ctx := t.Context()
	req := &pb.Request{Descriptors: map[string]string{"api_key": "sk_g", "endpoint": "/llm"}, Cost: 400}
	res, err := c.Reserve(ctx, &pb.ReserveRequest{Request: req, TtlMs: 60_000})
	if err != nil || !res.Decision.Allowed || res.Reservation == "" || res.ExpiresAtUnixMs == 0 || res.Decision.Limits[0].Remaining != 600 {
		t.Fatalf("reserve 400: %v (%v)", res, err)
	}
	for i := range 2 {
		s, err := c.Commit(ctx, &pb.SettleRequest{Reservation: res.Reservation, Cost: 100})
		if err != nil || s.Charged != 100 || s.Again != (i == 1) || s.Limits[0].Remaining != 900 || s.Limits[0].Rule != "tokens" {
			t.Fatalf("commit 100 of 400, time %d: %v (%v)", i+1, s, err)
		}
	}
	if s, err := c.Release(ctx, &pb.SettleRequest{Reservation: res.Reservation}); err != nil || !s.Again || s.Charged != 100 {
		t.Fatalf("release after commit: %v (%v)", s, err)
	}
	// The same id with another of its store's 32 hex digits (after the
	// region's length and name, and the id's length): never made.
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(res.Reservation, "r1."))
	if err != nil {
		t.Fatal(err)
	}
	at := 1 + len("test-region") + 1
	if raw[at] == '0' {
		raw[at] = '1'
	} else {
		raw[at] = '0'
	}
	unknown := "r1." + base64.RawURLEncoding.EncodeToString(raw)
	if _, err := c.Release(ctx, &pb.SettleRequest{Reservation: unknown}); status.Code(err) != codes.NotFound {
		t.Fatalf("release of a reservation never made: %v, want NotFound", err)
	}
	for _, bad := range []struct {
		call  func() error
		field string
	}{
		{func() error { _, err := c.Reserve(ctx, &pb.ReserveRequest{Request: req}); return err }, "ttl_ms"},
		{func() error {
			_, err := c.Reserve(ctx, &pb.ReserveRequest{Request: &pb.Request{Descriptors: req.Descriptors}, TtlMs: 1000})
			return err
		}, "request.cost"},
		{func() error { _, err := c.Commit(ctx, &pb.SettleRequest{Reservation: res.Reservation}); return err }, "cost"},
		{func() error { _, err := c.Commit(ctx, &pb.SettleRequest{Reservation: "r1.x", Cost: 1}); return err }, "reservation"},
	} {
		err := bad.call()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), bad.field) {
			t.Fatalf("want InvalidArgument naming %s, got %v", bad.field, err)
		}
	}
}

// Reservations that end unsettled over HTTP, on a real redis-server: one
// of a rule that refunds comes back, one of a rule that charges stays.
func TestReservationsEndingUnsettledOverHTTP(t *testing.T) {
	v := newEnv(t, envOptions{rules: `
rules:
  - { id: refunded, match: { endpoint: /refund }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h, on_expiry: refund }
  - { id: charged, match: { endpoint: /charge }, by: [api_key], algorithm: fixed_window, limit: 1000, window: 1h }
`})
	left := func(rule string) float64 {
		return decodeBody(t, v.get("/v1/usage?rule="+rule+"&api_key=sk_e"))["remaining"].(float64)
	}
	for _, ep := range []string{"/refund", "/charge"} {
		if resp := v.post("/v1/reserve", `{"descriptors":{"api_key":"sk_e","endpoint":"`+ep+`"},"cost":300,"ttl_seconds":0.2}`); resp.StatusCode != 200 {
			t.Fatalf("reserve on %s: %d %v", ep, resp.StatusCode, decodeBody(t, resp))
		}
	}
	waitFor(t, 10*time.Second, "the refunding rule's estimate back once its reservation ended", func() bool {
		if err := v.engine.Maintain(t.Context()); err != nil {
			t.Fatal(err)
		}
		return left("refunded") == 1000
	})
	if n := left("charged"); n != 700 {
		t.Fatalf("the charging rule after its reservation ended: %v left, want 700", n)
	}
}
