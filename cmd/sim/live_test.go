package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geoquota/geoquota/regional"
)

func TestLiveFlags(t *testing.T) {
	c, err := parseLiveFlags([]string{"-scenario", "partition"})
	if err != nil || c.deployment != "deploy/local" || c.window.Seconds() != 10 || c.seed != 1 || c.mode != "" {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-scenario"},
		{[]string{"-scenario", "partition", "-mode", "lax"}, "-mode"},
		{[]string{"-scenario", "partition", "-window", "1500ms"}, "-window"},
		{[]string{"-scenario", "partition", "-window", "0s"}, "-window"},
		{[]string{"-scenario", "partition", "-concurrency", "0"}, "-concurrency"},
		{[]string{"-scenario", "partition", "-rate", "-5"}, "-rate"},
		{[]string{"-scenario", "partition", "extra"}, "extra"},
	} {
		if _, err := parseLiveFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	// No deployment where it is told to look: a clear error, exit 1.
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"live", "-scenario", "partition", "-deployment", filepath.Join(t.TempDir(), "none")}, io.Discard, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "deploy/local up") {
		t.Fatalf("sim live without a deployment: exit %d, %s", code, stderr.String())
	}
}

// TestWithRule: the scenario's rule goes first in the rules: list, and
// the rules still load, with it.
func TestWithRule(t *testing.T) {
	rule := `  - { id: sim-live-strict, match: { api_key: "simlive-1-*" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: 1000, window: 10s, fallback: fail_open, carry_debt: false }` + "\n"
	for _, base := range [][]byte{regional.ExampleRules, []byte("rules:\n  - { id: a, by: [api_key], algorithm: fixed_window, limit: 1, window: 1s }\n")} {
		out, err := withRule(base, rule)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := regional.Parse("with-rule.yaml", out)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if rs.Rule("sim-live-strict") == nil {
			t.Fatalf("the scenario's rule is not among %d rules", len(rs.Rules()))
		}
	}
	if _, err := withRule([]byte("allow: [x]\n"), rule); err == nil {
		t.Fatal("a file without rules: was given a rule")
	}
}
