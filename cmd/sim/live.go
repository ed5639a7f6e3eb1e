package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/sim"
)

// liveConfig is sim live's flags.
type liveConfig struct {
	scenario    string
	deployment  string
	seed        uint64
	mode        string
	window      time.Duration
	concurrency int
	rate        float64
	out         string
}

func parseLiveFlags(args []string) (liveConfig, error) {
	var c liveConfig
	fs := flag.NewFlagSet("sim live", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.scenario, "scenario", "", "a built-in scenario (sim run -list names them), or a scenario file (.yaml)")
	fs.StringVar(&c.deployment, "deployment", "deploy/local", "the directory of the deployment's state.json (go run ./deploy/local up writes it)")
	fs.Uint64Var(&c.seed, "seed", 1, "the seed of the traffic and of the simulator's run")
	fs.StringVar(&c.mode, "mode", "", "strict or elastic; empty runs every mode the scenario names, one after the other")
	fs.DurationVar(&c.window, "window", 10*time.Second, "the rule's window live: the scenario's time is scaled down by its window over this")
	fs.IntVar(&c.concurrency, "concurrency", 256, "requests in flight at most")
	fs.Float64Var(&c.rate, "rate", 0, "scale the traffic down to at most this many requests a second in all, and the limit with it; 0 plays the scenario's rates")
	fs.StringVar(&c.out, "out", "", "write both reports' files (CSV, SVG charts, HTML) under this directory, in MODE/simulated and MODE/live; empty writes none")
	if err := fs.Parse(args); err != nil {
		return c, usageError(fs, err)
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.scenario == "":
		return c, errors.New("-scenario: missing (sim run -list names them)")
	case c.mode != "" && c.mode != "strict" && c.mode != "elastic":
		return c, fmt.Errorf("-mode %q: want strict or elastic", c.mode)
	case c.window < time.Second || c.window%time.Second != 0:
		return c, fmt.Errorf("-window %v: want a whole number of seconds, at least 1s", c.window)
	case c.concurrency < 1:
		return c, fmt.Errorf("-concurrency %d: want at least 1", c.concurrency)
	case !(c.rate >= 0) || math.IsInf(c.rate, 0):
		return c, fmt.Errorf("-rate %v: want 0 or more requests a second", c.rate)
	}
	return c, nil
}

// liveFaults are the faults a deployment can play: its links'.
var liveFaults = []string{"partition", "split", "heal"}

// runLive plays a scenario against a running deployment in real time,
// mode by mode: the scenario restricted to the deployment's regions and
// scaled down to -window, the same scenario in the simulator, and the two
// reports with their figures side by side.
func runLive(ctx context.Context, c liveConfig, stdout, stderr io.Writer) error {
	st, err := harness.ReadState(filepath.Join(c.deployment, "state.json"))
	if err != nil {
		return fmt.Errorf("-deployment %s: %w (start one with: go run ./deploy/local up)", c.deployment, err)
	}
	if _, err := harness.Control(ctx, st.Control, "/v1/state", nil); err != nil {
		return fmt.Errorf("-deployment %s: its supervisor does not answer (%w); is it up?", c.deployment, err)
	}
	names := make([]string, len(st.Regions))
	for i, r := range st.Regions {
		names[i] = r.Name
	}
	base, err := sim.Load(c.scenario)
	if err != nil {
		return err
	}
	sc, err := sim.Restrict(base, names)
	if err != nil {
		return err
	}
	timeScale, rateScale := max(1, float64(sc.Rule.Window)/float64(c.window)), 1.0
	if sc, err = sim.Scale(sc, timeScale); err != nil {
		return err
	}
	if total := sc.Rate(); c.rate > 0 && c.rate < total {
		rateScale = c.rate / total
		if sc, err = sim.ScaleRate(sc, rateScale); err != nil {
			return err
		}
	}
	for _, f := range sc.Faults {
		if !slices.Contains(liveFaults, f.Kind) {
			return fmt.Errorf("scenario %s: fault %s at %v is not played live (only %s are)", sc.Name, f.Kind, f.At, strings.Join(liveFaults, ", "))
		}
	}
	if sc.Network.Jitter > 0 || sc.Network.Loss > 0 || len(sc.ClockSkew) > 0 {
		fmt.Fprintf(stderr, "sim live: the scenario's jitter, loss and clock skew are simulated but not played live\n")
	}
	modes := sc.Modes
	if c.mode != "" {
		modes = []string{c.mode}
	}
	desc := liveDescription(c.deployment, names, base, sc, timeScale, rateScale)
	for _, mode := range modes {
		simRep, err := sim.Run(sc, mode, c.seed, sim.Options{})
		if err != nil {
			return err
		}
		simRep.Description = desc + "\n(simulated)"
		start := time.Now()
		liveRep, err := playLive(ctx, c, st, sc, mode, simRep, stderr)
		if err != nil {
			return err
		}
		liveRep.Description = desc + "\n(played live)"
		fmt.Fprintf(stderr, "sim live: %s, %s mode: %v of wall time\n", sc.Name, mode, time.Since(start).Round(100*time.Millisecond))
		fmt.Fprintln(stdout, "== simulated")
		simRep.WriteText(stdout)
		fmt.Fprintln(stdout, "\n== live")
		liveRep.WriteText(stdout)
		fmt.Fprintln(stdout)
		writeComparison(stdout, simRep, liveRep)
		fmt.Fprintln(stdout)
		if c.out != "" {
			for name, rep := range map[string]*sim.Report{"simulated": simRep, "live": liveRep} {
				if err := rep.WriteFiles(filepath.Join(c.out, mode, name)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// liveDescription says what a live run plays, from the deployment's
// regions and the scenario as restricted to them and scaled (sc): where,
// on which regions, for how long, the faults at their times, and how the
// scenario was shrunk. The scenario's own description tells of its own
// regions, size and times, which a live run seldom keeps.
func liveDescription(deployment string, regions []string, base, sc *sim.Scenario, timeScale, rateScale float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, played on the deployment in %s: %d regions (%s), for %v", sc.Name, deployment, len(regions), strings.Join(regions, " "), sc.Duration)
	if len(base.Regions) > len(regions) {
		fmt.Fprintf(&b, "\nthe scenario's regions %s left out (it has %d)", strings.Join(base.Regions[len(regions):], " "), len(base.Regions))
	}
	if len(regions) > len(sc.Regions) {
		fmt.Fprintf(&b, "\nno traffic to %s (the scenario has %d regions)", strings.Join(regions[len(sc.Regions):], " "), len(sc.Regions))
	}
	var faults []string
	for _, f := range sc.Faults {
		var what string
		switch f.Kind {
		case "partition":
			what = strings.Join(f.Regions, " ") + " cut off"
		case "split":
			var gs []string
			for _, g := range f.Groups {
				gs = append(gs, strings.Join(g, "+"))
			}
			what = "split " + strings.Join(gs, " | ")
		default:
			what = f.Kind
		}
		faults = append(faults, fmt.Sprintf("%s at %s", what, clock(f.At)))
	}
	if len(faults) == 0 {
		faults = []string{"none"}
	}
	fmt.Fprintf(&b, "\nfaults: %s", strings.Join(faults, ", "))
	fmt.Fprintf(&b, "\ntraffic at most %.0f requests/s", sc.Rate())
	var scaled []string
	if timeScale != 1 {
		scaled = append(scaled, fmt.Sprintf("time scaled down %gx", timeScale))
	}
	if rateScale != 1 {
		scaled = append(scaled, fmt.Sprintf("traffic scaled down %.3gx (-rate)", 1/rateScale))
	}
	if len(scaled) > 0 {
		fmt.Fprintf(&b, "; %s: window %v, limit %d (the scenario's %v, %d)", strings.Join(scaled, ", "), sc.Rule.Window, sc.Rule.Limit, base.Rule.Window, base.Rule.Limit)
	}
	return b.String()
}

// clock writes a time since a run's start as m:ss, as the reports do.
func clock(d time.Duration) string {
	sec := float64(d%time.Minute) / float64(time.Second)
	if d%time.Second == 0 {
		return fmt.Sprintf("%d:%02.0f", d/time.Minute, sec)
	}
	return fmt.Sprintf("%d:%04.1f", d/time.Minute, sec)
}

// writeComparison prints the simulated and the live figures side by side.
func writeComparison(w io.Writer, s, l *sim.Report) {
	fmt.Fprintf(w, "== simulated vs live (%s, %s mode)\n", s.Scenario, s.Mode)
	row := func(name, a, b string) { fmt.Fprintf(w, "%-34s %12s %12s\n", name, a, b) }
	row("", "simulated", "live")
	pctRow := func(name string, a, b float64) { row(name, fmt.Sprintf("%.2f%%", a), fmt.Sprintf("%.2f%%", b)) }
	so, lo := s.WorstOverPct(), l.WorstOverPct()
	pctRow("over-admission, worst window", so, lo)
	pctRow("admitted of requests", pctOf(s.Admitted, s.Requests), pctOf(l.Admitted, l.Requests))
	pctRow("false rejections", pctOf(s.FalseRejected, s.Requests), pctOf(l.FalseRejected, l.Requests))
	row("requests", fmt.Sprint(s.Requests), fmt.Sprint(l.Requests))
	for i := range max(len(s.Heals), len(l.Heals)) {
		conv := func(hs []sim.Heal) string {
			switch {
			case i >= len(hs):
				return "-"
			case hs[i].Converged < 0:
				return "not measured"
			}
			return hs[i].Converged.Round(time.Millisecond).String()
		}
		row(fmt.Sprintf("convergence after heal %d", i+1), conv(s.Heals), conv(l.Heals))
	}
	verdict := "agree"
	if math.Abs(so-lo) > 1 {
		verdict = "DISAGREE"
	}
	fmt.Fprintf(w, "over-admission: simulated and live %s within 1 percentage point (differ by %.2f)\n", verdict, math.Abs(so-lo))
}

func pctOf(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// liveRun is one mode of a scenario played against a deployment.
type liveRun struct {
	c      liveConfig
	st     harness.DeploymentState
	sc     *sim.Scenario
	rule   string
	prefix string // of every key of this run, so that runs do not share counters
	t0     time.Time
	client *http.Client
	stderr io.Writer

	measuring sync.WaitGroup // convergence after each heal

	mu      sync.Mutex
	windows map[int64]*liveWindow // by window start, ms since t0
	errors  int64
	notes   []sim.Note
	heals   []sim.Heal
	samples []sim.Sample
}

// liveWindow is what the clients saw of one window.
type liveWindow struct {
	requests []int64 // by region
	admitted []int64
	key0     []int64           // admitted of the busiest key (k0), by region
	byKey    map[int]*[2]int64 // admitted, denied
}

// playLive runs one mode: the rule in force everywhere, the links' latency
// as the simulator drew it, the requests at their times, the faults at
// theirs; then it puts the rules files back as they were, heals every link
// and takes the latencies it set off.
func playLive(ctx context.Context, c liveConfig, st harness.DeploymentState, sc *sim.Scenario, mode string, simRep *sim.Report, stderr io.Writer) (*sim.Report, error) {
	run := &liveRun{c: c, st: st, sc: sc, rule: "sim-live-" + mode, prefix: fmt.Sprintf("simlive-%d-", time.Now().UnixNano()),
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c.concurrency}},
		stderr: stderr, windows: map[int64]*liveWindow{}}
	defer run.client.CloseIdleConnections()
	restore, err := run.putRule(ctx, mode)
	if err != nil {
		return nil, err
	}
	defer restore()
	for _, l := range simRep.Links {
		if _, err := harness.Control(ctx, st.Control, "/v1/latency", map[string]any{"a": l.A, "b": l.B, "latency_ms": float64(l.Latency) / float64(time.Millisecond)}); err != nil {
			return nil, err
		}
	}
	defer func() {
		bg := context.Background()
		harness.Control(bg, st.Control, "/v1/heal", nil)
		for _, l := range simRep.Links {
			harness.Control(bg, st.Control, "/v1/latency", map[string]any{"a": l.A, "b": l.B, "latency_ms": 0})
		}
	}()
	if err := run.waitRuleEverywhere(ctx); err != nil {
		return nil, err
	}
	// Start on a window boundary, as the simulator's time 0 is.
	w := sc.Rule.Window
	run.t0 = windowStart(time.Now().Add(time.Second), w).Add(w)
	fmt.Fprintf(stderr, "sim live: %s, %s mode: %v of traffic from %s (window %v, limit %d)\n",
		sc.Name, mode, sc.Duration, run.t0.Format(time.TimeOnly), w, sc.Rule.Limit)
	if err := sleepUntil(ctx, run.t0); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { run.faults(ctx) })
	wg.Go(func() { run.sampleShares(ctx) })
	run.requests(ctx, sim.Arrivals(sc, c.seed))
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep := run.report(mode, simRep)
	rep.Found, rep.BooksClosed = run.books(ctx)
	return rep, nil
}

// books waits (a bounded while) until the lead globalsync has closed the
// books of every window of the run, and returns the over-admission it
// found in them and when its books were closed, as time since the start.
func (run *liveRun) books(ctx context.Context) ([]sim.OverAdmission, time.Duration) {
	end := run.t0.Add(run.sc.Duration)
	deadline := time.Now().Add(40 * time.Second) // settling takes anti-entropy + 2 rebalances, checked every half anti-entropy
	var leader string
	var closed time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		for _, gs := range run.st.GlobalSyncs {
			var d struct {
				Leader        bool  `json:"leader"`
				BooksClosedMS int64 `json:"books_closed_ms"`
			}
			if run.getJSON(ctx, "http://"+gs.HTTP+"/v1/dashboard", &d) == nil && d.Leader {
				leader, closed = gs.HTTP, time.UnixMilli(d.BooksClosedMS)
			}
		}
		if leader != "" && !closed.Before(end) {
			break
		}
		sleepUntil(ctx, time.Now().Add(250*time.Millisecond))
	}
	if leader == "" {
		fmt.Fprintln(run.stderr, "sim live: no globalsync leads: over-admission found by globalsync not reported")
		return nil, 0
	}
	var all []coord.OverAdmission
	if err := run.getJSON(ctx, "http://"+leader+"/v1/over-admissions", &all); err != nil {
		fmt.Fprintf(run.stderr, "sim live: over-admissions: %v\n", err)
		return nil, 0
	}
	var found []sim.OverAdmission
	for _, oa := range all {
		// This run's: its rule, in its windows (globalsync hashes the
		// keys unless --key-redaction none, so their prefix cannot tell).
		if oa.Rule == run.rule && !oa.WindowStart.Before(run.t0) && (strings.Contains(oa.Key, run.prefix) || strings.HasPrefix(oa.Key, "sha256:")) {
			found = append(found, sim.OverAdmission{Key: oa.Key, Region: oa.Region, WindowStart: oa.WindowStart.Sub(run.t0), Amount: oa.Amount})
		}
	}
	return found, max(0, closed.Sub(run.t0))
}

func (run *liveRun) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if run.st.AdminToken != "" {
		// globalsync's reads need it (deploy/local up sets one).
		req.Header.Set("Authorization", "Bearer "+run.st.AdminToken)
	}
	resp, err := run.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// windowStart is the start of the window of length w that holds t:
// windows are aligned to multiples of w since the Unix epoch, as the
// regions align them (time.Truncate aligns to year 1).
func windowStart(t time.Time, w time.Duration) time.Time {
	ms := w.Milliseconds()
	return time.UnixMilli(t.UnixMilli() / ms * ms)
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// putRule adds the scenario's rule to the rules of every regiond and of
// globalsync, and returns what puts the files back as they were.
func (run *liveRun) putRule(ctx context.Context, mode string) (func(), error) {
	r := run.sc.Rule
	fallback := ""
	if r.Fallback != "" {
		fallback = ", fallback: " + r.Fallback
	}
	rule := fmt.Sprintf("  - { id: %s, match: { api_key: %q }, by: [api_key], scope: global, mode: %s, algorithm: %s, limit: %d, window: %s%s, carry_debt: %v }\n",
		run.rule, run.prefix+"*", mode, r.Algorithm, r.Limit, r.Window, fallback, r.CarryDebt)
	var restores []func()
	restore := func() {
		for _, f := range restores {
			f()
		}
	}
	for _, path := range []string{run.st.Rules, run.st.GlobalSyncRules} {
		old, err := os.ReadFile(path)
		if err != nil {
			restore()
			return nil, err
		}
		added, err := withRule(old, rule)
		if err != nil {
			restore()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := harness.WriteFileAtomic(path, added); err != nil {
			restore()
			return nil, err
		}
		restores = append(restores, func() { harness.WriteFileAtomic(path, old) })
	}
	return restore, nil
}

// withRule adds a rule to a rules file's rules: list, written in flow
// style on one line right after "rules:".
func withRule(rules []byte, rule string) ([]byte, error) {
	i := bytes.Index(rules, []byte("\nrules:\n"))
	if bytes.HasPrefix(rules, []byte("rules:\n")) {
		i = -1
	} else if i < 0 {
		return nil, errors.New(`no "rules:" list at the start of a line to add the scenario's rule to`)
	}
	at := i + len("\nrules:\n")
	out := append(slices.Clone(rules[:at]), rule...)
	return append(out, rules[at:]...), nil
}

// waitRuleEverywhere waits until every replica knows the scenario's rule.
func (run *liveRun) waitRuleEverywhere(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, r := range run.st.Regions {
		for _, rep := range r.Replicas {
			for {
				if _, err := run.usage(ctx, rep.HTTP, 0); err == nil {
					break
				} else if ctx.Err() != nil {
					return fmt.Errorf("regiond %s did not put the scenario's rule in force within 30s: %w", rep.Name, err)
				}
				if err := sleepUntil(ctx, time.Now().Add(50*time.Millisecond)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

type usageView struct {
	WindowStart time.Time `json:"window_start"`
	Regions     []struct {
		Region string  `json:"region"`
		Used   int64   `json:"used"`
		Share  float64 `json:"share"`
	} `json:"regions"`
}

// usage asks a regiond for its view of a key of the scenario's rule.
func (run *liveRun) usage(ctx context.Context, addr string, key int) (usageView, error) {
	return run.usageOf(ctx, addr, key, time.Time{})
}

// usageOf asks a regiond for its view of a key in the window that
// contains at (zero: the current window).
func (run *liveRun) usageOf(ctx context.Context, addr string, key int, at time.Time) (usageView, error) {
	var v usageView
	q := url.Values{"rule": {run.rule}, "api_key": {run.key(key)}}
	if !at.IsZero() {
		q.Set("window_start", at.UTC().Format(time.RFC3339Nano))
	}
	err := run.getJSON(ctx, "http://"+addr+"/v1/usage?"+q.Encode(), &v)
	return v, err
}

func (run *liveRun) key(k int) string { return run.prefix + sim.KeyName(k) }

// requests sends every arrival at its time to a replica of its region,
// round robin, at most -concurrency at once.
func (run *liveRun) requests(ctx context.Context, arrivals []sim.Arrival) {
	sem := make(chan struct{}, run.c.concurrency)
	var wg sync.WaitGroup
	next := make([]int, len(run.st.Regions))
	for _, a := range arrivals {
		if sleepUntil(ctx, run.t0.Add(a.At)) != nil {
			break
		}
		reps := run.st.Regions[a.Region].Replicas
		addr := reps[next[a.Region]%len(reps)].HTTP
		next[a.Region]++
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			run.check(ctx, addr, a)
		})
	}
	wg.Wait()
}

// check sends one request and records what it got.
func (run *liveRun) check(ctx context.Context, addr string, a sim.Arrival) {
	sent := time.Now()
	body := fmt.Sprintf(`{"descriptors":{"api_key":%q,"endpoint":"/sim-live"},"cost":1}`, run.key(a.Key))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/check", strings.NewReader(body))
	if err != nil {
		run.failed()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := run.client.Do(req)
	if err != nil {
		run.failed()
		return
	}
	defer resp.Body.Close()
	var d struct {
		Allowed bool   `json:"allowed"`
		ResetAt string `json:"reset_at"`
		Error   struct {
			Details struct {
				ResetAt string `json:"reset_at"`
			} `json:"details"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || (resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests) {
		run.failed()
		return
	}
	reset := d.ResetAt
	if resp.StatusCode == http.StatusTooManyRequests {
		reset = d.Error.Details.ResetAt
	}
	// A fixed window's reset is its end; otherwise, the window the
	// request was sent in.
	w := run.sc.Rule.Window
	start := windowStart(sent, w)
	if t, err := time.Parse(time.RFC3339, reset); err == nil && run.sc.Rule.Algorithm == "fixed_window" {
		start = t.Add(-w)
	}
	run.record(start.Sub(run.t0).Milliseconds(), a, d.Allowed && resp.StatusCode == http.StatusOK)
}

func (run *liveRun) failed() {
	run.mu.Lock()
	run.errors++
	run.mu.Unlock()
}

func (run *liveRun) record(start int64, a sim.Arrival, allowed bool) {
	run.mu.Lock()
	defer run.mu.Unlock()
	win := run.windows[start]
	if win == nil {
		n := len(run.st.Regions)
		win = &liveWindow{requests: make([]int64, n), admitted: make([]int64, n), key0: make([]int64, n), byKey: map[int]*[2]int64{}}
		run.windows[start] = win
	}
	win.requests[a.Region]++
	k := win.byKey[a.Key]
	if k == nil {
		k = new([2]int64)
		win.byKey[a.Key] = k
	}
	if allowed {
		win.admitted[a.Region]++
		if a.Key == 0 {
			win.key0[a.Region]++
		}
		k[0]++
	} else {
		k[1]++
	}
}

// admittedNow returns what each region has admitted of the busiest key
// in each window still kept (it started less than two windows before t),
// as the clients saw it, by window start.
func (run *liveRun) admittedNow(t time.Duration) map[time.Duration][]int64 {
	run.mu.Lock()
	defer run.mu.Unlock()
	out := map[time.Duration][]int64{}
	for s, win := range run.windows {
		start := time.Duration(s) * time.Millisecond
		if start <= t && start+2*run.sc.Rule.Window > t {
			out[start] = slices.Clone(win.key0)
		}
	}
	return out
}

// faults plays the scenario's faults at their times; after a heal it
// measures how long until every region holds what every region had
// admitted of the window in course before it.
func (run *liveRun) faults(ctx context.Context) {
	for _, f := range run.sc.Faults {
		if sleepUntil(ctx, run.t0.Add(f.At)) != nil {
			return
		}
		var err error
		var text string
		switch f.Kind {
		case "partition":
			text = fmt.Sprintf("partition: %s cut off", strings.Join(f.Regions, " "))
			_, err = harness.Control(ctx, run.st.Control, "/v1/partition", map[string]any{"regions": f.Regions})
		case "split":
			var gs []string
			for _, g := range f.Groups {
				gs = append(gs, strings.Join(g, "+"))
			}
			text = "split: " + strings.Join(gs, " | ")
			_, err = harness.Control(ctx, run.st.Control, "/v1/split", map[string]any{"groups": f.Groups})
		case "heal":
			text = "heal"
			_, err = harness.Control(ctx, run.st.Control, "/v1/heal", nil)
		}
		at := time.Since(run.t0)
		if err != nil {
			fmt.Fprintf(run.stderr, "sim live: %s at %v: %v\n", f.Kind, f.At, err)
			text += " (failed: " + err.Error() + ")"
		}
		run.mu.Lock()
		run.notes = append(run.notes, sim.Note{At: at, Text: text})
		run.mu.Unlock()
		if f.Kind == "heal" && err == nil {
			// Measured beside the faults still to come, which keep time.
			run.measuring.Go(func() {
				h := sim.Heal{At: at, Converged: run.convergence(ctx, at)}
				run.mu.Lock()
				run.heals = append(run.heals, h)
				run.mu.Unlock()
			})
		}
	}
	run.measuring.Wait()
}

// convergence polls one replica of each region until every one holds,
// for the busiest key and every window still kept, at least what each
// region had admitted before the heal; -1 if that takes over a minute.
func (run *liveRun) convergence(ctx context.Context, healAt time.Duration) time.Duration {
	want := run.admittedNow(healAt)
	deadline := run.t0.Add(healAt).Add(time.Minute)
	holds := func() bool {
		for _, r := range run.st.Regions {
			for start, counts := range want {
				v, err := run.usageOf(ctx, r.Replicas[0].HTTP, 0, run.t0.Add(start))
				if err != nil {
					return false
				}
				for i, o := range run.st.Regions {
					used := int64(0)
					for _, x := range v.Regions {
						if x.Region == o.Name {
							used = x.Used
						}
					}
					if used < counts[i] {
						return false
					}
				}
			}
		}
		return true
	}
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if holds() {
			return time.Since(run.t0) - healAt
		}
		sleepUntil(ctx, time.Now().Add(10*time.Millisecond))
	}
	return -1
}

// sampleShares asks each region for its share of the limit every half
// second, as the simulator samples it.
func (run *liveRun) sampleShares(ctx context.Context) {
	const every = 500 * time.Millisecond
	for at := time.Duration(0); at < run.sc.Duration; at += every {
		if sleepUntil(ctx, run.t0.Add(at)) != nil {
			return
		}
		smp := sim.Sample{At: at, Shares: make([]float64, len(run.st.Regions)), Leased: make([]bool, len(run.st.Regions))}
		for i, r := range run.st.Regions {
			v, err := run.usage(ctx, r.Replicas[0].HTTP, 0)
			if err != nil {
				continue
			}
			for _, x := range v.Regions {
				if x.Region == r.Name {
					smp.Shares[i] = x.Share
				}
			}
		}
		run.mu.Lock()
		run.samples = append(run.samples, smp)
		run.mu.Unlock()
	}
}

// shareAt returns the shares sampled last before t.
func (run *liveRun) shareAt(t time.Duration) []float64 {
	out := make([]float64, len(run.st.Regions))
	for _, smp := range run.samples {
		if smp.At > t {
			break
		}
		out = smp.Shares
	}
	return out
}

// report makes the live run's report, in the simulator's form (runLive
// gives it its description).
func (run *liveRun) report(mode string, simRep *sim.Report) *sim.Report {
	run.mu.Lock()
	defer run.mu.Unlock()
	sc := run.sc
	rep := &sim.Report{Scenario: sc.Name, Mode: mode, Seed: run.c.seed,
		Regions: simRep.Regions, Limit: sc.Rule.Limit, Window: sc.Rule.Window, Algorithm: sc.Rule.Algorithm, Duration: sc.Duration,
		Gossip: simRep.Gossip, Latency: simRep.Latency, Links: simRep.Links, Notes: run.notes, Samples: run.samples,
		Heals:        slices.SortedFunc(slices.Values(run.heals), func(a, b sim.Heal) int { return cmp.Compare(a.At, b.At) }),
		ElasticBound: simRep.ElasticBound, Live: true, Faults: simRep.Faults}
	starts := make([]int64, 0, len(run.windows))
	for s := range run.windows {
		starts = append(starts, s)
	}
	slices.Sort(starts)
	limit := sc.Rule.Limit
	for _, s := range starts {
		lw := run.windows[s]
		start := time.Duration(s) * time.Millisecond
		win := sim.Window{Start: start, Full: start >= 0 && start+sc.Rule.Window <= sc.Duration,
			ByRegion: lw.admitted, RequestsByRegion: lw.requests, Shares: run.shareAt(start + sc.Rule.Window/2)}
		for _, n := range lw.requests {
			win.Requests += n
		}
		for _, n := range lw.admitted {
			rep.Admitted += n
		}
		win.Tenants = sim.TenantUseOf(limit, func(add func(string, int64, int64)) {
			for key, k := range lw.byKey {
				add(sim.KeyName(key), k[0], k[1])
			}
		})
		for _, k := range lw.byKey {
			adm := k[0]
			if adm > 0 {
				win.Counters++
			}
			win.Admitted = max(win.Admitted, adm)
			if over := adm - limit; over > 0 {
				win.Over = max(win.Over, over)
				win.OverCount++
				win.OverTotal += over
			}
			win.FalseRejected += min(k[1], max(0, limit-adm))
		}
		rep.Requests += win.Requests
		rep.FalseRejected += win.FalseRejected
		rep.Windows = append(rep.Windows, win)
	}
	if run.errors > 0 {
		rep.Notes = append(rep.Notes, sim.Note{At: sc.Duration, Text: fmt.Sprintf("%d requests failed (no answer or not 200/429): not counted", run.errors)})
	}
	return rep
}
