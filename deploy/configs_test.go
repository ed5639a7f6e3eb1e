package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/geoquota/geoquota/regional"
)

// TestExampleConfigsParse keeps the example configurations under deploy/
// well-formed YAML, every document of them.
func TestExampleConfigsParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Errorf("%s: %v", path, err)
				break
			}
			if doc == nil {
				t.Errorf("%s: an empty document", path)
			}
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("found %d configurations under deploy/", n)
	}
}

// flagsOf reads the flag names a command defines, from its source.
func flagsOf(t *testing.T, files ...string) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`fs\.\w+Var\([^,]+, "([a-z-]+)"`)
	out := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
	}
	if len(out) < 5 {
		t.Fatalf("found only %d flags in %v", len(out), files)
	}
	return out
}

// TestManifestFlags: every flag, or GEOQUOTA_ variable, that the manifests
// and units give regiond or globalsync is one it has.
func TestManifestFlags(t *testing.T) {
	commands := map[string]map[string]bool{
		"regiond":    flagsOf(t, "../cmd/regiond/config.go", "../cmd/internal/daemon/nats.go", "../cmd/internal/daemon/tls.go"),
		"globalsync": flagsOf(t, "../cmd/globalsync/main.go", "../cmd/internal/daemon/nats.go", "../cmd/internal/daemon/tls.go"),
	}
	argRe := regexp.MustCompile(`--([a-z][a-z-]*)=`)
	envRe := regexp.MustCompile(`GEOQUOTA_([A-Z_]+)`)
	checked := 0
	for _, c := range []struct{ file, command string }{
		{"kubernetes/regiond-us.yaml", "regiond"},
		{"kubernetes/globalsync.yaml", "globalsync"},
		{"systemd/regiond.env.example", "regiond"},
		{"systemd/globalsync.service", "globalsync"},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range argRe.FindAllSubmatch(b, -1) {
			checked++
			if !commands[c.command][string(m[1])] {
				t.Errorf("%s gives %s --%s, a flag it does not have", c.file, c.command, m[1])
			}
		}
		for _, m := range envRe.FindAllSubmatch(b, -1) {
			checked++
			name := strings.ReplaceAll(strings.ToLower(string(m[1])), "_", "-")
			if !commands[c.command][name] {
				t.Errorf("%s sets GEOQUOTA_%s, but %s has no --%s", c.file, m[1], c.command, name)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d flags, want the manifests' and units' all", checked)
	}
}

// TestRulesConfigMap: the rules the Kubernetes example mounts load.
func TestRulesConfigMap(t *testing.T) {
	b, err := os.ReadFile("kubernetes/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&cm); err != nil || cm.Kind != "ConfigMap" {
		t.Fatalf("the first document is not a ConfigMap: %v", err)
	}
	rs, err := regional.Parse("rules.yaml", []byte(cm.Data["rules.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if r := rs.Rule("tenant-global"); r == nil || r.Scope != regional.ScopeGlobal {
		t.Fatal("the example rules lack their global rule")
	}
}

// TestAlertsUseRealMetrics: every geoquota_ metric an alert uses is one
// the code exports.
func TestAlertsUseRealMetrics(t *testing.T) {
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var source strings.Builder
	for _, dir := range []string{"../transport", "../cmd/globalsync", "../regional", "../cmd/internal/daemon"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				b, _ := os.ReadFile(f)
				source.Write(b)
			}
		}
	}
	runbook, err := os.ReadFile("RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	metricRe := regexp.MustCompile(`geoquota_[a-z_]+`)
	alerts := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("a rule without alert or expr: %+v", r)
			}
			if !strings.Contains(string(runbook), "**"+r.Alert+"**") {
				t.Errorf("RUNBOOK.md does not explain %s", r.Alert)
			}
			for _, m := range metricRe.FindAllString(r.Expr, -1) {
				if !strings.Contains(source.String(), `"`+m+`"`) {
					t.Errorf("%s uses %s, which nothing exports", r.Alert, m)
				}
			}
		}
	}
	if alerts < 5 {
		t.Fatalf("%d alerts", alerts)
	}
}

// envoyHCM reads an Envoy bootstrap as Envoy would (decoded strictly into
// go-control-plane's types, its typed configs included, and validated)
// and returns its first listener's HTTP connection manager.
func envoyHCM(t *testing.T, path string) *hcmv3.HttpConnectionManager {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var boot bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &boot); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if err := boot.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := boot.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	return &hcm
}

// TestEnvoyConfig: deploy/envoy/envoy.yaml is a bootstrap Envoy takes
// (decoded strictly into go-control-plane's types, its typed configs
// included, and validated), and it sends one descriptor a request, so
// that every rule that applies counts a request once.
func TestEnvoyConfig(t *testing.T) {
	hcm := envoyHCM(t, "envoy/envoy.yaml")
	limits := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0].GetRoute().GetRateLimits()
	if len(limits) != 1 {
		t.Fatalf("%d rate_limits entries: a request meets every rule once per descriptor, want one", len(limits))
	}
	keys := map[string]bool{}
	for _, a := range limits[0].GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			keys["remote_address"] = true
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			keys[h.GetDescriptorKey()] = true
			if h.GetDescriptorKey() == "api_key" && !h.GetSkipIfAbsent() {
				t.Error("api_key without skip_if_absent: requests without X-API-Key would not be checked")
			}
		}
	}
	for _, k := range []string{"remote_address", "api_key", "endpoint", "method"} {
		if !keys[k] {
			t.Errorf("the descriptor lacks %s: %v", k, keys)
		}
	}
}
