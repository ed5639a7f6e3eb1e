package regional

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func loadSpecExample(t testing.TB) *RuleSet {
	t.Helper()
	rs, err := Parse("example-rules.yaml", ExampleRules)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestSpecExampleLoads(t *testing.T) {
	rs := loadSpecExample(t)
	want := map[string]Params{
		"search":        {Algorithm: TokenBucket, Limit: 30, Rate: 0.5},
		"users":         {Algorithm: SlidingWindowCounter, Limit: 100, Window: 60e6},
		"login":         {Algorithm: SlidingWindowLog, Limit: 5, Window: 60e6},
		"tier-minute":   {Algorithm: FixedWindow, Window: 60e6},
		"tenant-global": {Algorithm: FixedWindow, Limit: 10000, Window: 60e6},
	}
	var ids []string
	for _, r := range rs.Rules() {
		ids = append(ids, r.ID)
		if r.Base != want[r.ID] {
			t.Errorf("rule %s: params %+v, want %+v", r.ID, r.Base, want[r.ID])
		}
	}
	if !slices.Equal(ids, []string{"search", "users", "login", "tier-minute", "tenant-global"}) {
		t.Fatalf("rules %v", ids)
	}
	// "30 a minute sustained": a 30-token bucket refilling at 0.5/s has a
	// one-minute window.
	if w := rs.Rule("search").Base.WindowMicros(); w != 60e6 {
		t.Errorf("search window %dµs, want 60s", w)
	}
	if r := rs.Rule("login"); r.Fallback != FailClosed || r.match.method != "POST" {
		t.Errorf("login: fallback %v, method %q", r.Fallback, r.match.method)
	}
	if r := rs.Rule("search"); r.Fallback != FailOpen || r.Scope != ScopeRegional || r.Cost != 1 {
		t.Errorf("search defaults: %+v", r)
	}
	if r := rs.Rule("tenant-global"); r.Scope != ScopeGlobal || r.Mode != ModeStrict {
		t.Errorf("tenant-global: scope %v mode %v", r.Scope, r.Mode)
	}
}

// TestSpecExampleMeaning checks, request by request, that the example
// means what its comments say.
func TestSpecExampleMeaning(t *testing.T) {
	rs := loadSpecExample(t)
	for _, tc := range []struct {
		name string
		req  Request
		want map[string]int64 // rule id to the limit it applies
	}{
		{"free key searching: bucket, free tier, tenant limit",
			Request{APIKey: "sk_free_1", Endpoint: "/search", Method: "GET", IP: "203.0.113.7"},
			map[string]int64{"search": 30, "tier-minute": 100, "tenant-global": 10000}},
		{"path prefix covers sub-paths and queries",
			Request{APIKey: "sk_free_1", Endpoint: "/search/images?q=x"},
			map[string]int64{"search": 30, "tier-minute": 100, "tenant-global": 10000}},
		{"prefix is on segment boundaries",
			Request{APIKey: "sk_free_1", Endpoint: "/searchable"},
			map[string]int64{"tier-minute": 100, "tenant-global": 10000}},
		{"prod key is pro tier; the VIP override beats the tenant limit",
			Request{APIKey: "sk_prod_vip_001", Endpoint: "/users"},
			map[string]int64{"users": 100, "tier-minute": 1000, "tenant-global": 100000}},
		{"a tier sent by the caller wins over tier_of",
			Request{APIKey: "sk_free_1", Endpoint: "/users", Tier: "enterprise"},
			map[string]int64{"users": 100, "tier-minute": 10000, "tenant-global": 10000}},
		{"a tier not listed in tiers: the tier rule does not apply",
			Request{APIKey: "sk_free_1", Endpoint: "/users", Tier: "platinum"},
			map[string]int64{"users": 100, "tenant-global": 10000}},
		{"login is limited by IP, POST only",
			Request{Endpoint: "/login", Method: "POST", IP: "203.0.113.7"},
			map[string]int64{"login": 5}},
		{"login with GET is not",
			Request{Endpoint: "/login", Method: "GET", IP: "203.0.113.7"},
			map[string]int64{}},
		{"login without an IP has no counter to count in",
			Request{Endpoint: "/login", Method: "POST"},
			map[string]int64{}},
		{"a key outside sk_* has no tier and no tenant limit",
			Request{APIKey: "other", Endpoint: "/search"},
			map[string]int64{"search": 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]int64{}
			tier := rs.Tier(&tc.req)
			for _, r := range rs.AppendMatches(nil, &tc.req) {
				key := r.appendKey(nil, &tc.req, tier)
				got[r.ID] = r.params(key, tier).Limit
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("limits %v, want %v", got, tc.want)
			}
		})
	}
	for key, want := range map[string][2]bool{ // allowed, blocked
		"sk_internal_batch": {true, false}, "sk_monitoring_1": {true, false},
		"sk_revoked_42": {false, true}, "sk_free_1": {false, false}, "": {false, false},
	} {
		if rs.Allowed(key) != want[0] || rs.Blocked(key) != want[1] {
			t.Errorf("%q: allowed %v blocked %v, want %v", key, rs.Allowed(key), rs.Blocked(key), want)
		}
	}
}

func TestTokenBucketTierScalesRate(t *testing.T) {
	rs := mustParse(t, `
rules:
  - id: tb
    by: [api_key]
    capacity: 30
    refill_per_second: 0.5
    tiers: { pro: 300 }
    overrides: { vip: 3000 }
`)
	r := rs.Rule("tb")
	for _, tc := range []struct {
		key, tier string
		want      Params
	}{
		{"a", "", Params{Algorithm: TokenBucket, Limit: 30, Rate: 0.5}},
		{"a", "pro", Params{Algorithm: TokenBucket, Limit: 300, Rate: 5}},
		{"vip", "pro", Params{Algorithm: TokenBucket, Limit: 3000, Rate: 50}},
	} {
		if got := r.params([]byte(tc.key), tc.tier); got != tc.want {
			t.Errorf("key %s tier %q: %+v, want %+v", tc.key, tc.tier, got, tc.want)
		}
	}
}

func TestCounterKeys(t *testing.T) {
	rs := mustParse(t, `
rules:
  - id: multi
    by: [api_key, endpoint, plan]
    match: { descriptors: { plan: "gold*" } }
    limit: 5
    window: 1s
    algorithm: fixed_window
`)
	r := rs.Rule("multi")
	a := Request{APIKey: `k|1`, Endpoint: `/x\y`, Descriptors: []Descriptor{{"plan", "gold"}}}
	b := Request{APIKey: `k`, Endpoint: `1|/x\y`, Descriptors: []Descriptor{{"plan", "gold"}}}
	ka, kb := string(r.appendKey(nil, &a, "")), string(r.appendKey(nil, &b, ""))
	if ka != `k\|1|/x\\y|gold` || ka == kb {
		t.Fatalf("keys %q and %q: separators must be escaped so keys never collide", ka, kb)
	}
	if m := rs.AppendMatches(nil, &Request{APIKey: "k", Endpoint: "/x", Descriptors: []Descriptor{{"plan", "silver"}}}); len(m) != 0 {
		t.Fatalf("custom descriptor glob: matched %v", m)
	}
}

func TestRuleErrorsNameFileRuleAndField(t *testing.T) {
	dir := t.TempDir()
	base := "rules:\n  - id: ok\n    by: [api_key]\n    capacity: 10\n    refill_per_second: 1\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string // all must appear in the message
	}{
		{"misspelt field", base + "  - id: bad\n    capacitty: 10\n", []string{"rules.yaml:7", `rule "bad"`, "capacitty"}},
		{"misspelt match field", base + "  - id: bad\n    match: { endpiont: /x }\n    capacity: 1\n    refill_per_second: 1\n", []string{`rule "bad"`, "endpiont"}},
		{"duration as a number", base + "  - id: bad\n    algorithm: fixed_window\n    limit: 5\n    window: 60\n", []string{`rule "bad"`, "window"}},
		{"missing id", base + "  - by: [api_key]\n    capacity: 1\n    refill_per_second: 1\n", []string{`rule "#2"`, "id: required"}},
		{"duplicate id", base + "  - id: ok\n    capacity: 1\n    refill_per_second: 1\n", []string{`rule "ok"`, "id: used by another rule"}},
		{"zero refill, at its own line", "rules:\n  - id: z\n    capacity: 10\n    refill_per_second: 0\n", []string{"rules.yaml:4", `rule "z"`, "refill_per_second"}},
		{"missing capacity", "rules:\n  - id: z\n    refill_per_second: 1\n", []string{`rule "z"`, "capacity: required"}},
		{"unknown algorithm", "rules:\n  - id: a\n    algorithm: leaky\n", []string{`rule "a"`, "algorithm", "leaky"}},
		{"field of another algorithm", "rules:\n  - id: a\n    capacity: 5\n    refill_per_second: 1\n    window: 1m\n", []string{`rule "a"`, "window: does not apply to token_bucket (it takes capacity, refill_per_second)"}},
		{"gcra draining too fast", "rules:\n  - id: g\n    algorithm: gcra\n    rate: 100000\n    burst: 1\n", []string{`rule "g"`, "rate: draining 1 takes"}},
		{"bad regex", "rules:\n  - id: r\n    match: { endpoint_regex: \"([\" }\n    capacity: 5\n    refill_per_second: 1\n", []string{`rule "r"`, "match.endpoint_regex"}},
		{"bad cidr", "rules:\n  - id: r\n    match: { ip: 10.0.0.0/33 }\n    capacity: 5\n    refill_per_second: 1\n", []string{`rule "r"`, "match.ip"}},
		{"relative endpoint", "rules:\n  - id: r\n    match: { endpoint: search }\n    capacity: 5\n    refill_per_second: 1\n", []string{`rule "r"`, "match.endpoint"}},
		{"bad tier limit", "rules:\n  - id: t\n    algorithm: fixed_window\n    window: 1m\n    tiers: { free: 0 }\n", []string{`rule "t"`, "tiers", "free"}},
		{"global token bucket", "rules:\n  - id: g\n    scope: global\n    capacity: 5\n    refill_per_second: 1\n", []string{`rule "g"`, "algorithm", "global"}},
		{"mode on a regional rule", "rules:\n  - id: g\n    mode: elastic\n    capacity: 5\n    refill_per_second: 1\n", []string{`rule "g"`, "mode"}},
		{"lease on a log", "rules:\n  - id: l\n    algorithm: sliding_window_log\n    limit: 5\n    window: 1m\n    lease: 2\n", []string{`rule "l"`, "lease"}},
		{"batch on a log", "rules:\n  - id: l\n    algorithm: sliding_window_log\n    limit: 5\n    window: 1m\n    batch: 2\n", []string{`rule "l"`, "batch"}},
		{"batch above the limit", "rules:\n  - id: b\n    algorithm: fixed_window\n    limit: 5\n    window: 1m\n    batch: 6\n", []string{`rule "b"`, "batch"}},
		{"batch and lease", "rules:\n  - id: b\n    algorithm: fixed_window\n    limit: 5\n    window: 1m\n    batch: 2\n    lease: 2\n", []string{`rule "b"`, "lease", "batch"}},
		{"cost above the limit", "rules:\n  - id: c\n    capacity: 5\n    refill_per_second: 1\n    cost: 6\n", []string{`rule "c"`, "cost"}},
		{"count_over_limit on a log", "rules:\n  - id: l\n    algorithm: sliding_window_log\n    limit: 5\n    window: 1m\n    count_over_limit: true\n", []string{`rule "l"`, "count_over_limit", "sliding_window_counter"}},
		{"count_over_limit with batches", "rules:\n  - id: b\n    algorithm: fixed_window\n    limit: 5\n    window: 1m\n    batch: 2\n    count_over_limit: true\n", []string{`rule "b"`, "batch", "count_over_limit"}},
		{"bad fallback", "rules:\n  - id: f\n    capacity: 5\n    refill_per_second: 1\n    fallback: maybe\n", []string{`rule "f"`, "fallback", "maybe"}},
		{"sub-microsecond window", "rules:\n  - id: w\n    algorithm: fixed_window\n    limit: 5\n    window: 1500ns\n", []string{`rule "w"`, "window"}},
		{"empty allow glob", "allow: [\"\"]\n", []string{"allow[0]"}},
		{"tier_of without tier", "tier_of: [{ api_key: \"sk_*\" }]\n", []string{"tier_of[0].tier"}},
		{"unknown top-level field", "rulez: []\n", []string{"rules.yaml:1", "rulez"}},
		{"not yaml", "rules: [\n", []string{"rules.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "rules.yaml")
			if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			rs, err := LoadFile(path)
			if err == nil {
				t.Fatalf("loaded %d rules, want an error", len(rs.Rules()))
			}
			if !errors.Is(err, ErrInvalidRules) {
				t.Errorf("%v does not wrap ErrInvalidRules", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestRuleSetsThatLiftOrBlockEverythingAreRefused: a set with no rules
// (an empty or truncated file) would let every request through, a block
// pattern of stars alone would deny every one: both are refused, naming
// the field.
func TestRuleSetsThatLiftOrBlockEverythingAreRefused(t *testing.T) {
	const rule = "rules:\n  - { id: r, by: [api_key], capacity: 5, refill_per_second: 1 }\n"
	for _, tc := range []struct {
		name, src, field string
	}{
		{"empty file", "", "rules"},
		{"no rules", "rules: []\n", "rules"},
		{"only an allow list", "allow: [\"k*\"]\n", "rules"},
		{"blocks every key", "block: [\"*\"]\n" + rule, "block[0]"},
		{"blocks every key, twice the star", "block: [\"x\", \"**\"]\n" + rule, "block[1]"},
		{"blocks every key, any one character and more", "block: [\"?*\"]\n" + rule, "block[0]"},
		{"blocks every key of two characters or more", "block: [\"x\", \"*??\"]\n" + rule, "block[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Parse("rules.yaml", []byte(tc.src))
			var re *RuleError
			if !errors.As(err, &re) || re.Field != tc.field {
				t.Fatalf("Parse: %v, %v; want a RuleError on %s", rs, err, tc.field)
			}
		})
	}
	if _, err := Parse("rules.yaml", []byte("block: [\"bad_*\"]\n"+rule)); err != nil {
		t.Fatalf("a set that blocks some keys: %v", err)
	}
}

// TestIndexMatchesScan checks the endpoint index against matching every
// rule in turn, on random rule sets and requests.
func TestIndexMatchesScan(t *testing.T) {
	segments := []string{"", "/", "/a", "/a/", "/a/b", "/ab", "/b", "/b/c"}
	paths := []string{"", "/", "/a", "/a/b", "/a/bc", "/ab", "/ab/x", "/b", "/b/c?x=1", "/c", "/a?q"}
	rapid.Check(t, func(t *rapid.T) {
		var b strings.Builder
		b.WriteString("rules:\n")
		n := rapid.IntRange(1, 12).Draw(t, "rules") // a set has one at least
		for i := range n {
			fmt.Fprintf(&b, "  - id: r%d\n    capacity: 5\n    refill_per_second: 1\n", i)
			switch rapid.IntRange(0, 3).Draw(t, "kind") {
			case 1:
				fmt.Fprintf(&b, "    match: { endpoint: %q }\n", rapid.SampledFrom(segments[2:]).Draw(t, "prefix"))
			case 2:
				fmt.Fprintf(&b, "    match: { endpoint_regex: %q }\n", rapid.SampledFrom([]string{"^/a", "c$", "b"}).Draw(t, "regex"))
			case 3:
				fmt.Fprintf(&b, "    match: { endpoint: /, method: GET }\n")
			}
		}
		rs, err := Parse("", []byte(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Endpoint: rapid.SampledFrom(paths).Draw(t, "path"), Method: rapid.SampledFrom([]string{"GET", "POST"}).Draw(t, "method")}
		got := rs.AppendMatches(nil, &req)
		var want []*Rule
		for _, r := range rs.rules {
			if r.matches(&req, "", req.ipAddr()) {
				want = append(want, r)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("index matched %v, scan %v", ids(got), ids(want))
		}
	})
}

func ids(rules []*Rule) []string {
	var s []string
	for _, r := range rules {
		s = append(s, r.ID)
	}
	return s
}

func TestGlobMatchesRegexp(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pattern := rapid.StringMatching(`[ab*?]{1,6}`).Draw(t, "pattern")
		s := rapid.StringMatching(`[ab]{0,8}`).Draw(t, "s")
		g, err := compileGlob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile("^" + strings.NewReplacer("*", ".*", "?", ".").Replace(pattern) + "$")
		if got, want := g.match(s), re.MatchString(s); got != want {
			t.Fatalf("glob %q on %q: %v, want %v", pattern, s, got, want)
		}
	})
}

// BenchmarkMatch1000Rules matches requests against 1,000 rules spread over
// 200 endpoints, with 20 rules that any path may match.
func BenchmarkMatch1000Rules(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("rules:\n")
	for i := range 1000 {
		fmt.Fprintf(&sb, "  - id: r%d\n    by: [api_key]\n    capacity: 100\n    refill_per_second: 10\n", i)
		switch {
		case i%50 == 0:
			fmt.Fprintf(&sb, "    match: { api_key: \"sk_%d_*\" }\n", i)
		default:
			fmt.Fprintf(&sb, "    match: { endpoint: /api%d/v%d, method: GET, api_key: \"sk_*\" }\n", i%200, i%5)
		}
	}
	rs := mustParse(b, sb.String())
	reqs := make([]Request, 256)
	for i := range reqs {
		reqs[i] = Request{APIKey: fmt.Sprintf("sk_%d_key", i%60), Endpoint: fmt.Sprintf("/api%d/v%d/items", i%200, i%5), Method: "GET"}
	}
	var dst []*Rule
	matched := 0
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		dst = rs.AppendMatches(dst[:0], &reqs[i%len(reqs)])
		matched += len(dst)
		i++
	}
	if matched == 0 {
		b.Fatal("nothing matched")
	}
}

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }

func TestParseIPAgreesWithNetip(t *testing.T) {
	for _, s := range []string{"203.0.113.7", "0.0.0.0", "255.255.255.255", "1.2.3.4"} {
		if a, ok := parseIP(s); !ok || a != netip.MustParseAddr(s) {
			t.Errorf("parseIP(%q) = %v, %v", s, a, ok)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.OneOf(
			rapid.StringMatching(`[0-9]{1,4}(\.[0-9]{1,4}){0,4}\.?`),
			rapid.StringMatching(`[0-9a-f:.]{0,20}`),
			rapid.String(),
		).Draw(t, "s")
		want, err := netip.ParseAddr(s)
		got, ok := parseIP(s)
		if ok != (err == nil) || (ok && got != want.Unmap()) {
			t.Fatalf("parseIP(%q) = %v, %v; netip: %v, %v", s, got, ok, want, err)
		}
	})
}

// TestCounterKeyFormat: a counter key names its rule and values, and reads
// back.
func TestCounterKeyFormat(t *testing.T) {
	key := CounterKey("tenant-global", "sk_1")
	if key != "gq:{tenant-global:sk_1}" {
		t.Fatalf("CounterKey: %q", key)
	}
	if r, v, ok := ParseCounterKey(key); !ok || r != "tenant-global" || v != "sk_1" {
		t.Fatalf("ParseCounterKey(%q) = %q, %q, %v", key, r, v, ok)
	}
	for _, bad := range []string{"", "gq:{x}", "tenant-global:sk_1", "gq:{x:y", "{x:y}"} {
		if _, _, ok := ParseCounterKey(bad); ok {
			t.Errorf("ParseCounterKey(%q) accepted", bad)
		}
	}
}

// TestBatchAndItsOlderName: a hot key's batch is batch: N, or lease: N as
// older rules files say.
func TestBatchAndItsOlderName(t *testing.T) {
	for _, field := range []string{"batch", "lease"} {
		rs := mustParse(t, "rules:\n  - { id: h, by: [api_key], algorithm: fixed_window, limit: 100, window: 1m, "+field+": 10 }\n")
		if got := rs.Rule("h").Batch; got != 10 {
			t.Errorf("%s: 10 gives a batch of %d", field, got)
		}
	}
}

// FuzzParse feeds arbitrary bytes to the rules parser (what a region reads
// from the rules bucket): it never panics; an error names the file, and a
// set it accepts has a rule.
func FuzzParse(f *testing.F) {
	f.Add(ExampleRules)
	f.Add([]byte("rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 10, window: 1m }\n"))
	f.Add([]byte("rules: []\n"))
	f.Add([]byte("rules:\n  - { id: a, tiers: { free: 1 } }\n"))
	f.Add([]byte("{"))
	f.Fuzz(func(t *testing.T, src []byte) {
		rs, err := Parse("fuzz.yaml", src)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(rs.Rules()) == 0 {
			t.Fatal("accepted a set with no rule")
		}
	})
}
