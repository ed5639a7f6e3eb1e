package transport

import (
	"net/http"
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
