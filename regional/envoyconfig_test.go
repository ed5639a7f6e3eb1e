package regional

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// req builds a request of the domain from name, value pairs, as the
// transport does: the well-known names in their fields.
func envoyRequest(domain string, kv ...string) Request {
	r := Request{Domain: domain}
	for i := 0; i+1 < len(kv); i += 2 {
		switch kv[i] {
		case "api_key":
			r.APIKey = kv[i+1]
		case "endpoint":
			r.Endpoint = kv[i+1]
		case "method":
			r.Method = kv[i+1]
		case "ip":
			r.IP = kv[i+1]
		case "tier":
			r.Tier = kv[i+1]
		default:
			r.Descriptors = append(r.Descriptors, Descriptor{Name: kv[i], Value: kv[i+1]})
		}
	}
	return r
}

// metName names the rule met, "" for none.
func metName(r *Rule) string {
	switch {
	case r == nil:
		return ""
	case r.Unlimited():
		return r.ID + " (unlimited)"
	}
	return r.ID
}

// TestEnvoyConfigExamples: the examples of envoyproxy/ratelimit's README,
// read from a directory as its runtime layout has them, place each request
// where that service does: the limit at the end of a path as long as the
// request, the most specific entry at each level.
func TestEnvoyConfigExamples(t *testing.T) {
	rs, err := LoadFile("testdata/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		domain string
		kv     []string
		want   string // the rule met, "" for none
	}{
		{"mongo_cps", []string{"database", "users"}, "mongo_cps.database_users"},
		{"mongo_cps", []string{"database", "default"}, "mongo_cps.database_default"},
		{"mongo_cps", []string{"database", "orders"}, ""},
		{"other_domain", []string{"database", "users"}, ""},
		{"messaging", []string{"message_type", "marketing", "to_number", "2061111111"}, "messaging.message_type_marketing.to_number"},
		{"messaging", []string{"to_number", "2061111111"}, "messaging.to_number"},
		{"messaging", []string{"message_type", "marketing"}, ""},                       // a placeholder
		{"messaging", []string{"message_type", "transactional", "to_number", "1"}, ""}, // no such path
		{"edge_proxy_per_ip", []string{"ip", "50.0.0.1"}, "edge_proxy_per_ip.ip"},
		{"edge_proxy_per_ip", []string{"ip", "50.0.0.5"}, "edge_proxy_per_ip.ip_50.0.0.5"}, // key and value first
		{"example4", []string{"key", "value", "subkey", "subvalue"}, "example4.key_value.subkey"},
		{"example4", []string{"key", "value"}, ""},
		{"internal", []string{"ldap", "x"}, "internal.ldap (unlimited)"},
		{"internal", []string{"azure", "x"}, "internal.azure"},
		{"example6", []string{"service", "auth-service", "user", "user-a"}, "example6.service.user_user-a"},
		{"example6", []string{"service", "auth-service", "user", "user-c"}, ""},
		{"example8", []string{"key1", "value1"}, "example8.key1_value1"},
		{"example8", []string{"key1", "unspecified_value"}, "example8.key1"},
		{"example9", []string{"key1", "valueXYZ"}, "example9.key1_value*"},
		{"example9", []string{"key1", "other"}, ""},
		{"example9", []string{"path", "/api/123/action"}, "example9.path_/api/*/action"},
		{"example9", []string{"path", "/api/123/other"}, ""},
		{"example9", []string{"route", "/api/v1/resource/123/action"}, "example9.route_/api/*/resource/*/action"},
		{"example10", []string{"route", "api", "http_method", "GET", "subject_id", "123"}, "example10.route.http_method.subject_id"},
		{"example10", []string{"route", "api", "http_method", "GET"}, ""},
		{"example10_wildcard", []string{"user", "alice", "action", "readfile", "resource", "documents"}, "example10_wildcard.user.action_read*.resource"},
		{"example10_wildcard", []string{"user", "alice", "action", "write", "resource", "documents"}, ""},
		{"example11", []string{"files", "files/a.pdf"}, "example11.files_files/*"},
		{"example11_metrics", []string{"route", "api/v1", "method", "GET"}, "example11_metrics.route_api/*.method"},
	} {
		req := envoyRequest(c.domain, c.kv...)
		r, ok := rs.Resolve(&req)
		got := metName(r)
		if got != c.want || (!ok && c.domain != "other_domain") {
			t.Errorf("%s %v: met %q (domain known: %v), want %q", c.domain, c.kv, got, ok, c.want)
		}
		applies := 0
		if r != nil && !r.Unlimited() {
			applies = 1
		}
		if m := rs.AppendMatches(nil, &req); len(m) != applies {
			t.Errorf("%s %v: the engine would apply %d rules, want %d", c.domain, c.kv, len(m), applies)
		}
	}
	for id, want := range map[string]struct {
		limit  int64
		window time.Duration
		by     string
		shadow bool
	}{
		"mongo_cps.database_users":                      {500, time.Second, "database", false},
		"messaging.message_type_marketing.to_number":    {5, 24 * time.Hour, "message_type,to_number", false},
		"example6.service.user_user-a":                  {10, time.Second, "service,user", true},
		"example11.files_files/*":                       {10, time.Hour, "", false}, // shared: one counter
		"example11.files_no_share_files_no_share/*":     {10, time.Hour, "files_no_share", false},
		"example11_metrics.route_api/*.method":          {60, time.Minute, "method", false},
		"example10_wildcard.user.action_read*.resource": {100, time.Minute, "user,action,resource", false},
	} {
		r := rs.Rule(id)
		if r == nil {
			t.Errorf("no rule %s", id)
			continue
		}
		if r.Base.Algorithm != FixedWindow || r.Base.Limit != want.limit || r.Base.Window != want.window.Microseconds() ||
			strings.Join(r.By, ",") != want.by || r.Shadow != want.shadow || r.Domain != strings.Split(id, ".")[0] {
			t.Errorf("%s: %+v, want %+v", id, r, want)
		}
	}
	if r := rs.Rule("example7.key_1_value_1.user_bkthomps"); r == nil || r.Name != "specific_limit" {
		t.Errorf("example 7's named limit: %+v", r)
	}
	if r := rs.Rule("example7.key_2_value_2.user_bkthomps"); r == nil || strings.Join(r.Replaces, ",") != "specific_limit" {
		t.Errorf("example 7's replacing limit: %+v", r)
	}
	// The directory and the stream it is published as are one set.
	src, err := ReadRules("testdata/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("published", src)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Rules()) != len(rs.Rules()) || string(again.YAML()) != string(rs.YAML()) {
		t.Errorf("published: %d rules, loaded %d", len(again.Rules()), len(rs.Rules()))
	}
}

// TestEnvoyConfigDepth: a limit applies to requests as long as its path,
// not to longer ones that pass through it (from envoyproxy/ratelimit's
// own example configuration).
func TestEnvoyConfigDepth(t *testing.T) {
	rs, err := Parse("rl.yaml", []byte(`domain: rl
descriptors:
  - key: foo
    rate_limit: { unit: minute, requests_per_unit: 2 }
    descriptors:
      - key: bar
        rate_limit: { unit: minute, requests_per_unit: 3 }
      - key: bar
        value: bkthomps
        rate_limit: { name: bkthomps, unit: minute, requests_per_unit: 1 }
      - key: bay
        rate_limit: { unlimited: true }
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		kv   []string
		want string
	}{
		{[]string{"foo", "x"}, "rl.foo"},
		{[]string{"foo", "x", "bar", "y"}, "rl.foo.bar"},
		{[]string{"foo", "x", "bar", "bkthomps"}, "rl.foo.bar_bkthomps"},
		{[]string{"foo", "x", "bay", "y"}, "rl.foo.bay (unlimited)"},
		{[]string{"foo", "x", "qux", "y"}, ""},
		{[]string{"bar", "y"}, ""},
	} {
		req := envoyRequest("rl", c.kv...)
		r, _ := rs.Resolve(&req)
		if got := metName(r); got != c.want {
			t.Errorf("%v: met %q, want %q", c.kv, got, c.want)
		}
	}
}

// TestEnvoyConfigEnforced: converted limits count as envoyproxy/ratelimit
// counts them — a fixed window of the unit, one counter per value of the
// path, a limit of 0 denying everything, a shadow
// limit never denying, a shared wildcard one counter.
func TestEnvoyConfigEnforced(t *testing.T) {
	rs, err := LoadFile("testdata/ratelimit")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	e := New(Config{Clock: clock, Store: NewMemoryStore(clock)}, rs)
	check := func(domain string, kv ...string) Decision {
		t.Helper()
		req := envoyRequest(domain, kv...)
		var d Decision
		if err := e.Check(context.Background(), &req, &d); err != nil {
			t.Fatalf("%s %v: %v", domain, kv, err)
		}
		return d
	}
	allowed := func(n int, domain string, kv ...string) {
		t.Helper()
		for i := range n {
			if d := check(domain, kv...); !d.Allowed {
				t.Fatalf("%s %v: request %d denied: %+v", domain, kv, i+1, d)
			}
		}
	}
	allowed(5, "messaging", "message_type", "marketing", "to_number", "1")
	if d := check("messaging", "message_type", "marketing", "to_number", "1"); d.Allowed || d.Limits[0].Window != 24*time.Hour {
		t.Fatalf("sixth marketing message of the day: %+v", d)
	}
	allowed(5, "messaging", "message_type", "marketing", "to_number", "2")
	allowed(100, "messaging", "to_number", "1")
	// A limit of 0.
	for range 3 {
		if d := check("edge_proxy_per_ip", "ip", "50.0.0.5"); d.Allowed || d.Code != CodeOverLimit || d.Limits[0].Limit != 0 {
			t.Fatalf("the banned address: %+v", d)
		}
	}
	allowed(10, "edge_proxy_per_ip", "ip", "50.0.0.1")
	if d := check("edge_proxy_per_ip", "ip", "50.0.0.1"); d.Allowed {
		t.Fatal("eleventh request of a second allowed")
	}
	// Shadow.
	allowed(15, "example6", "service", "auth", "user", "user-a")
	if d := check("example6", "service", "auth", "user", "user-a"); !d.Allowed || d.Limits[0].Remaining != 0 || !d.Limits[0].Shadow {
		t.Fatalf("shadow limit: %+v", d)
	}
	// A shadow limit never denies, not even a cost above it.
	req := envoyRequest("example6", "service", "auth", "user", "user-a")
	req.Cost = 11
	var d Decision
	if err := e.Check(context.Background(), &req, &d); err != nil || !d.Allowed || len(d.Limits) != 1 || d.Limits[0].Allowed || !d.Limits[0].Shadow {
		t.Fatalf("a cost of 11 on a shadow limit of 10: %+v, %v", d, err)
	}
	if err := e.Validate(&req); err != nil {
		t.Fatalf("a cost above a shadow limit refused: %v", err)
	}
	// Shared and isolated wildcards.
	allowed(5, "example11", "files", "files/a.pdf")
	allowed(5, "example11", "files", "files/b.csv")
	if d := check("example11", "files", "files/c.txt"); d.Allowed {
		t.Fatal("a shared threshold spent by other files allowed more")
	}
	allowed(10, "example11", "files_no_share", "files_no_share/a.pdf")
	allowed(10, "example11", "files_no_share", "files_no_share/b.csv")
	// The next window starts afresh.
	now = now.Add(time.Second)
	allowed(10, "edge_proxy_per_ip", "ip", "50.0.0.1")
}

// TestEnvoyConfigRefused: what the conversion cannot take is refused, the
// file, line and field named, and a directory refuses what a file would.
func TestEnvoyConfigRefused(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
			`d.yaml:4: descriptors[0].rate_limit.unit: "fortnight": want second, minute, hour, day, week, month or year`},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: { requests_per_unit: 1 }\n",
			"d.yaml:4: descriptors[0].rate_limit.unit: required"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }\n",
			"d.yaml:4: descriptors[0].rate_limit.unit: not with unlimited: true"},
		{"domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: -1 }\n",
			"d.yaml:4: descriptors[0].rate_limit.requests_per_unit: want a whole number from 0 to 4294967295"},
		{"domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        ratelimit: { unit: second }\n",
			"d.yaml:6: descriptors[0].descriptors[0].ratelimit: unknown key"},
		{"domain: d\ndescriptors:\n  - key: k\n    quota_mode: yes please\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
			"d.yaml:4: descriptors[0].quota_mode: want true or false"},
		{"domain: d\ndescriptors:\n  - key: k\n    metadata: [a, b]\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
			"d.yaml:4: descriptors[0].metadata: want a mapping"},
		{"domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
			`d.yaml:5: descriptors[1]: k "v" given twice at this level`},
		{"domain: d\ndescriptors:\n  - key: k\n    value: \"a?*\"\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
			"d.yaml:4: descriptors[0].value: \"a?*\": a ? in a wildcard value"},
		{"domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
			"d.yaml:4: descriptors[0].share_threshold: only for a value with a wildcard"},
		{"domain: \"\"\n", "d.yaml:1: domain: must not be empty"},
		{"domain: d\ndescriptors:\n  - value: v\n", "d.yaml:3: descriptors[0].key: required"},
	} {
		_, err := Parse("d.yaml", []byte(c.yaml))
		if err == nil || !errors.Is(err, ErrInvalidRules) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s\n got %v\nwant %s", c.yaml, err, c.want)
		}
	}
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1 }\n")
	write("notes.txt", "not read")
	write(".hidden.yaml", "not read")
	if rs, err := LoadFile(dir); err != nil || len(rs.Rules()) != 1 {
		t.Fatalf("a directory of one domain: %v", err)
	}
	write("b.yaml", "# the same domain again\ndomain: d\n")
	if _, err := LoadFile(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "b.yaml")+`:2: domain: "d" is given in `+filepath.Join(dir, "a.yaml")+":1 too") {
		t.Fatalf("a domain twice: %v", err)
	}
	write("b.yaml", "rules:\n  - { id: x, capacity: 1, refill_per_second: 1 }\n")
	if _, err := LoadFile(dir); err == nil || !strings.Contains(err.Error(), "envoyproxy/ratelimit domain files") {
		t.Fatalf("a geoquota file in the directory: %v", err)
	}
}

// TestEnvoyConfigLoadsWhatItLoads: what envoyproxy/ratelimit loads without
// a word loads here too — empty lists and values, replaces naming no
// limit, names given twice, shadow_mode without a limit.
func TestEnvoyConfigLoadsWhatItLoads(t *testing.T) {
	rs, err := Parse("d.yaml", []byte(`domain: d
descriptors:
  - key: a
    descriptors:
  - key: b
    value: ~
    rate_limit:
  - key: c
    shadow_mode: true
  - key: e
    rate_limit: { name: same, unit: minute, requests_per_unit: 1, replaces: [{ name: nobody }] }
  - key: f
    rate_limit: { name: same, unit: minute, requests_per_unit: 1 }
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Rules()) != 2 {
		t.Fatalf("%d rules, want 2", len(rs.Rules()))
	}
}

// TestEnvoyConfigOrder: placed by its entries in the order Envoy sends
// them, a request meets the limit envoyproxy/ratelimit applies, whatever
// the order of the tree's entries; without the order (HTTP and gRPC
// checks) the first key of a level the request carries leads.
func TestEnvoyConfigOrder(t *testing.T) {
	rs, err := Parse("m.yaml", []byte(`domain: messaging
descriptors:
  - key: to_number
    rate_limit: { unit: day, requests_per_unit: 100 }
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: { unit: day, requests_per_unit: 5 }
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		keys, values []string
		want         string
	}{
		{[]string{"message_type", "to_number"}, []string{"marketing", "1"}, "messaging.message_type_marketing.to_number"},
		{[]string{"to_number", "message_type"}, []string{"1", "marketing"}, ""},
		{[]string{"to_number"}, []string{"1"}, "messaging.to_number"},
		{[]string{"message_type"}, []string{"marketing"}, ""},
	} {
		var kv []string
		for i := range c.keys {
			kv = append(kv, c.keys[i], c.values[i])
		}
		req := envoyRequest("messaging", kv...)
		placed, ok := rs.Place(&req, c.keys, c.values)
		again, _ := rs.Resolve(&req)
		if !ok || metName(placed) != c.want || again != placed {
			t.Errorf("%v %v: placed at %q, resolved %q, want %q", c.keys, c.values, metName(placed), metName(again), c.want)
		}
		if m := rs.AppendMatches(nil, &req); (len(m) == 1) != (c.want != "") {
			t.Errorf("%v: the engine would apply %d rules", c.keys, len(m))
		}
	}
	// Placed by another rule set (the rules reloaded since): found again.
	other, _ := Parse("m.yaml", rs.YAML())
	req := envoyRequest("messaging", "message_type", "marketing", "to_number", "1")
	rs.Place(&req, []string{"to_number", "message_type"}, []string{"1", "marketing"})
	if r, _ := other.Resolve(&req); r == nil {
		t.Error("a request placed by an older rule set is not placed again by the new one")
	}
}

// TestEnvoyConfigShippedExamples: envoyproxy/ratelimit's own example
// directory, as that project ships it, loads whole: every limit, quota_mode
// kept on its limits, and each metadata (dynamic metadata geoquota does not
// return) a warning naming its file, line, limit and field, which a strict
// load refuses.
func TestEnvoyConfigShippedExamples(t *testing.T) {
	const dir = "testdata/ratelimit-examples"
	rs, err := LoadFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rs.Rules() {
		ids = append(ids, r.ID)
	}
	want := []string{
		"mongo_cps.database_users", "mongo_cps.database_default",
		"rl.category_account",
		"rl.source_cluster_proxy.destination_cluster_bkthomps", "rl.source_cluster_proxy.destination_cluster_mock",
		"rl.source_cluster_proxy.destination_cluster_override", "rl.source_cluster_proxy.destination_cluster_fake",
		"rl.foo", "rl.foo.bar", "rl.foo.bar_bkthomps", "rl.foo.bar_banned", "rl.foo.baz", "rl.foo.baz_not-so-shady", "rl.foo.baz_shady",
		"rl.unspec", "rl.service_service_1", "rl.service_service_2",
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("limits loaded:\n %q\nwant\n %q", ids, want)
	}
	for _, c := range []struct {
		domain string
		kv     []string
		want   string
	}{
		{"rl", []string{"foo", "x", "bay", "y"}, "rl.foo.bay (unlimited)"},
		{"rl", []string{"qux", "x"}, "rl.qux (unlimited)"},
		{"rl", []string{"service", "service_1"}, "rl.service_service_1"},
	} {
		req := envoyRequest(c.domain, c.kv...)
		if r, _ := rs.Resolve(&req); metName(r) != c.want {
			t.Errorf("%s %v meets %q, want %q", c.domain, c.kv, metName(r), c.want)
		}
	}
	for _, r := range rs.Rules() {
		quota := r.ID == "rl.service_service_1" || r.ID == "rl.service_service_2"
		if r.Quota != quota {
			t.Errorf("%s: Quota %v, want %v", r.ID, r.Quota, quota)
		}
	}
	if r := rs.Rule("rl.service_service_2"); r.Base.Limit != 2 || r.Base.Window != time.Minute.Microseconds() {
		t.Errorf("rl.service_service_2: %+v, want 2 a minute", r.Base)
	}
	if !rs.Rule("rl.foo.baz_shady").Shadow {
		t.Error("rl.foo.baz_shady: shadow_mode lost")
	}

	file := filepath.Join(dir, "example.yaml")
	wantWarnings := []string{
		file + `:93: rule "rl.service_service_1": descriptors[5].metadata: read and ignored: geoquota's Envoy RLS responses carry no dynamic metadata`,
		file + `:102: rule "rl.service_service_2": descriptors[6].metadata: read and ignored: geoquota's Envoy RLS responses carry no dynamic metadata`,
	}
	warnings := rs.Warnings()
	if len(warnings) != len(wantWarnings) {
		t.Fatalf("warnings %q, want %d", warnings, len(wantWarnings))
	}
	for i, w := range wantWarnings {
		if !strings.HasPrefix(warnings[i], w) {
			t.Errorf("warning %d:\n got %s\nwant %s…", i, warnings[i], w)
		}
	}
	strict := rs.Strict()
	if !errors.Is(strict, ErrInvalidRules) {
		t.Fatalf("strict: %v, want an invalid rule set", strict)
	}
	for _, at := range []string{file + `:93: rule "rl.service_service_1": descriptors[5].metadata: not enforced`,
		file + `:102: rule "rl.service_service_2": descriptors[6].metadata: not enforced`} {
		if !strings.Contains(strict.Error(), at) {
			t.Errorf("strict: %v\nsays nothing of %s", strict, at)
		}
	}

	// The same from the file alone, and from the files joined as
	// globalsync publishes them (each starts with ---, so the stream has
	// empty documents); nothing to say of a configuration without
	// metadata.
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if rs, err := Parse("example.yaml", src); err != nil {
		t.Errorf("example.yaml alone: %v", err)
	} else if len(rs.Warnings()) != 2 || rs.Strict() == nil {
		t.Errorf("example.yaml alone: warnings %q", rs.Warnings())
	}
	joined, err := ReadRules(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rs, err := Parse("rules", joined); err != nil {
		t.Errorf("the directory joined: %v", err)
	} else if len(rs.Rules()) != len(want) || len(rs.Warnings()) != 2 || rs.Strict() == nil {
		t.Errorf("the directory joined: %d limits, warnings %q", len(rs.Rules()), rs.Warnings())
	}
	if rs, err := LoadFile("testdata/ratelimit"); err != nil {
		t.Errorf("README's examples: %v", err)
	} else if rs.Warnings() != nil || rs.Strict() != nil {
		t.Errorf("README's examples: warnings %q", rs.Warnings())
	}
}
