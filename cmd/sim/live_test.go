package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/sim"
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
	rule := `  - { id: sim-live-strict, match: { api_key: "simlive-1-*" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: 1000, window: 10s, carry_debt: false }` + "\n"
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

// TestLiveDescription: a live run says what it plays, on the
// deployment's regions, not what the scenario says of its own five.
func TestLiveDescription(t *testing.T) {
	base, err := sim.Load("partition")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"us", "eu", "ap"}
	sc, err := sim.Restrict(base, names)
	if err != nil {
		t.Fatal(err)
	}
	if sc, err = sim.Scale(sc, 6); err != nil {
		t.Fatal(err)
	}
	got := liveDescription("deploy/local", names, base, sc, 6, 1)
	want := `partition, played on the deployment in deploy/local: 3 regions (us eu ap), for 50s
the scenario's regions sa af left out (it has 5)
faults: ap cut off at 0:10, heal at 0:30
traffic at most 150 requests/s; time scaled down 6x: window 10s, limit 1000 (the scenario's 1m0s, 6000)`
	if got != want {
		t.Fatalf("description:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(got, strings.TrimSpace(base.Description)) || strings.Contains(got, "five") {
		t.Fatalf("the scenario's own description is in the live run's:\n%s", got)
	}

	// A deployment of more regions than the scenario's, traffic cut by -rate.
	split, err := sim.Load("split-brain")
	if err != nil {
		t.Fatal(err)
	}
	names = []string{"a", "b", "c", "d", "e", "f"}
	sc, err = sim.Restrict(split, names)
	if err != nil {
		t.Fatal(err)
	}
	if sc, err = sim.ScaleRate(sc, 0.5); err != nil {
		t.Fatal(err)
	}
	got = liveDescription("d", names, split, sc, 1, 0.5)
	for _, want := range []string{fmt.Sprintf("%d regions (a b c d e f)", len(names)), "no traffic to f", "split ", "traffic scaled down 2x (-rate)"} {
		if !strings.Contains(got, want) {
			t.Errorf("description does not say %q:\n%s", want, got)
		}
	}
}
