package transport

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

func TestAdminNeedsTheToken(t *testing.T) {
	off := newEnv(t, envOptions{})
	if resp := off.post("/v1/admin/reset", `{"rule":"minute","descriptors":{"api_key":"a"}}`, "Authorization", "Bearer anything"); resp.StatusCode != http.StatusForbidden ||
		decodeBody(t, resp)["error"].(map[string]any)["code"] != "PERMISSION_DENIED" {
		t.Fatalf("admin without a configured token: %s", resp.Status)
	}
	_, err := pb.NewAdminClient(off.conn).GetRules(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer anything"), &pb.GetRulesRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("gRPC admin without a configured token: %v", err)
	}

	on := newEnv(t, envOptions{adminToken: "s3cret"})
	for _, auth := range []string{"", "Bearer wrong", "s3cret", "Basic s3cret", "Bearers3cret", "Bearer s3cret2"} {
		resp := on.get("/v1/admin/rules", "Authorization", auth)
		if resp.StatusCode != http.StatusUnauthorized || decodeBody(t, resp)["error"].(map[string]any)["code"] != "UNAUTHENTICATED" {
			t.Fatalf("Authorization %q: %s", auth, resp.Status)
		}
		_, err := pb.NewAdminClient(on.conn).GetRules(metadata.AppendToOutgoingContext(t.Context(), "authorization", auth), &pb.GetRulesRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("gRPC authorization %q: %v", auth, err)
		}
	}
}

// The scheme is case-insensitive, as HTTP says, and spaces around the
// token do not count.
func TestAdminBearerSchemeAnyCase(t *testing.T) {
	on := newEnv(t, envOptions{adminToken: "s3cret"})
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "Bearer  s3cret "} {
		if resp := on.get("/v1/admin/rules", "Authorization", auth); resp.StatusCode != http.StatusOK {
			t.Errorf("Authorization %q: %s", auth, resp.Status)
		}
		_, err := pb.NewAdminClient(on.conn).GetRules(metadata.AppendToOutgoingContext(t.Context(), "authorization", auth), &pb.GetRulesRequest{})
		if err != nil {
			t.Errorf("gRPC authorization %q: %v", auth, err)
		}
	}
}

func TestAdminOperationsHTTP(t *testing.T) {
	v := newEnv(t, envOptions{adminToken: "s3cret"})
	auth := []string{"Authorization", "Bearer s3cret"}
	for range 3 {
		v.check("acme", "/minute")
	}
	if resp := v.check("acme", "/minute"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("before grant: %s", resp.Status)
	}
	resp := v.post("/v1/admin/grant", `{"rule":"minute","descriptors":{"api_key":"acme"},"amount":1}`, auth...)
	if b := decodeBody(t, resp); resp.StatusCode != http.StatusOK || b["remaining"] != 1.0 {
		t.Fatalf("grant: %s %v", resp.Status, b)
	}
	if resp := v.check("acme", "/minute"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after grant: %s", resp.Status)
	}
	if resp := v.post("/v1/admin/reset", `{"rule":"minute","descriptors":{"api_key":"acme"}}`, auth...); resp.StatusCode != http.StatusOK {
		t.Fatalf("reset: %s", resp.Status)
	}
	if resp := v.check("acme", "/minute"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "1" {
		t.Fatalf("after reset: %s %v", resp.Status, resp.Header)
	}
	if resp := v.post("/v1/admin/block", `{"pattern":"acme*","ttl_seconds":60}`, auth...); resp.StatusCode != http.StatusOK {
		t.Fatalf("block: %s", resp.Status)
	}
	if resp := v.check("acme", "/search"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("blocked at runtime: %s", resp.Status)
	}
	if b := decodeBody(t, v.get("/v1/admin/blocks", auth...)); len(b["blocks"].([]any)) != 1 {
		t.Fatalf("blocks %v", b)
	}
	if resp := v.post("/v1/admin/unblock", `{"pattern":"acme*"}`, auth...); resp.StatusCode != http.StatusOK {
		t.Fatalf("unblock: %s", resp.Status)
	}
	if resp := v.check("acme", "/search"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after unblock: %s", resp.Status)
	}
	// Rules: an invalid set is refused whole, naming what is wrong; a
	// valid one is in force at once.
	resp = v.send(http.MethodPut, "/v1/admin/rules", strings.NewReader("rules:\n  - { id: x, capacity: 0, refill_per_second: 1 }\n"), auth...)
	if b := readAll(t, resp); resp.StatusCode != http.StatusBadRequest || !strings.Contains(b, `rule \"x\": capacity`) {
		t.Fatalf("invalid rules: %s %s", resp.Status, b)
	}
	resp = v.send(http.MethodPut, "/v1/admin/rules",
		strings.NewReader("rules:\n  - { id: only, match: { endpoint: /minute }, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h }\n"), auth...)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("valid rules: %v", resp.Status)
	}
	if resp := v.check("newcomer", "/minute"); resp.Header.Get("X-RateLimit-Limit") != "1" {
		t.Fatalf("new rules not in force: %v", resp.Header)
	}
	if body := readAll(t, v.get("/v1/admin/rules", auth...)); !strings.Contains(body, "id: only") {
		t.Fatalf("rules read back: %s", body)
	}
	v.engine.Maintain(t.Context()) // the audit log is written by maintenance
	b := decodeBody(t, v.get("/v1/admin/violations?limit=10", auth...))
	vs := b["violations"].([]any)
	if len(vs) == 0 {
		t.Fatalf("no violations recorded: %v", b)
	}
	// As gRPC's Violation: snake case, milliseconds, and a time.
	if first := vs[0].(map[string]any); first["code"] == nil || first["retry_after_ms"] == nil || first["api_key"] == nil || first["time"] == nil {
		t.Fatalf("a violation as HTTP says it: %v", first)
	}
	if resp := v.get("/v1/admin/violations?limit=0", auth...); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("limit 0: %s", resp.Status)
	}
}

func TestAdminOperationsGRPC(t *testing.T) {
	v := newEnv(t, envOptions{adminToken: "s3cret"})
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer s3cret")
	a := pb.NewAdminClient(v.conn)
	acme := &pb.Request{Descriptors: descriptors("api_key", "acme")}
	for range 2 {
		v.check("acme", "/minute")
	}
	g, err := a.Grant(ctx, &pb.GrantRequest{Rule: "minute", Request: acme, Amount: 3})
	if err != nil || g.Status.Remaining != 3 {
		t.Fatalf("grant: %v, %v", g, err)
	}
	if _, err := a.Grant(ctx, &pb.GrantRequest{Rule: "minute", Request: acme, Amount: 0}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("grant 0: %v", err)
	}
	if _, err := a.ResetKey(ctx, &pb.ResetKeyRequest{Rule: "minute", Request: acme}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ResetKey(ctx, &pb.ResetKeyRequest{Rule: "nope", Request: acme}); status.Code(err) != codes.NotFound {
		t.Fatalf("reset of an unknown rule: %v", err)
	}
	if _, err := a.Block(ctx, &pb.BlockRequest{Pattern: "acme"}); err != nil {
		t.Fatal(err)
	}
	if l, err := a.ListBlocks(ctx, &pb.ListBlocksRequest{}); err != nil || len(l.Blocks) != 1 {
		t.Fatalf("blocks %v, %v", l, err)
	}
	if resp := v.check("acme", "/minute"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("blocked: %s", resp.Status)
	}
	if _, err := a.Unblock(ctx, &pb.UnblockRequest{Pattern: "acme"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PutRules(ctx, &pb.PutRulesRequest{Yaml: "rules: [ {id: ''} ]"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid rules: %v", err)
	}
	r, err := a.GetRules(ctx, &pb.GetRulesRequest{})
	if err != nil || !strings.Contains(r.Yaml, "id: minute") || r.Source != "test.yaml" {
		t.Fatalf("rules: %v, %v", r, err)
	}
	if _, err := a.ListViolations(ctx, &pb.ListViolationsRequest{Limit: -1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("violations, limit -1: %v", err)
	}
}

// TestAdminRulesWarnings: envoyproxy/ratelimit's example directory's
// example.yaml, put through the admin API, is in force with a warning per
// metadata, answered (HTTP and gRPC) and counted in geoquota_rule_warnings;
// a regiond with --rules-strict refuses it whole, naming each, and keeps
// its rules.
func TestAdminRulesWarnings(t *testing.T) {
	src, err := os.ReadFile("../regional/testdata/ratelimit-examples/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	at := []string{`admin:93: rule \"rl.service_service_1\": descriptors[5].metadata`, `admin:102: rule \"rl.service_service_2\": descriptors[6].metadata`}
	auth := []string{"Authorization", "Bearer s3cret"}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer s3cret")

	v := newEnv(t, envOptions{adminToken: "s3cret"})
	resp := v.send(http.MethodPut, "/v1/admin/rules", strings.NewReader(string(src)), auth...)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"rules":15`) {
		t.Fatalf("put: %s %s", resp.Status, body)
	}
	for _, w := range at {
		if !strings.Contains(body, w+": read and ignored") {
			t.Errorf("put answered %s\nwithout the warning %s", body, w)
		}
	}
	if m := readAll(t, v.get("/metrics")); !strings.Contains(m, "geoquota_rule_warnings 2") {
		t.Error("/metrics: geoquota_rule_warnings is not 2")
	}
	r, err := pb.NewAdminClient(v.conn).PutRules(ctx, &pb.PutRulesRequest{Yaml: string(src)})
	if err != nil || r.Rules != 15 || len(r.Warnings) != 2 || !strings.Contains(r.Warnings[0], strings.ReplaceAll(at[0], `\"`, `"`)) {
		t.Fatalf("gRPC put: %v, %v", r, err)
	}

	strict := newEnv(t, envOptions{adminToken: "s3cret", strictRules: true})
	resp = strict.send(http.MethodPut, "/v1/admin/rules", strings.NewReader(string(src)), auth...)
	b := decodeBody(t, resp)
	e, _ := b["error"].(map[string]any)
	if resp.StatusCode != http.StatusBadRequest || e["code"] != "INVALID_ARGUMENT" || e["details"].(map[string]any)["field"] != "rules" {
		t.Fatalf("strict put: %s %v", resp.Status, b)
	}
	for _, w := range at {
		if msg, _ := e["message"].(string); !strings.Contains(msg, strings.ReplaceAll(w, `\"`, `"`)+": not enforced") {
			t.Errorf("strict put: %q says nothing of %s", msg, w)
		}
	}
	if _, err := pb.NewAdminClient(strict.conn).PutRules(ctx, &pb.PutRulesRequest{Yaml: string(src)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("strict gRPC put: %v", err)
	}
	if rs := strict.engine.Rules(); rs.Source != "test.yaml" || strict.engine.Stats().RuleReloadErrors.Load() != 2 {
		t.Fatalf("after refusals: rules of %s, %d rejected", rs.Source, strict.engine.Stats().RuleReloadErrors.Load())
	}
}
