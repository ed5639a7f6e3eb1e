package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// TestSimRun: the partition scenario prints its tables, the same twice,
// and writes the report files, with a page that sets both modes side by
// side; the time taken goes to stderr.
func TestSimRun(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCmd(t, "run", "-scenario", "partition", "-seed", "1", "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"scenario partition, strict mode, seed 1", "scenario partition, elastic mode, seed 1",
		"false-rej%", "heal at 3:00.0: every copy agreed", "lease expiries: ap at"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errs, "simulated requests/s") {
		t.Errorf("stderr lacks the speed: %s", errs)
	}
	for _, mode := range []string{"strict", "elastic"} {
		for _, f := range []string{"index.html", "windows.csv", "admitted.svg", "shares.svg", "over.svg", "report.txt"} {
			if _, err := os.Stat(filepath.Join(dir, "partition-"+mode+"-"+f)); err != nil {
				t.Error(err)
			}
		}
	}
	page, err := os.ReadFile(filepath.Join(dir, "partition-index.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Scenario partition, seed 1: strict and elastic side by side", `<h3>strict</h3>`, `<h3>elastic</h3>`,
		"us (strict): demand per window", "us (elastic): demand per window", "<b>1:00–3:00</b>: ap cut off"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("partition-index.html lacks %q", want)
		}
	}
	if !strings.Contains(errs, "wrote "+filepath.Join(dir, "partition-index.html")+" (strict and elastic side by side)") {
		t.Errorf("stderr does not name the page: %s", errs)
	}
	_, again, _ := runCmd(t, "run", "-scenario", "partition", "-seed", "1", "-workers", "1", "-out", "")
	if again != out {
		t.Error("a second run with the same seed printed something else")
	}
	both := t.TempDir()
	if _, again, _ = runCmd(t, "run", "-scenario", "partition", "-seed", "1", "-mode", "both", "-out", both); again != out {
		t.Error("-mode both printed other than no -mode")
	}
	if again, err := os.ReadFile(filepath.Join(both, "partition-index.html")); err != nil || string(again) != string(page) {
		t.Errorf("-mode both wrote another page than no -mode (%v)", err)
	}
	// By default the files go to ./sim-out.
	t.Chdir(t.TempDir())
	code, strict, _ := runCmd(t, "run", "-scenario", "partition", "-seed", "1", "-mode", "strict")
	if _, err := os.Stat(filepath.Join("sim-out", "partition-strict-index.html")); err != nil {
		t.Errorf("no report in ./sim-out: %v", err)
	}
	if code != 0 || !strings.HasPrefix(out, strict) || strings.Contains(strict, "elastic mode") {
		t.Errorf("-mode strict: exit %d, want the strict table alone", code)
	}
	if page, err := os.ReadFile(filepath.Join("sim-out", "partition-index.html")); err != nil || !strings.Contains(string(page), "<h3>strict</h3>") ||
		strings.Contains(string(page), "<h3>elastic</h3>") {
		t.Errorf("-mode strict: want a page of strict mode alone (%v)", err)
	}
}

// TestSimRunFromFile runs a scenario file of one's own.
// TestSimRunCompares: several scenarios, comma-separated, run in turn,
// each with its page, and a page comparing them.
func TestSimRunCompares(t *testing.T) {
	dir := t.TempDir()
	code, out, errs := runCmd(t, "run", "-scenario", "steady,partition", "-seed", "1", "-mode", "strict", "-duration", "2m", "-out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "scenario steady, strict mode") || !strings.Contains(out, "scenario partition, strict mode") {
		t.Errorf("output lacks a scenario:\n%s", out)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 scenarios compared, seed 1", `<a href="steady-index.html">steady</a>`, `<a href="partition-index.html">partition</a>`, "ap cut off"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	for _, f := range []string{"steady-index.html", "partition-index.html"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(errs, "(2 scenarios compared)") {
		t.Errorf("stderr does not name the comparison: %s", errs)
	}
}

func TestSimRunFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mine.yaml")
	os.WriteFile(path, []byte(`name: mine
duration: 30s
regions: [left, right]
rule: { limit: 100, window: 10s }
modes: [strict]
traffic:
  - { region: left, kind: steady, rate: 20 }
  - { region: right, kind: flash, rate: 1, peak: 30, at: 10s, for: 5s }
`), 0o644)
	code, out, errs := runCmd(t, "run", "-scenario", path, "-out", "")
	if code != 0 || !strings.Contains(out, "scenario mine, strict mode") || !strings.Contains(out, "2 regions (left right)") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
}

// TestSimRunBadInput: bad flags and scenarios exit non-zero, naming what
// is wrong.
func TestSimRunBadInput(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("name: bad\nduration: 1m\nregions: [a, b]\nrule: { limit: -1, window: 1s }\ntraffic: [{ region: a, kind: steady, rate: 1 }]\n"), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run"}, 2, "-scenario"},
		{[]string{"run", "-scenario", "partition", "-mode", "lenient"}, 2, "-mode"},
		{[]string{"run", "-scenario", "partition", "-duration", "-1s"}, 2, "-duration"},
		{[]string{"run", "-scenario", "partition", "-bogus"}, 2, "bogus"},
		{[]string{"run", "-scenario", "nowhere"}, 1, "no scenario"},
		{[]string{"run", "-scenario", bad}, 1, "rule.limit"},
		{[]string{"accuracy", "-keys", "0"}, 2, "-keys"},
		{[]string{"accuracy", "-min-rate", "3", "-max-rate", "1"}, 2, "-min-rate"},
	} {
		code, _, errs := runCmd(t, c.args...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("sim %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, errs, c.code, c.want)
		}
	}
}

// TestSimRunList lists every built-in scenario with its description.
func TestSimRunList(t *testing.T) {
	code, out, _ := runCmd(t, "run", "-list")
	for _, name := range []string{"steady", "shift", "flash-crowd", "partition", "split-brain", "globalsync-down", "redis-loss", "clock-skew"} {
		if code != 0 || !strings.Contains(out, "\n"+name+" ") && !strings.HasPrefix(out, name+" ") {
			t.Errorf("-list lacks %s:\n%s", name, out)
		}
	}
}

// TestSimAccuracy prints the study's figures.
func TestSimAccuracy(t *testing.T) {
	code, out, errs := runCmd(t, "accuracy", "-keys", "50", "-duration", "2m")
	if code != 0 || !strings.Contains(out, "wrongly allowed") || !strings.Contains(out, "50 keys") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
}
