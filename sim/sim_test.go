package sim

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs in testdata/ from what the scenarios do now")

// ciDuration cuts the scenarios too big for the test run short; the whole
// runs are documented commands (README).
var ciDuration = map[string]time.Duration{
	"million":         300 * time.Millisecond,
	"many-keys":       4 * time.Second,
	"tenants":         300 * time.Millisecond,
	"tenants-free":    300 * time.Millisecond,
	"tenants-million": 300 * time.Millisecond,
}

// TestScenarios runs every built-in scenario in each of its modes: its
// table must be what testdata holds (go test ./sim -rewrite writes it anew
// after a change made on purpose), and its guarantees must hold.
func TestScenarios(t *testing.T) {
	for _, name := range Names() {
		sc, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range sc.Modes {
			t.Run(name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				rep, err := Run(sc, mode, 1, Options{Duration: ciDuration[name]})
				if err != nil {
					t.Fatal(err)
				}
				var out bytes.Buffer
				if err := rep.WriteText(&out); err != nil {
					t.Fatal(err)
				}
				golden(t, filepath.Join("testdata", name+"-"+mode+".txt"), out.Bytes())
				checkGuarantees(t, sc, rep)
			})
		}
	}
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *rewrite {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./sim -run TestScenarios -rewrite writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s (if the change is meant, go test ./sim -run TestScenarios -rewrite):\n%s", path, firstDiff(string(want), string(got)))
	}
}

// firstDiff shows the first line that differs.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := range max(len(w), len(g)) {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n  want " + a + "\n  got  " + b
		}
	}
	return "(same lines)"
}

// checkGuarantees asserts the guarantees of global limits (docs/design.md) on a report: strict mode never
// over the limit; elastic mode within its bound; every heal converged
// within two gossip intervals plus the time on the wire; utilization where
// the scenario expects it; over-admission measured by globalsync as it
// happened.
func checkGuarantees(t *testing.T, sc *Scenario, rep *Report) {
	t.Helper()
	for _, w := range rep.Windows {
		switch {
		case rep.Mode == "strict" && w.Over > 0 && w.OverPct(rep.Limit) > sc.Expect.MaxStrictOver:
			t.Errorf("strict: window %s admitted %d over the limit of %d (worst counter), want at most %v%%", clockString(w.Start), w.Over, rep.Limit, sc.Expect.MaxStrictOver)
		case rep.Mode == "elastic" && w.OverPct(rep.Limit) > *sc.Expect.MaxElasticOver:
			t.Errorf("elastic: window %s %.2f%% over the limit, want at most %v%%", clockString(w.Start), w.OverPct(rep.Limit), *sc.Expect.MaxElasticOver)
		case rep.Mode == "elastic" && sc.Expect.SettledElasticOver != nil && w.Start >= sc.Expect.SettledFrom &&
			w.OverPct(rep.Limit) > *sc.Expect.SettledElasticOver:
			t.Errorf("elastic: window %s %.2f%% over the limit, want at most %v%% from %s on", clockString(w.Start), w.OverPct(rep.Limit),
				*sc.Expect.SettledElasticOver, clockString(sc.Expect.SettledFrom))
		}
	}
	if sc.Expect.Converge {
		if len(rep.Heals) == 0 {
			t.Error("the scenario expects heals; none happened")
		}
		bound := 2*sc.Gossip.Interval + 3*(rep.Latency[1]+sc.Network.Jitter)
		for _, h := range rep.Heals {
			if h.Converged < 0 || h.Converged > bound {
				t.Errorf("heal at %s: converged after %v, want within %v (two gossip intervals, and a message, an ask and its answer on the wire)",
					clockString(h.At), h.Converged, bound)
			}
		}
	}
	if u := sc.Expect.Utilization; u > 0 {
		for _, w := range rep.Windows {
			if !w.Full || w.Start < sc.Expect.UtilizationFrom || (sc.Expect.UtilizationUntil > 0 && w.Start >= sc.Expect.UtilizationUntil) {
				continue
			}
			if w.Utilization(rep.Limit) < u {
				t.Errorf("window %s: admitted %d of %d (%.1f%%), want at least %.0f%%", clockString(w.Start), w.Admitted, rep.Limit,
					100*w.Utilization(rep.Limit), 100*u)
			}
		}
	}
	if u := sc.Expect.TenantUtilization; u > 0 && rep.Mode == "strict" {
		seen := false
		for _, w := range rep.Windows {
			if !w.Full || w.Start < sc.Expect.UtilizationFrom || w.Tenants.Count == 0 {
				continue
			}
			seen = true
			if w.Tenants.Min < u {
				t.Errorf("window %s: %s admitted %.1f%% of its limit, asked for more; want at least %.0f%% for every such counter (%d of them, median %.1f%%)",
					clockString(w.Start), w.Tenants.Worst, 100*w.Tenants.Min, 100*u, w.Tenants.Count, 100*w.Tenants.P50)
			}
		}
		if !seen && rep.Duration >= sc.Expect.UtilizationFrom+rep.Window {
			t.Error("no counter was asked for more than its limit in a full window: the scenario checks nothing")
		}
	}
	// Every window whose books globalsync closed: what it found over is
	// what was over, counted once.
	closedBy := rep.BooksClosed
	if want := rep.Duration - sc.Gossip.AntiEntropy - 2*sc.Budget.Rebalance - sc.Gossip.AntiEntropy/2 - 2*sc.Budget.Rebalance; rep.Duration > 2*rep.Window && closedBy < want-rep.Window {
		t.Errorf("globalsync closed the books through %s only, want through %s", clockString(closedBy), clockString(want-rep.Window))
	}
	found := map[time.Duration]int64{}
	for _, f := range rep.Found {
		found[f.WindowStart] += f.Amount
	}
	for _, w := range rep.Windows {
		if w.Start+rep.Window > closedBy || w.Start < 0 {
			continue
		}
		// Attribution rounds each region's part down.
		if got := found[w.Start]; got > w.OverTotal || got < w.OverTotal-int64(len(rep.Regions))*int64(max(1, w.OverCount)) {
			t.Errorf("window %s: globalsync found %d over-admitted, %d were", clockString(w.Start), got, w.OverTotal)
		}
	}
}

// TestSameSeedSameOutput: a scenario run twice with the same seed writes
// the same files byte for byte, whether one goroutine or several run the
// regions; another seed gives other figures.
func TestSameSeedSameOutput(t *testing.T) {
	sc, err := Load("partition")
	if err != nil {
		t.Fatal(err)
	}
	files := func(seed uint64, workers int) map[string][]byte {
		rep, err := Run(sc, "elastic", seed, Options{Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if err := rep.WriteFiles(dir); err != nil {
			t.Fatal(err)
		}
		out := map[string][]byte{}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = b
		}
		return out
	}
	a, b, c := files(7, 1), files(7, 4), files(8, 2)
	if len(a) != 7 {
		t.Fatalf("wrote %d files, want 7 (report, two CSVs, three charts, page)", len(a))
	}
	for name, content := range a {
		if !bytes.Equal(content, b[name]) {
			t.Errorf("%s differs between two runs with seed 7", name)
		}
	}
	if bytes.Equal(a["partition-elastic-windows.csv"], c["partition-elastic-windows.csv"]) {
		t.Error("seeds 7 and 8 gave the same windows")
	}
	// A busy scenario, whose regions run in parallel, and one whose links
	// jitter and lose messages (each place draws its own dice): the same
	// again.
	text := func(name string, d time.Duration, workers int) string {
		_, rep := runScenario(t, name, "elastic", 7, Options{Workers: workers, Duration: d})
		var b strings.Builder
		rep.WriteText(&b)
		rep.WriteCSV(&b)
		return b.String()
	}
	for _, c := range []struct {
		name string
		d    time.Duration
	}{{"million", 200 * time.Millisecond}, {"flash-crowd", 3 * time.Minute}} {
		if one, four := text(c.name, c.d, 1), text(c.name, c.d, 4); one != four {
			t.Errorf("%s with one worker and with four differ:\n%s", c.name, firstDiff(one, four))
		}
	}
}

// runScenario runs a built-in scenario, failing the test on an error.
func runScenario(t *testing.T, name, mode string, seed uint64, opt Options) (*Scenario, *Report) {
	t.Helper()
	sc, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(sc, mode, seed, opt)
	if err != nil {
		t.Fatal(err)
	}
	return sc, rep
}

// TestReportFiles: the charts are well-formed SVG with a series per
// region, and the page of the report alone shows them, a chart of each
// region and the table; windows.csv has each region's demand and false
// rejections.
func TestReportFiles(t *testing.T) {
	_, rep := runScenario(t, "partition", "strict", 1, Options{})
	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, "partition-strict-"+name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, name := range []string{"admitted.svg", "shares.svg", "over.svg"} {
		svg := read(name)
		dec := xml.NewDecoder(strings.NewReader(svg))
		for {
			_, err := dec.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s is not well-formed: %v", name, err)
			}
		}
	}
	shares := read("shares.svg")
	for _, r := range rep.Regions {
		if !strings.Contains(shares, ">"+r+"</text>") {
			t.Errorf("shares.svg has no series for %s", r)
		}
	}
	if n := strings.Count(shares, "<polyline"); n != len(rep.Regions) {
		t.Errorf("shares.svg has %d lines, want %d", n, len(rep.Regions))
	}
	if n := strings.Count(read("admitted.svg"), `class="bar" data-series="admitted"`); n != len(rep.Windows) {
		t.Errorf("admitted.svg has %d bars, want one per window (%d)", n, len(rep.Windows))
	}
	for _, name := range []string{"admitted.svg", "shares.svg", "over.svg"} {
		if svg := read(name); !strings.Contains(svg, `<rect class="fault" data-kind="partition" data-from="60" data-to="180"`) ||
			!strings.Contains(svg, "ap cut off, 1:00–3:00</text>") {
			t.Errorf("%s does not shade ap's cut from 1:00 to 3:00, with its legend", name)
		}
	}
	page := read("index.html")
	if strings.Count(page, "<svg") != 3+len(rep.Regions) || !strings.Contains(page, "false-rej%") || !strings.Contains(page, "<h1>Scenario partition, strict mode, seed 1</h1>") {
		t.Error("index.html should hold a chart of each region, the three of the limit and the table")
	}
	if n, m := strings.Count(page, "http://"), strings.Count(page, "http://www.w3.org/2000/svg"); n != m || strings.Contains(page, "https://") {
		t.Error("index.html should load nothing from elsewhere")
	}
	csv := strings.Split(strings.TrimSpace(read("windows.csv")), "\n")
	if len(csv) != len(rep.Windows)+1 {
		t.Errorf("windows.csv has %d lines, want a header and %d windows", len(csv), len(rep.Windows))
	}
	head := strings.Split(csv[0], ",")
	for i, w := range rep.Windows {
		row := strings.Split(csv[i+1], ",")
		if len(row) != len(head) {
			t.Fatalf("windows.csv row %d has %d fields, the header %d", i+1, len(row), len(head))
		}
		for j, name := range rep.Regions {
			for _, c := range []struct {
				column string
				want   int64
			}{{"requests_" + name, w.RequestsByRegion[j]}, {"false_rejected_" + name, w.FalseRejectedByRegion[j]}} {
				if k := slices.Index(head, c.column); k < 0 || row[k] != strconv.FormatInt(c.want, 10) {
					t.Errorf("windows.csv, window %s: %s %q, want %d", clockString(w.Start), c.column, row[max(k, 0)], c.want)
				}
			}
		}
	}
	sharesCSV := strings.Split(strings.TrimSpace(read("shares.csv")), "\n")
	if len(sharesCSV) != len(rep.Samples)+1 || strings.Count(sharesCSV[0], ",") != len(rep.Regions) ||
		strings.Count(sharesCSV[len(sharesCSV)-1], ",") != len(rep.Regions) {
		t.Errorf("shares.csv: %d lines (header %q), want a header and %d samples of %d regions", len(sharesCSV), sharesCSV[0], len(rep.Samples), len(rep.Regions))
	}
}

// TestPartitionStory checks the partition scenario's story beyond its
// guarantees: the region cut off lost its lease (once), ran on its floor
// while cut off, and had its share back after the heal.
func TestPartitionStory(t *testing.T) {
	sc, rep := runScenario(t, "partition", "strict", 1, Options{})
	ap := slices.Index(rep.Regions, "ap")
	if len(rep.Expiries) != 1 || rep.Expiries[0].Region != "ap" {
		t.Fatalf("lease expiries %+v, want ap's alone", rep.Expiries)
	}
	lapsed := rep.Expiries[0].At
	if cut := time.Minute; lapsed < cut || lapsed > cut+sc.Budget.LeaseTTL+time.Second {
		t.Errorf("ap's lease lapsed at %v, want within a lease (%v) of the cut at %v", lapsed, sc.Budget.LeaseTTL, cut)
	}
	floor := *sc.Budget.Reserve / float64(len(sc.Regions))
	for _, smp := range rep.Samples {
		if smp.At > lapsed+time.Second && smp.At < 3*time.Minute && smp.Shares[ap] > floor+1e-9 {
			t.Fatalf("at %v, cut off with its lease lapsed, ap might admit %.3f, want its floor %.3f", smp.At, smp.Shares[ap], floor)
		}
	}
	last := rep.Samples[len(rep.Samples)-1]
	if last.Shares[ap] <= floor || !last.Leased[ap] {
		t.Errorf("after the heal ap holds %.3f (leased %t), want a lease above its floor", last.Shares[ap], last.Leased[ap])
	}
	if rep.MessagesCut == 0 {
		t.Error("no message was cut")
	}
}

// TestBadScenarios: every mistake in a scenario file is refused with the
// field it is in.
func TestBadScenarios(t *testing.T) {
	base := `name: x
duration: 1m
regions: [a, b]
rule: { limit: 10, window: 1s }
traffic: [{ region: a, kind: steady, rate: 1 }]
`
	cases := []struct {
		name, yaml, field string
	}{
		{"unknown field", base + "colour: blue\n", "colour"},
		{"no name", strings.Replace(base, "name: x", "name: ''", 1), "name"},
		{"one region", strings.Replace(base, "[a, b]", "[a]", 1), "regions"},
		{"region twice", strings.Replace(base, "[a, b]", "[a, a]", 1), "regions[1]"},
		{"region with a dot", strings.Replace(base, "[a, b]", "[a, b.c]", 1), "regions[1]"},
		{"no duration", strings.Replace(base, "1m\n", "0s\n", 1), "duration"},
		{"zero limit", strings.Replace(base, "limit: 10", "limit: 0", 1), "rule.limit"},
		{"short window", strings.Replace(base, "window: 1s", "window: 10ms", 1), "rule.window"},
		{"bad algorithm", strings.Replace(base, "window: 1s }", "window: 1s, algorithm: token_bucket }", 1), "rule.algorithm"},
		{"bad fallback", strings.Replace(base, "window: 1s }", "window: 1s, fallback: maybe }", 1), "rule.fallback"},
		{"unknown traffic region", strings.Replace(base, "region: a,", "region: z,", 1), "traffic[0].region"},
		{"negative rate", strings.Replace(base, "rate: 1", "rate: -1", 1), "traffic[0].rate"},
		{"too many keys", strings.Replace(base, "rate: 1", "rate: 1, keys: 1000001", 1), "traffic[0].keys"},
		{"zipf at 1", strings.Replace(base, "rate: 1", "rate: 1, keys: 10, zipf: 1", 1), "traffic[0].zipf"},
		{"unknown kind", strings.Replace(base, "steady", "wavy", 1), "traffic[0].kind"},
		{"shift nowhere", strings.Replace(base, "steady", "shift", 1), "traffic[0].to"},
		{"diurnal without period", strings.Replace(base, "steady", "diurnal", 1), "traffic[0].period"},
		{"no traffic", strings.Replace(base, "traffic: [{ region: a, kind: steady, rate: 1 }]", "traffic: []", 1), "traffic"},
		{"bad mode", base + "modes: [lenient]\n", "modes[0]"},
		{"skew of an unknown region", base + "clock_skew: { z: 1s }\n", "clock_skew"},
		{"latency below the step", base + "network: { latency: { min: 500us, max: 1ms } }\n", "network.latency"},
		{"step not dividing 100ms", base + "step: 30ms\n", "step"},
		{"loss of 1", base + "network: { loss: 1 }\n", "network.loss"},
		{"reserve above 1", base + "budget: { reserve: 1.5 }\n", "budget.reserve"},
		{"fault after the end", base + "faults: [{ at: 2m, kind: heal }]\n", "faults[0].at"},
		{"partition of nobody", base + "faults: [{ at: 1s, kind: partition }]\n", "faults[0].regions"},
		{"region in two groups", base + "faults: [{ at: 1s, kind: split, groups: [[a], [a, b]] }]\n", "faults[0].groups[1][0]"},
		{"redis-down for no time", base + "faults: [{ at: 1s, kind: redis-down, region: a }]\n", "faults[0].for"},
		{"clock jump of nothing", base + "faults: [{ at: 1s, kind: clock-jump, region: a }]\n", "faults[0].by"},
		{"unknown fault", base + "faults: [{ at: 1s, kind: meteor }]\n", "faults[0].kind"},
	}
	if _, err := Parse("base.yaml", []byte(base)); err != nil {
		t.Fatalf("the base scenario: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(c.yaml))
			if err == nil || !errors.Is(err, ErrInvalidScenario) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("error %v: want ErrInvalidScenario naming %q", err, c.field)
			}
		})
	}
	if _, err := Load("no-such-scenario"); err == nil || !strings.Contains(err.Error(), "no scenario") {
		t.Fatalf("unknown scenario: %v", err)
	}
	sc, _ := Parse("base.yaml", []byte(base))
	if _, err := Run(sc, "lenient", 1, Options{}); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Fatalf("bad mode: %v", err)
	}
}

// TestAccuracy runs the accuracy study small: the counter and the log
// agree on keys that stay under their limit, differ on some requests of
// the others, and admit about as much in all.
func TestAccuracy(t *testing.T) {
	light, err := Accuracy(1, AccuracyOptions{Keys: 200, MinRate: 0.01, MaxRate: 0.2, Duration: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	heavy, err := Accuracy(1, AccuracyOptions{Keys: 200, Duration: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if light.Requests == 0 || heavy.Requests <= light.Requests {
		t.Fatalf("requests: light %d, heavy %d", light.Requests, heavy.Requests)
	}
	if heavy.OverLimitKeys <= light.OverLimitKeys || heavy.WronglyAllowed+heavy.WronglyDenied == 0 {
		t.Fatalf("heavy traffic: %d keys over, %d wrongly allowed, %d wrongly denied: want more keys over and some disagreement",
			heavy.OverLimitKeys, heavy.WronglyAllowed, heavy.WronglyDenied)
	}
	if light.WronglyAllowedPct()+light.WronglyDeniedPct() >= heavy.WronglyAllowedPct()+heavy.WronglyDeniedPct() {
		t.Errorf("light traffic disagrees more (%v%%) than heavy (%v%%)", light.WronglyAllowedPct()+light.WronglyDeniedPct(),
			heavy.WronglyAllowedPct()+heavy.WronglyDeniedPct())
	}
	if d := float64(heavy.AllowedByCounter-heavy.AllowedByLog) / float64(heavy.AllowedByLog); d < -0.05 || d > 0.05 {
		t.Errorf("the counter admitted %d, the log %d: want within 5%%", heavy.AllowedByCounter, heavy.AllowedByLog)
	}
	again, _ := Accuracy(1, AccuracyOptions{Keys: 200, Duration: 3 * time.Minute})
	if *again != *heavy {
		t.Errorf("the same seed gave %+v, then %+v", heavy, again)
	}
	if _, err := Accuracy(1, AccuracyOptions{Keys: MaxKeys + 1}); err == nil {
		t.Error("more keys than MaxKeys: want an error")
	}
}

// TestTrafficFollowsItsRate: every traffic model sends what its rate
// says, to within Poisson noise, including sources at rate 0 (none) and
// flash crowds on a near-silent base.
func TestTrafficFollowsItsRate(t *testing.T) {
	sc, err := Parse("traffic.yaml", []byte(`name: traffic
duration: 2m
regions: [a, b, c, d]
rule: { limit: 1000000, window: 1m }
modes: [strict]
traffic:
  - { region: a, kind: steady, rate: 200 }
  - { region: b, kind: shift, to: c, at: 30s, over: 20s, rate: 100 }
  - { region: d, kind: flash, rate: 0.01, peak: 500, at: 60s, for: 20s }
  - { region: a, kind: diurnal, rate: 50, amplitude: 1, period: 2m }
`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(sc, "strict", 3, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sent := make([]float64, len(rep.Regions))
	for _, w := range rep.Windows {
		for i, n := range w.ByRegion {
			sent[i] += float64(n)
		}
	}
	// Everything is admitted (the limit is far above): what each region
	// admitted is what it was sent.
	want := []float64{
		200*120 + 50*120,  // a: steady, and a whole period of diurnal
		100 * (30 + 10),   // b: until the shift, and half the ramp
		100 * (10 + 70),   // c: half the ramp, and after
		500*20 + 0.01*100, // d: the crowd, and almost nothing else
	}
	for i, w := range want {
		if math.Abs(sent[i]-w) > 4*math.Sqrt(w)+2 {
			t.Errorf("region %s sent %.0f, want about %.0f", rep.Regions[i], sent[i], w)
		}
	}
}

// TestRunsTheDaemonsCode: the simulator links the protocols the daemons
// run (transport/gossip, budget/coord) and none of the servers' libraries:
// its own code is time, network, faults, traffic and reports.
func TestRunsTheDaemonsCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	for _, want := range []string{"github.com/geoquota/geoquota/transport/gossip", "github.com/geoquota/geoquota/budget/coord"} {
		if !slices.Contains(deps, want) {
			t.Errorf("sim does not run %s", want)
		}
	}
	for _, d := range deps {
		for _, banned := range []string{"github.com/nats-io/", "google.golang.org/grpc", "github.com/envoyproxy/go-control-plane", "github.com/prometheus/client_golang"} {
			if strings.HasPrefix(d, banned) {
				t.Errorf("sim depends on %s", d)
			}
		}
	}
}

// TestTenantsGetTheirLimit runs the tenants scenario scaled down (500
// tenants, 6,000 requests a second, three minutes): every tenant asked
// for more than its limit in a full window, the first included, gets at
// least 97% of it, wherever its traffic is; in strict mode none more, in
// elastic mode at most 2% more once settled (the busiest asks 18 times
// its limit).
func TestTenantsGetTheirLimit(t *testing.T) {
	sc, err := Load("tenants")
	if err != nil {
		t.Fatal(err)
	}
	sc.Duration = 3 * time.Minute
	sc.Rule.Limit = 3600
	sc.Traffic[0].Keys, sc.Traffic[0].Rate = 500, 6000
	if sc.Expect.SettledElasticOver == nil || *sc.Expect.SettledElasticOver > 2 {
		t.Fatalf("the tenants scenario expects elastic mode within %v%% once settled, want 2%%", sc.Expect.SettledElasticOver)
	}
	for _, mode := range []string{"strict", "elastic"} {
		t.Run(mode, func(t *testing.T) {
			rep, err := Run(sc, mode, 1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkGuarantees(t, sc, rep)
			for _, w := range rep.Windows {
				if w.Full && w.Start >= sc.Expect.UtilizationFrom && w.Tenants.Count < 5 {
					t.Errorf("window %s: %d tenants asked for more than their limit, want a few more to check", clockString(w.Start), w.Tenants.Count)
				}
			}
			if t.Failed() {
				var b strings.Builder
				rep.WriteText(&b)
				t.Log(b.String())
			}
		})
	}
}

// TestFreeTierTenantsGetTheirLimit: the tenants-free scenario (a free
// tier: many tenants, a small limit each, homed in the regions), scaled
// down to 5,000 tenants and 30,000 requests a second for the test run, and
// tenants-million (ten regions) to 10,000 tenants: well over a hundred
// tenants ask for more than their limit in every window, and in strict
// mode, from the first full window on, they get at least 95% of it (one
// in twenty, p5: at least 95%; the median at least 98%), none more.
func TestFreeTierTenantsGetTheirLimit(t *testing.T) {
	for _, tc := range []struct {
		scenario     string
		keys, shards int
	}{{"tenants-free", 5000, 1}, {"tenants-million", 10_000, 4}} {
		t.Run(tc.scenario, func(t *testing.T) {
			t.Parallel()
			freeTier(t, tc.scenario, tc.keys, tc.shards)
		})
	}
}

// freeTier plays a free tier's scenario with fewer tenants and requests,
// globalsync as shards instances (the million tenants' with four: each
// leads a slice of the counters, as globalsync shards when one instance
// is not enough).
func freeTier(t *testing.T, scenario string, keys, shards int) {
	sc, err := Load(scenario)
	if err != nil {
		t.Fatal(err)
	}
	sc.Traffic[0].Keys, sc.Traffic[0].Rate = keys, 30000
	sc.GlobalSync.Shards = shards
	rep, err := Run(sc, "strict", 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkGuarantees(t, sc, rep)
	for _, w := range rep.Windows {
		if !w.Full {
			continue
		}
		u := w.Tenants
		if u.Count < 100 {
			t.Errorf("window %s: %d tenants asked for more than their limit, want more to check", clockString(w.Start), u.Count)
		}
		if u.P5 < 0.95 || u.P50 < 0.98 {
			t.Errorf("window %s: tenants over their limit admitted p5 %.1f%%, median %.1f%% of it; want 95%% and 98%%", clockString(w.Start), 100*u.P5, 100*u.P50)
		}
	}
	if shards > 1 {
		if len(rep.Shards) != shards {
			t.Errorf("%d instances' figures, want %d", len(rep.Shards), shards)
		}
		for i, sh := range rep.Shards {
			if sh.Budgets == 0 || sh.Copied == 0 {
				t.Errorf("instance %d: %d budgets of their own, %d counter windows in its copy; want some of each", i, sh.Budgets, sh.Copied)
			}
		}
	}
	if t.Failed() {
		var b strings.Builder
		rep.WriteText(&b)
		t.Log(b.String())
	}
}

// Reservations through a region's store failing and a clock jumping past
// their end: what is not settled stays counted, and the run goes on.
func TestReservationsThroughFaults(t *testing.T) {
	for _, fault := range []string{"{ at: 10s, kind: redis-down, region: us, for: 5s }", "{ at: 10s, kind: clock-jump, region: us, by: 5m }"} {
		sc, err := Parse("faults", []byte(`
name: faults
duration: 40s
regions: [us, eu]
rule: { limit: 100000, window: 1m, count_over_limit: true }
traffic:
  - { kind: tenants, rate: 100, keys: 100, zipf: 1.1, home: 0.8,
      tokens: { median: 200, sigma: 1.0, max: 4000, per_second: 50, reserve: 1000 } }
faults:
  - `+fault+`
`))
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range sc.Modes {
			rep, err := Run(sc, mode, 1, Options{})
			if err != nil || rep.Admitted == 0 {
				t.Fatalf("%s, %s: %v, %d admitted", fault, mode, err, rep.Admitted)
			}
		}
	}
}
