package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/geoquota/geoquota/deploy/local/harness"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
	"github.com/geoquota/geoquota/transport/namespace"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "regiond-test-*")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "regiond")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building regiond: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// process is a regiond process started by a test.
type process struct {
	t          *testing.T
	cmd        *exec.Cmd
	http, grpc string
	mu         sync.Mutex
	log        bytes.Buffer
	exited     chan struct{}
}

// startRegiond runs regiond with args on ports of its choosing and waits
// until it serves; its addresses come from its log.
func startRegiond(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	args = append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-format", "json"}, args...)
	d := &process{t: t, cmd: exec.Command(binary, args...), exited: make(chan struct{})}
	d.cmd.Env = append(os.Environ(), env...)
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Bytes()
			d.mu.Lock()
			d.log.Write(line)
			d.log.WriteByte('\n')
			d.mu.Unlock()
			var rec struct{ Msg, HTTP, GRPC string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "regiond serving" {
				d.http, d.grpc = "http://"+rec.HTTP, rec.GRPC
				close(serving)
			}
		}
	}()
	go func() { d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop() })
	select {
	case <-serving:
	case <-d.exited:
		t.Fatalf("regiond exited before serving:\n%s", d.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("regiond not serving after 30s:\n%s", d.logs())
	}
	return d
}

func (d *process) logs() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// stop sends SIGTERM and waits for the process to exit.
func (d *process) stop() {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		d.t.Errorf("regiond did not stop on SIGTERM:\n%s", d.logs())
	}
}

func (d *process) check(apiKey, endpoint string) *http.Response {
	d.t.Helper()
	resp, err := http.Post(d.http+"/v1/check", "application/json",
		strings.NewReader(`{"descriptors":{"api_key":"`+apiKey+`","endpoint":"`+endpoint+`","method":"GET"}}`))
	if err != nil {
		d.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestDevQuickstart is the README's: regiond --dev, then 200s and a 429.
func TestDevQuickstart(t *testing.T) {
	d := startRegiond(t, nil, "--dev")
	for i := range 30 {
		if resp := d.check("sk_free_1", "/search"); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %s", i+1, resp.Status)
		}
	}
	resp := d.check("sk_free_1", "/search")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" ||
		resp.Header.Get("X-RateLimit-Limit") != "30" || !strings.Contains(resp.Header.Get("RateLimit-Policy"), `"search";q=30;w=60`) {
		t.Fatalf("31st: %s %v", resp.Status, resp.Header)
	}
	if !strings.Contains(d.logs(), "embedded NATS started") {
		t.Fatalf("no embedded NATS:\n%s", d.logs())
	}
}

func writeRules(t *testing.T, path string, limit int) {
	t.Helper()
	// Write and rename, as an editor does.
	tmp := path + ".tmp"
	text := fmt.Sprintf("rules:\n  - { id: r, match: { endpoint: /r }, by: [api_key], algorithm: fixed_window, limit: %d, window: 1h }\n", limit)
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// limitOf is the limit a fresh key meets.
func limitOf(d *process, key string) string {
	return d.check(key, "/r").Header.Get("X-RateLimit-Limit")
}

func TestRulesReloadWithoutRestart(t *testing.T) {
	redis := harness.NewRedis(t, harness.RedisOptions{})
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, path, 5)
	d := startRegiond(t, nil, "--redis", redis.URL(), "--rules", path, "--region", "us-east")
	if got := limitOf(d, "a"); got != "5" {
		t.Fatalf("limit %q at start", got)
	}
	// Edited on disk: in force within 2 s.
	start := time.Now()
	writeRules(t, path, 7)
	n := 0
	for limitOf(d, fmt.Sprintf("k%d", n)) != "7" {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("new limit not in force 2s after the edit:\n%s", d.logs())
		}
		n++
		time.Sleep(20 * time.Millisecond) // polling the condition, within the 2s it must meet
	}
	t.Logf("new rules in force %v after the file changed", time.Since(start).Round(time.Millisecond))
	// A bad file: the last good rules stay, and the log says why.
	if err := os.WriteFile(path, []byte("rules:\n  - { id: r, capacitty: 1 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(d.logs(), "capacitty") {
		if time.Now().After(deadline) {
			t.Fatalf("a bad rules file was not reported:\n%s", d.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the log
	}
	if got := limitOf(d, "after-bad"); got != "7" {
		t.Fatalf("limit %q after a bad file, want the last good 7", got)
	}
	// SIGHUP reloads too.
	writeRules(t, path, 9)
	d.cmd.Process.Signal(syscall.SIGHUP)
	deadline = time.Now().Add(2 * time.Second)
	for limitOf(d, "hup") != "9" {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not reload:\n%s", d.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition
	}
}

// TestEnvoyRateLimitDirectory: --rules takes envoyproxy/ratelimit's
// runtime directory, one domain a file, enforces it, and reloads it when a
// file of it changes.
func TestEnvoyRateLimitDirectory(t *testing.T) {
	redis := harness.NewRedis(t, harness.RedisOptions{})
	dir := t.TempDir()
	for _, name := range []string{"example1.yaml", "example2.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../regional/testdata/ratelimit", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := startRegiond(t, nil, "--redis", redis.URL(), "--rules", dir, "--region", "us-east")
	limit := func(body string) string {
		t.Helper()
		resp, err := http.Post(d.http+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("X-RateLimit-Limit")
	}
	if got := limit(`{"domain":"mongo_cps","descriptors":{"database":"users"}}`); got != "500" {
		t.Fatalf("example 1: limit %q:\n%s", got, d.logs())
	}
	if got := limit(`{"domain":"messaging","descriptors":{"message_type":"marketing","to_number":"1"}}`); got != "5" {
		t.Fatalf("example 2: limit %q", got)
	}
	// A new domain file: in force within 2 s.
	if err := os.WriteFile(filepath.Join(dir, "internal.yaml"),
		[]byte("domain: internal\ndescriptors:\n  - key: azure\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for limit(`{"domain":"internal","descriptors":{"azure":"a"}}`) != "100" {
		if time.Now().After(deadline) {
			t.Fatalf("a new domain file not in force after 2s:\n%s", d.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition, within the 2s it must meet
	}
}

// TestEnvoyExamplesAsShipped: envoyproxy/ratelimit's example directory,
// as that project ships it, is enforced whole, with a warning logged for
// each metadata (file, line, limit) and geoquota_rule_warnings 2;
// --rules-strict refuses to start on it, naming each.
func TestEnvoyExamplesAsShipped(t *testing.T) {
	const dir = "../../regional/testdata/ratelimit-examples"
	d := startRegiond(t, nil, "--dev", "--rules", dir)
	for _, w := range []string{`example.yaml:93: rule \"rl.service_service_1\": descriptors[5].metadata: read and ignored`,
		`example.yaml:102: rule \"rl.service_service_2\": descriptors[6].metadata: read and ignored`} {
		if !strings.Contains(d.logs(), w) {
			t.Errorf("no warning %s in the log:\n%s", w, d.logs())
		}
	}
	if got := metric(t, d.http, "geoquota_rule_warnings"); got != "2" {
		t.Errorf("geoquota_rule_warnings %q, want 2", got)
	}
	resp, err := http.Post(d.http+"/v1/check", "application/json", strings.NewReader(`{"domain":"rl","descriptors":{"service":"service_2"}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "2" {
		t.Fatalf("service_2: %s, limit %q", resp.Status, resp.Header.Get("X-RateLimit-Limit"))
	}

	out, err := exec.Command(binary, "--dev", "--rules", dir, "--rules-strict", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0").CombinedOutput()
	if exitCode(err) != 1 {
		t.Fatalf("--rules-strict: %v:\n%s", err, out)
	}
	for _, w := range []string{"--rules-strict: ", `example.yaml:93: rule "rl.service_service_1": descriptors[5].metadata: not enforced`,
		`example.yaml:102: rule "rl.service_service_2": descriptors[6].metadata: not enforced`} {
		if !strings.Contains(string(out), w) {
			t.Errorf("--rules-strict says nothing of %s:\n%s", w, out)
		}
	}
}

// TestPublishedRulesOutliveOtherFiles: rules put through the admin API
// (as rules published over NATS are) stay in force when something else
// in the rules file's directory changes (its log, say); an edit of the
// file itself puts the file's rules back.
func TestPublishedRulesOutliveOtherFiles(t *testing.T) {
	redis := harness.NewRedis(t, harness.RedisOptions{})
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	writeRules(t, path, 5)
	d := startRegiond(t, nil, "--redis", redis.URL(), "--rules", path, "--region", "us-east", "--admin-token", "T")
	req, err := http.NewRequest(http.MethodPut, d.http+"/v1/admin/rules",
		strings.NewReader("rules:\n  - { id: r, match: { endpoint: /r }, by: [api_key], algorithm: fixed_window, limit: 11, window: 1h }\n"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer T")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || limitOf(d, "put") != "11" {
		t.Fatalf("PUT rules: %s, limit %s", resp.Status, limitOf(d, "put"))
	}
	// An empty set would lift every limit: refused, the last good set kept.
	req, _ = http.NewRequest(http.MethodPut, d.http+"/v1/admin/rules", strings.NewReader(""))
	req.Header.Set("Authorization", "Bearer T")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "no rules") || limitOf(d, "empty put") != "11" {
		t.Fatalf("PUT of no rules: %s %s, limit %s; want 400 naming the field, the limit kept", resp.Status, body, limitOf(d, "empty put"))
	}
	if err := os.WriteFile(filepath.Join(dir, "regiond.log"), []byte("a line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Ten debounce periods: the published rules must hold throughout.
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got := limitOf(d, "other-file"); got != "11" {
			t.Fatalf("limit %s after another file in the directory changed, want the published 11:\n%s", got, d.logs())
		}
	}
	writeRules(t, path, 6)
	deadline := time.Now().Add(2 * time.Second)
	for limitOf(d, "edited") != "6" {
		if time.Now().After(deadline) {
			t.Fatalf("the edited file's rules not in force within 2s:\n%s", d.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	redis := harness.NewRedis(t, harness.RedisOptions{})
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, path, 5)
	d := startRegiond(t, []string{"GEOQUOTA_REDIS=" + redis.URL(), "GEOQUOTA_RULES=" + path, "GEOQUOTA_REGION=from-env",
		"GEOQUOTA_ADMIN_TOKEN=tok"}, "--region", "from-flag")
	d.check("a", "/r")
	resp, err := http.Get(d.http + "/v1/usage?rule=r&api_key=a")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct {
		Regions []struct{ Region string }
		Used    int
	}
	json.NewDecoder(resp.Body).Decode(&u)
	if len(u.Regions) != 1 || u.Regions[0].Region != "from-flag" || u.Used != 1 {
		t.Fatalf("usage %+v: the flag must win over GEOQUOTA_REGION", u)
	}
	req, _ := http.NewRequest(http.MethodGet, d.http+"/v1/admin/rules", nil)
	req.Header.Set("Authorization", "Bearer tok")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin token from GEOQUOTA_ADMIN_TOKEN: %v %v", resp.Status, err)
	}
}

// TestShutdownDelay: with --shutdown-delay, SIGTERM first turns /readyz to
// 503 while checks are still answered, for as long as balancers take to
// stop sending; then regiond stops.
func TestShutdownDelay(t *testing.T) {
	d := startRegiond(t, nil, "--dev", "--shutdown-delay", "3s")
	d.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for {
		resp, err := http.Get(d.http + "/readyz")
		if err != nil {
			t.Fatalf("/readyz refused before saying 503: %v\n%s", err, d.logs())
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %s after SIGTERM", resp.Status)
		}
		time.Sleep(10 * time.Millisecond) // polling the condition
	}
	if resp := d.check("during-the-delay", "/search"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a check while draining: %s", resp.Status)
	}
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("regiond did not stop after its delay:\n%s", d.logs())
	}
}

func TestGracefulShutdown(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.Write([]byte("done"))
	}))
	defer upstream.Close()
	d := startRegiond(t, nil, "--dev", "--proxy-upstream", upstream.URL)
	// A request in flight through the proxy when SIGTERM arrives finishes.
	result := make(chan string, 1)
	go func() {
		resp, err := http.Get(d.http + "/slow")
		if err != nil {
			result <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		result <- resp.Status + " " + string(b)
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not reach the upstream")
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(d.logs(), "shutting down") {
		if time.Now().After(deadline) {
			t.Fatalf("no shutdown logged:\n%s", d.logs())
		}
		time.Sleep(10 * time.Millisecond) // polling the log
	}
	close(release)
	if got := <-result; got != "200 OK done" {
		t.Fatalf("in-flight request: %s", got)
	}
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("regiond did not exit")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d:\n%s", code, d.logs())
	}
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "--redis is required"},
		{[]string{"--redis", "redis://x:1"}, nil, "--rules is required"},
		{[]string{"--dev", "--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--dev", "--proxy-upstream", "ftp://x"}, nil, "--proxy-upstream"},
		{[]string{"--dev", "--tls-cert", "c.pem"}, nil, "--tls-key"},
		{[]string{"--dev", "stray"}, nil, "unexpected arguments"},
		{[]string{"--dev"}, map[string]string{"GEOQUOTA_TIMEOUT": "soon"}, "GEOQUOTA_TIMEOUT"},
		{[]string{"--dev", "--nats", "nats://127.0.0.1:4222", "--require-auth"}, nil, "--require-auth: the NATS connection"},
		{[]string{"--dev", "--memberlist-addr", "127.0.0.1:0", "--require-auth"}, nil, "--memberlist-key"},
		{[]string{"--dev", "--nats-user", "u"}, nil, "--nats-password"},
		{[]string{"--dev", "--nats-token", "t", "--nats-user", "u", "--nats-password", "p"}, nil, "--nats-user and --nats-token"},
		{[]string{"--dev", "--nats-nkey", "/nonexistent.nk"}, nil, "--nats-nkey"},
		{[]string{"--dev", "--nats-tls-cert", "c.pem"}, nil, "--nats-tls-key"},
		{[]string{"--dev", "--redis-cert", "c.pem"}, nil, "--redis-key"},
		{[]string{"--dev", "--trusted-proxies", "10.0.0.0/8"}, nil, "--trusted-proxies: only with --proxy-upstream"},
		{[]string{"--dev", "--proxy-upstream", "http://x", "--trusted-proxies", "10.0.0.0/33"}, nil, `--trusted-proxies: "10.0.0.0/33"`},
		{[]string{"--dev", "--shutdown-delay", "-1s"}, nil, "--shutdown-delay"},
	} {
		_, err := parseFlags(tc.args, func(k string) string { return tc.env[k] })
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want an error about %s", tc.args, tc.env, err, tc.want)
		}
	}
	out, err := exec.Command(binary, "--redis", "redis://127.0.0.1:1/0", "--rules", "/nonexistent.yaml").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "nonexistent.yaml") {
		t.Fatalf("a missing rules file: %v: %s", err, out)
	}
}

// TestTwoRegionsShareAGlobalLimit runs two regiond processes, each on its
// own redis-server, gossiping over one NATS server: one region's usage of
// an elastic global limit holds the other back, and a strict one keeps
// each region to its floor until globalsync hands out leases.
func TestTwoRegionsShareAGlobalLimit(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{})
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte(`
rules:
  - { id: shared, match: { api_key: "e_*" }, by: [api_key], scope: global, mode: elastic, algorithm: fixed_window, limit: 200, window: 1h }
  - { id: split, match: { api_key: "s_*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 200, window: 1h }
`), 0o644)
	start := func(region string) *process {
		r := harness.NewRedis(t, harness.RedisOptions{})
		return startRegiond(t, nil, "--region", region, "--regions", "eu,us", "--redis", r.URL(), "--rules", rules,
			"--nats", ns.ClientURL(), "--gossip-interval", "50ms")
	}
	eu, us := start("eu"), start("us")
	allowed := func(d *process, key string, n int) int {
		ok := 0
		for range n {
			if d.check(key, "/x").StatusCode == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	// Strict, no globalsync: each region keeps to its floor, 5% of 200.
	if a, b := allowed(eu, "s_1", 20), allowed(us, "s_1", 20); a != 10 || b != 10 {
		t.Fatalf("strict floors: eu %d, us %d, want 10 each", a, b)
	}
	// Elastic: eu takes 150; once us hears of it, us borrows only up to
	// the ceiling (198: 1% headroom) less 150. (A region also holds back
	// what the other may have admitted over the lag, 300ms here, at its
	// own pace in the hour so far: under one check once the hour is a
	// minute old, and the checks take less than that.)
	if into := time.Duration(time.Now().UnixNano() % int64(time.Hour)); into < time.Minute {
		time.Sleep(time.Minute - into) // waiting for a time of the clock, not for a condition
	}
	if got := allowed(eu, "e_1", 150); got != 150 {
		t.Fatalf("eu admitted %d of 150", got)
	}
	// us's GET /v1/usage shows eu's part as gossip brings it.
	type usage struct {
		GlobalUsed int64 `json:"global_used"`
		Used       int64 `json:"used"`
		Regions    []struct {
			Region string
			Used   int64
			Share  float64
			Stale  bool
		}
	}
	var u usage
	deadline := time.Now().Add(10 * time.Second)
	for u.GlobalUsed != 150 {
		if time.Now().After(deadline) {
			t.Fatalf("us never heard all of eu's usage: %+v\n%s", u, us.logs())
		}
		time.Sleep(20 * time.Millisecond) // polling the condition, with a deadline
		resp, err := http.Get(us.http + "/v1/usage?rule=shared&api_key=e_1")
		if err != nil {
			t.Fatal(err)
		}
		u = usage{}
		json.NewDecoder(resp.Body).Decode(&u)
		resp.Body.Close()
	}
	if len(u.Regions) != 2 || u.Regions[0].Region != "eu" || u.Regions[0].Used != 150 || u.Regions[0].Stale ||
		u.Regions[1].Region != "us" || u.Regions[1].Used != 0 || u.Regions[1].Share != 0.05 || u.Used != 0 {
		t.Fatalf("usage breakdown %+v", u)
	}
	if got := allowed(us, "e_1", 100); got != 48 {
		t.Fatalf("us admitted %d, want 48 (ceiling 198 less eu's 150)", got)
	}
	// ListRegions from us: eu heard from lately, us itself on its floor
	// (no globalsync here, so no lease).
	conn, err := grpc.NewClient(us.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lr, err := pb.NewRateLimiterClient(conn).ListRegions(t.Context(), &pb.ListRegionsRequest{})
	if err != nil || lr.AnsweredBy != "us" || len(lr.Regions) != 2 || lr.Regions[0].Region != "eu" || lr.Regions[0].PartitionSuspected ||
		lr.Regions[0].LastHeardMs == nil || lr.Regions[0].GetLastHeardMs() < 0 || lr.Regions[1].Region != "us" || len(lr.Regions[1].Leases) != 0 {
		t.Fatalf("ListRegions: %v, %v", lr, err)
	}
}

// TestSiblingsShareDenials: two replicas of one region find each other
// with memberlist; a key one of them found over its limit is refused by
// the other from its denial cache (each runs on its own in-memory store
// here, so that only the message can tell it: b's own store would allow
// 500).
func TestSiblingsShareDenials(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rules, []byte("rules:\n  - { id: r, by: [api_key], algorithm: fixed_window, limit: 500, window: 1h }\n"), 0o644)
	key := "--memberlist-key=000102030405060708090a0b0c0d0e0f"
	a := startRegiond(t, nil, "--dev", "--rules", rules, "--memberlist-addr", "127.0.0.1:0", "--replica-name", "a", key)
	var addr string
	for _, line := range strings.Split(a.logs(), "\n") {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "members: listening" {
			addr = rec.Addr
		}
	}
	if addr == "" {
		t.Fatalf("no membership address in the log:\n%s", a.logs())
	}
	b := startRegiond(t, nil, "--dev", "--rules", rules, "--memberlist-addr", "127.0.0.1:0", "--peers", addr, "--replica-name", "b", key)
	for range 500 {
		a.check("k9", "/x")
	}
	if resp := a.check("k9", "/x"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a's 501st: %s", resp.Status)
	}
	for i := range 499 {
		if b.check("k9", "/x").StatusCode == http.StatusTooManyRequests {
			t.Logf("b refused k9 at its request %d", i+1)
			return
		}
		time.Sleep(20 * time.Millisecond) // spreading b's requests over 10s
	}
	t.Fatalf("b allowed 499 requests of a key a had found over its limit:\n%s", b.logs())
}

// metric returns the value of one series on a daemon's /metrics, or "".
func metric(t *testing.T, base, series string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// TestNATSAuthentication: against NATS servers whose only users are a
// deployment's identities, regiond connects with its nkey (--nats-nkey,
// --require-auth) and gossips as its region; against open servers it says
// so in its log and in geoquota_insecure, and --require-auth refuses to
// start that way.
func TestNATSAuthentication(t *testing.T) {
	dir := t.TempDir()
	perms := namespace.Names{}.Region("us")
	us, err := harness.NewIdentity(dir, "regiond-us", &perms)
	if err != nil {
		t.Fatal(err)
	}
	op, err := harness.NewIdentity(dir, "operator", nil)
	if err != nil {
		t.Fatal(err)
	}
	secured := harness.NewNATS(t, harness.NATSOptions{JetStream: true, Users: []*harness.Identity{us, op}})
	opt, err := op.Option()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(secured.ClientURL(), opt)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(namespace.Names{}.Heartbeat("us"))
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()

	d := startRegiond(t, []string{"GEOQUOTA_NATS_NKEY=" + us.SeedFile}, "--dev", "--region", "us", "--regions", "us,eu",
		"--nats", secured.ClientURL(), "--require-auth")
	if m, err := sub.NextMsg(30 * time.Second); err != nil {
		t.Fatalf("no heartbeat from regiond authenticated as us: %v\n%s", err, d.logs())
	} else if len(m.Data) == 0 {
		t.Fatal("an empty heartbeat")
	}
	if v := metric(t, d.http, `geoquota_insecure{link="nats"}`); v != "0" {
		t.Errorf(`geoquota_insecure{link="nats"} = %q authenticated, want 0`, v)
	}
	if strings.Contains(d.logs(), "without authentication") {
		t.Errorf("an authenticated regiond warns of no authentication:\n%s", d.logs())
	}

	open := harness.NewNATS(t, harness.NATSOptions{})
	d = startRegiond(t, nil, "--dev", "--region", "us", "--nats", open.ClientURL())
	if !strings.Contains(d.logs(), "without authentication") {
		t.Errorf("no warning of unauthenticated NATS:\n%s", d.logs())
	}
	if v := metric(t, d.http, `geoquota_insecure{link="nats"}`); v != "1" {
		t.Errorf(`geoquota_insecure{link="nats"} = %q unauthenticated, want 1`, v)
	}
	out, err := exec.Command(binary, "--dev", "--nats", open.ClientURL(), "--require-auth").CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "--require-auth") {
		t.Fatalf("--require-auth without credentials: exit %d: %s", code, out)
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestHelp: regiond -h and --help print every flag, the variables that set
// them and where the documentation is, on stdout, and exit 0.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "--help"} {
		var stdout, stderr strings.Builder
		cmd := exec.Command(binary, h)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		out := stdout.String()
		if err != nil || stderr.Len() > 0 {
			t.Fatalf("regiond %s: %v, stderr %q", h, err, stderr.String())
		}
		for _, want := range []string{"usage: regiond [flags]", "-redis", "-rules", "GEOQUOTA_REDIS", "docs/operations.md"} {
			if !strings.Contains(out, want) {
				t.Errorf("regiond %s says nothing of %q:\n%s", h, want, out)
			}
		}
	}
}
