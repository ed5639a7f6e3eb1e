package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/sim"
	"github.com/geoquota/geoquota/sim/live"
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
	sc, timeScale, rateScale, err := live.Fit(base, names, c.window, c.rate)
	if err != nil {
		return err
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
		// Settling the books takes anti-entropy and two rebalances,
		// checked every half anti-entropy.
		liveRep, err := live.Play(ctx, live.Run{Deployment: st, Links: live.Supervisor(st.Control), Scenario: sc, Mode: mode,
			Simulated: simRep, Seed: c.seed, Concurrency: c.concurrency, Books: 40 * time.Second, Log: stderr})
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
	if l.Failed > 0 {
		row("requests failed, in no figure", "-", fmt.Sprint(l.Failed))
	}
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
	writeTenantsCompared(w, s, l)
}

// writeTenantsCompared prints, window by window, how the counters asked
// for more than the limit fared in each report (sim.TenantUse, as each
// report counts it): how many, and the least, p1, p5 and median of what
// they admitted of it.
func writeTenantsCompared(w io.Writer, s, l *sim.Report) {
	type pair struct {
		s, l sim.TenantUse
		full bool
	}
	byStart := map[time.Duration]*pair{}
	for i, rep := range []*sim.Report{s, l} {
		for _, win := range rep.Windows {
			if win.Tenants.Count == 0 {
				continue
			}
			p := byStart[win.Start]
			if p == nil {
				p = &pair{full: true}
				byStart[win.Start] = p
			}
			p.full = p.full && win.Full
			if i == 0 {
				p.s = win.Tenants
			} else {
				p.l = win.Tenants
			}
		}
	}
	if len(byStart) == 0 {
		return
	}
	cell := func(t sim.TenantUse) string {
		if t.Count == 0 {
			return fmt.Sprintf("%8s %6s %6s %6s %6s", "-", "", "", "", "")
		}
		return fmt.Sprintf("%8d %5.1f%% %5.1f%% %5.1f%% %5.1f%%", t.Count, 100*t.Min, 100*t.P1, 100*t.P5, 100*t.P50)
	}
	fmt.Fprintln(w, "counters asked for more than the limit, what they admitted of it:")
	fmt.Fprintf(w, "%-8s %-36s   %s\n", "", "simulated", "live")
	head := fmt.Sprintf("%8s %6s %6s %6s %6s", "counters", "least", "p1", "p5", "median")
	fmt.Fprintf(w, "%-8s %s   %s\n", "window", head, head)
	for _, start := range slices.Sorted(maps.Keys(byStart)) {
		p, mark := byStart[start], ""
		if !p.full {
			mark = "*"
		}
		fmt.Fprintf(w, "%-8s %s   %s\n", clock(start)+mark, cell(p.s), cell(p.l))
	}
}

func pctOf(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}
