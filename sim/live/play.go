package live

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/sim"
)

// Faults are the faults a deployment can play: its links'.
var Faults = []string{"partition", "split", "heal"}

// Fit restricts a scenario to a deployment's regions (its i-th region
// plays as regions[i]) and scales it down: its time so that a window
// lasts window (never up), and its traffic to at most rate requests a
// second in all, the limit with it (0: the scenario's rates). It returns
// the scenario fitted and the two factors it was scaled down by, and
// refuses a scenario with a fault the deployment cannot play.
func Fit(base *sim.Scenario, regions []string, window time.Duration, rate float64) (sc *sim.Scenario, timeScale, rateScale float64, err error) {
	if sc, err = sim.Restrict(base, regions); err != nil {
		return nil, 0, 0, err
	}
	timeScale, rateScale = max(1, float64(sc.Rule.Window)/float64(window)), 1.0
	if sc, err = sim.Scale(sc, timeScale); err != nil {
		return nil, 0, 0, err
	}
	if total := sc.Rate(); rate > 0 && rate < total {
		rateScale = rate / total
		if sc, err = sim.ScaleRate(sc, rateScale); err != nil {
			return nil, 0, 0, err
		}
	}
	for _, f := range sc.Faults {
		if !slices.Contains(Faults, f.Kind) {
			return nil, 0, 0, fmt.Errorf("scenario %s: fault %s at %v is not played live (only %s are)", sc.Name, f.Kind, f.At, strings.Join(Faults, ", "))
		}
	}
	return sc, timeScale, rateScale, nil
}

// Run is one mode of a scenario to play against a deployment.
type Run struct {
	// Deployment lists the deployment's endpoints, rules files and admin
	// token; Links are its links between regions.
	Deployment harness.DeploymentState
	Links      Links
	// Scenario is fitted to the deployment (Fit); Mode is strict or
	// elastic.
	Scenario *sim.Scenario
	Mode     string
	// Simulated is the simulator's run of the same scenario, mode and
	// seed: the links get the latencies it drew, and the live report its
	// regions and bounds.
	Simulated *sim.Report
	// Seed draws the requests (sim.Arrivals), as it did the simulator's.
	Seed uint64
	// Concurrency bounds the requests in flight; 0 means 256.
	Concurrency int
	// Books is how long to wait, after the traffic, for the leading
	// globalsync to close the books of the run's windows, to report what
	// it found over-admitted; 0 reads nothing from globalsync.
	Books time.Duration
	// Log receives what the run does, a line at a time; nil discards it.
	Log io.Writer
}

// player is one mode of a scenario being played against a deployment.
type player struct {
	Run
	st     harness.DeploymentState
	sc     *sim.Scenario
	rule   string
	prefix string // of every key of this run, so that runs do not share counters
	t0     time.Time
	client *http.Client

	measuring sync.WaitGroup // convergence after each heal

	mu      sync.Mutex
	windows map[int64]*window // by window start, ms since t0
	errors  int64
	notes   []sim.Note
	heals   []sim.Heal
	samples []sim.Sample
}

// window is what the clients saw of one window.
type window struct {
	requests []int64 // by region
	admitted []int64
	key0     []int64           // admitted of the busiest key (k0), by region
	byKey    map[int]*[2]int64 // admitted, denied
}

// Play plays one mode of a scenario against a deployment: the rule in
// force everywhere, the links' latency as the simulator drew it, the
// requests at their times, the faults at theirs; then it puts the rules
// files back as they were, heals every link and takes the latencies it
// set off. It returns what the clients saw, as a report in the
// simulator's form.
func Play(ctx context.Context, r Run) (*sim.Report, error) {
	if r.Concurrency <= 0 {
		r.Concurrency = 256
	}
	if r.Log == nil {
		r.Log = io.Discard
	}
	run := &player{Run: r, st: r.Deployment, sc: r.Scenario, rule: "sim-live-" + r.Mode, prefix: fmt.Sprintf("simlive-%d-", time.Now().UnixNano()),
		client:  &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: r.Concurrency}},
		windows: map[int64]*window{}}
	defer run.client.CloseIdleConnections()
	sc := run.sc
	restore, err := run.putRule(r.Mode)
	if err != nil {
		return nil, err
	}
	defer restore()
	for _, l := range r.Simulated.Links {
		if err := r.Links.SetLatency(l.A, l.B, l.Latency); err != nil {
			return nil, err
		}
	}
	defer func() {
		r.Links.Heal()
		for _, l := range r.Simulated.Links {
			r.Links.SetLatency(l.A, l.B, 0)
		}
	}()
	if err := run.waitRuleEverywhere(ctx); err != nil {
		return nil, err
	}
	// Start on a window boundary, as the simulator's time 0 is.
	w := sc.Rule.Window
	run.t0 = windowStart(time.Now().Add(time.Second), w).Add(w)
	fmt.Fprintf(r.Log, "sim live: %s, %s mode: %v of traffic from %s (window %v, limit %d)\n",
		sc.Name, r.Mode, sc.Duration, run.t0.Format(time.TimeOnly), w, sc.Rule.Limit)
	if err := sleepUntil(ctx, run.t0); err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() { run.faults(ctx) })
	wg.Go(func() { run.sampleShares(ctx) })
	run.requests(ctx, sim.Arrivals(sc, r.Seed))
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep := run.report()
	if r.Books > 0 {
		rep.Found, rep.BooksClosed = run.books(ctx)
	}
	return rep, nil
}

// books waits (at most Books) until the lead globalsync has closed the
// books of every window of the run, and returns the over-admission it
// found in them and when its books were closed, as time since the start.
func (run *player) books(ctx context.Context) ([]sim.OverAdmission, time.Duration) {
	end := run.t0.Add(run.sc.Duration)
	deadline := time.Now().Add(run.Books)
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
		fmt.Fprintln(run.Log, "sim live: no globalsync leads: over-admission found by globalsync not reported")
		return nil, 0
	}
	var all []coord.OverAdmission
	if err := run.getJSON(ctx, "http://"+leader+"/v1/over-admissions", &all); err != nil {
		fmt.Fprintf(run.Log, "sim live: over-admissions: %v\n", err)
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

func (run *player) getJSON(ctx context.Context, url string, v any) error {
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
func (run *player) putRule(mode string) (func(), error) {
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
func (run *player) waitRuleEverywhere(ctx context.Context) error {
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
func (run *player) usage(ctx context.Context, addr string, key int) (usageView, error) {
	return run.usageOf(ctx, addr, key, time.Time{})
}

// usageOf asks a regiond for its view of a key in the window that
// contains at (zero: the current window).
func (run *player) usageOf(ctx context.Context, addr string, key int, at time.Time) (usageView, error) {
	var v usageView
	q := url.Values{"rule": {run.rule}, "api_key": {run.key(key)}}
	if !at.IsZero() {
		q.Set("window_start", at.UTC().Format(time.RFC3339Nano))
	}
	err := run.getJSON(ctx, "http://"+addr+"/v1/usage?"+q.Encode(), &v)
	return v, err
}

func (run *player) key(k int) string { return run.prefix + sim.KeyName(k) }

// requests sends every arrival at its time to a replica of its region,
// round robin, at most Concurrency at once.
func (run *player) requests(ctx context.Context, arrivals []sim.Arrival) {
	sem := make(chan struct{}, run.Concurrency)
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
func (run *player) check(ctx context.Context, addr string, a sim.Arrival) {
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

func (run *player) failed() {
	run.mu.Lock()
	run.errors++
	run.mu.Unlock()
}

func (run *player) record(start int64, a sim.Arrival, allowed bool) {
	run.mu.Lock()
	defer run.mu.Unlock()
	win := run.windows[start]
	if win == nil {
		n := len(run.st.Regions)
		win = &window{requests: make([]int64, n), admitted: make([]int64, n), key0: make([]int64, n), byKey: map[int]*[2]int64{}}
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
func (run *player) admittedNow(t time.Duration) map[time.Duration][]int64 {
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
func (run *player) faults(ctx context.Context) {
	for _, f := range run.sc.Faults {
		if sleepUntil(ctx, run.t0.Add(f.At)) != nil {
			return
		}
		var err error
		var text string
		switch f.Kind {
		case "partition":
			text = fmt.Sprintf("partition: %s cut off", strings.Join(f.Regions, " "))
			err = run.Links.Partition(f.Regions...)
		case "split":
			var gs []string
			for _, g := range f.Groups {
				gs = append(gs, strings.Join(g, "+"))
			}
			text = "split: " + strings.Join(gs, " | ")
			err = run.Links.Split(f.Groups...)
		case "heal":
			text = "heal"
			err = run.Links.Heal()
		}
		at := time.Since(run.t0)
		if err != nil {
			fmt.Fprintf(run.Log, "sim live: %s at %v: %v\n", f.Kind, f.At, err)
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
func (run *player) convergence(ctx context.Context, healAt time.Duration) time.Duration {
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
func (run *player) sampleShares(ctx context.Context) {
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
func (run *player) shareAt(t time.Duration) []float64 {
	out := make([]float64, len(run.st.Regions))
	for _, smp := range run.samples {
		if smp.At > t {
			break
		}
		out = smp.Shares
	}
	return out
}

// report makes the live run's report, in the simulator's form: the
// tenants over their limit counted by sim.TenantUseOf, as the simulator
// counts its own.
func (run *player) report() *sim.Report {
	run.mu.Lock()
	defer run.mu.Unlock()
	sc, simRep := run.sc, run.Simulated
	rep := &sim.Report{Scenario: sc.Name, Mode: run.Mode, Seed: run.Seed,
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
	rep.Failed = run.errors
	if run.errors > 0 {
		rep.Notes = append(rep.Notes, sim.Note{At: sc.Duration, Text: fmt.Sprintf("%d requests failed (no answer or not 200/429): not counted", run.errors)})
	}
	return rep
}
