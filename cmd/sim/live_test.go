package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestComparisonSetsTenantsSideBySide: the figures of tenants over their
// limit, as each report counts them, window by window, a window only one
// report has included.
func TestComparisonSetsTenantsSideBySide(t *testing.T) {
	s := &sim.Report{Scenario: "tenants-free-live", Mode: "strict", Limit: 25, Window: 10 * time.Second, Windows: []sim.Window{
		{Start: 0, Full: true, Tenants: sim.TenantUse{Count: 68, Min: 0.52, P1: 0.52, P5: 0.64, P50: 0.92}},
		{Start: 10 * time.Second, Full: true, Tenants: sim.TenantUse{Count: 72, Min: 0.56, P1: 0.56, P5: 0.84, P50: 0.92}},
	}}
	l := &sim.Report{Scenario: "tenants-free-live", Mode: "strict", Limit: 25, Window: 10 * time.Second, Live: true, Windows: []sim.Window{
		{Start: 0, Full: true, Tenants: sim.TenantUse{Count: 68, Min: 0.52, P1: 0.52, P5: 0.6, P50: 0.92}},
		{Start: 10 * time.Second, Full: true, Tenants: sim.TenantUse{Count: 72, Min: 0.8, P1: 0.8, P5: 0.88, P50: 0.96}},
		{Start: 20 * time.Second, Tenants: sim.TenantUse{Count: 1, Min: 1.04, P1: 1.04, P5: 1.04, P50: 1.04}},
	}}
	var b strings.Builder
	writeComparison(&b, s, l)
	want := `counters asked for more than the limit, what they admitted of it:
         simulated                              live
window   counters  least     p1     p5 median   counters  least     p1     p5 median
0:00           68  52.0%  52.0%  64.0%  92.0%         68  52.0%  52.0%  60.0%  92.0%
0:10           72  56.0%  56.0%  84.0%  92.0%         72  80.0%  80.0%  88.0%  96.0%
0:20*           -                                      1 104.0% 104.0% 104.0% 104.0%
`
	if got := b.String(); !strings.HasSuffix(got, want) {
		t.Fatalf("comparison:\n%s\nwant it to end with:\n%s", got, want)
	}
	// A report without counters over their limit: no such table.
	b.Reset()
	writeComparison(&b, &sim.Report{Limit: 1}, &sim.Report{Limit: 1})
	if strings.Contains(b.String(), "counters asked") {
		t.Fatalf("a table of counters over their limit where none were:\n%s", b.String())
	}
}
