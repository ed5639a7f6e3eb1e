package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/geoquota/geoquota/cmd/internal/daemon"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/sim"
)

// runConfig is sim run's flags.
type runConfig struct {
	scenario string
	seed     uint64
	mode     string
	out      string
	list     bool
	duration time.Duration
	workers  int
	// cpuProfile is a file to write a CPU profile of the runs into.
	cpuProfile string
	// shards, if set, runs globalsync as that many instances instead of
	// the scenario's globalsync.shards.
	shards int
	// memProfile is a file to write a heap profile into once the runs
	// are done.
	memProfile string
}

func parseRunFlags(args []string) (runConfig, error) {
	var c runConfig
	fs := flag.NewFlagSet("sim run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.scenario, "scenario", "", "a built-in scenario (see -list), or a scenario file (.yaml); several, comma-separated, are run in turn and compared in a table (index.html)")
	fs.Uint64Var(&c.seed, "seed", 1, "the seed: the same seed gives the same output")
	fs.StringVar(&c.mode, "mode", "", "strict, elastic or both; empty or both runs every mode the scenario names, and the page sets them side by side")
	fs.StringVar(&c.out, "out", "sim-out", "the directory to write the report into: CSV, SVG charts and an HTML page; empty writes none")
	fs.BoolVar(&c.list, "list", false, "list the built-in scenarios")
	fs.DurationVar(&c.duration, "duration", 0, "cut the scenario short at this virtual time")
	fs.IntVar(&c.workers, "workers", 0, "goroutines running the regions in parallel; 0: one per CPU (the output is the same)")
	fs.IntVar(&c.shards, "shards", 0, "run globalsync as this many instances, each the leader of a slice of the counters (the scenario's globalsync.shards; 0: the scenario's)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the runs to this file (go tool pprof reads it)")
	fs.StringVar(&c.memProfile, "memprofile", "", "write a heap profile to this file once the runs are done: what was live at the last collection during them, and all they allocated (go tool pprof reads it)")
	if err := fs.Parse(args); err != nil {
		return c, usageError(fs, err)
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.list:
	case c.scenario == "":
		return c, errors.New("-scenario: missing (sim run -list names them)")
	case c.mode != "" && c.mode != "strict" && c.mode != "elastic" && c.mode != "both":
		return c, fmt.Errorf("-mode %q: want strict, elastic or both", c.mode)
	case c.duration < 0:
		return c, fmt.Errorf("-duration %v: want 0 or more", c.duration)
	case c.workers < 0:
		return c, fmt.Errorf("-workers %d: want 0 or more", c.workers)
	case c.shards < 0 || c.shards > budget.MaxShards:
		return c, fmt.Errorf("-shards %d: want 0 to %d", c.shards, budget.MaxShards)
	}
	return c, nil
}

// usageError is the usage of a request for help (-h), or a parse error
// with the flags' usage added; fs's name is the command's.
func usageError(fs *flag.FlagSet, err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return daemon.HelpOf(fs.Name(), fs, false, "docs/simulation.md")
	}
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	return fmt.Errorf("%w\n%s", err, b.String())
}

// runSim runs a scenario in each of its modes (or the one -mode names),
// prints each report and writes each one's files, then a page that sets
// the modes side by side; the time it took goes to stderr, so that stdout
// is the same for the same seed.
func runSim(c runConfig, stdout, stderr io.Writer) error {
	if c.list {
		for _, name := range sim.Names() {
			sc, err := sim.Load(name)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%-16s %s\n", name, strings.Join(strings.Fields(sc.Description), " "))
		}
		return nil
	}
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if c.memProfile != "" {
		f, err := os.Create(c.memProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		// Written once the runs return, before their memory is
		// collected: the live heap it shows is the last collection's
		// while they ran.
		defer func() {
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				fmt.Fprintf(stderr, "sim run: -memprofile: %v\n", err)
			}
		}()
	}
	names := strings.Split(c.scenario, ",")
	var runs [][]*sim.Report
	for i, name := range names {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		reps, err := runScenario(c, strings.TrimSpace(name), stdout, stderr)
		if err != nil {
			return err
		}
		runs = append(runs, reps)
	}
	if c.out != "" && len(runs) > 1 {
		page, err := sim.WriteComparison(c.out, runs...)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "sim run: wrote %s (%d scenarios compared)\n", page, len(runs))
	}
	return nil
}

// runScenario runs one scenario in each of its modes (or the one -mode
// names), prints each report, and writes its files and its page.
func runScenario(c runConfig, name string, stdout, stderr io.Writer) ([]*sim.Report, error) {
	sc, err := sim.Load(name)
	if err != nil {
		return nil, err
	}
	if c.shards > 0 {
		sc.GlobalSync.Shards = c.shards
	}
	modes := sc.Modes
	if c.mode != "" && c.mode != "both" {
		if !slices.Contains(modes, c.mode) {
			return nil, fmt.Errorf("-mode %s: scenario %s runs in %v", c.mode, sc.Name, modes)
		}
		modes = []string{c.mode}
	}
	var reps []*sim.Report
	for i, mode := range modes {
		start := time.Now()
		rep, err := sim.Run(sc, mode, c.seed, sim.Options{Workers: c.workers, Duration: c.duration})
		if err != nil {
			return nil, err
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := rep.WriteText(stdout); err != nil {
			return nil, err
		}
		took := time.Since(start)
		fmt.Fprintf(stderr, "sim run: %s %s: %d requests in %v of wall time (%.0f simulated requests/s)\n",
			sc.Name, mode, rep.Requests, took.Round(time.Millisecond), float64(rep.Requests)/took.Seconds())
		for i, sh := range rep.Shards {
			fmt.Fprintf(stderr, "  globalsync instance %d: %v of wall time in %d rebalances and the gossip (%v a rebalance)\n",
				i, sh.Work.Round(time.Millisecond), sh.Rebalances, (sh.Work / time.Duration(max(1, sh.Rebalances))).Round(time.Microsecond))
		}
		if c.out != "" {
			if err := rep.WriteFiles(c.out); err != nil {
				return nil, err
			}
		}
		reps = append(reps, rep)
	}
	if c.out != "" {
		page, err := sim.WritePage(c.out, reps...)
		if err != nil {
			return nil, err
		}
		if len(modes) > 1 {
			fmt.Fprintf(stderr, "sim run: wrote %s (%s side by side)\n", page, strings.Join(modes, " and "))
		} else {
			fmt.Fprintf(stderr, "sim run: wrote %s\n", page)
		}
	}
	return reps, nil
}

// accuracyConfig is sim accuracy's flags.
type accuracyConfig struct {
	seed uint64
	opt  sim.AccuracyOptions
}

func parseAccuracyFlags(args []string) (accuracyConfig, error) {
	var c accuracyConfig
	fs := flag.NewFlagSet("sim accuracy", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Uint64Var(&c.seed, "seed", 1, "the seed of the traffic trace")
	fs.IntVar(&c.opt.Keys, "keys", 1000, "API keys, each with its own counter")
	fs.Int64Var(&c.opt.Limit, "limit", 60, "each key's limit per window")
	fs.DurationVar(&c.opt.Window, "window", time.Minute, "the window")
	fs.DurationVar(&c.opt.Duration, "duration", 10*time.Minute, "virtual time the trace covers")
	fs.Float64Var(&c.opt.MinRate, "min-rate", 0.05, "the lowest mean rate of a key, in multiples of the limit")
	fs.Float64Var(&c.opt.MaxRate, "max-rate", 2, "the highest mean rate of a key, in multiples of the limit")
	if err := fs.Parse(args); err != nil {
		return c, usageError(fs, err)
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.opt.Keys < 1 || c.opt.Keys > sim.MaxKeys:
		return c, fmt.Errorf("-keys %d: want 1 to %d", c.opt.Keys, sim.MaxKeys)
	case c.opt.Limit < 1:
		return c, fmt.Errorf("-limit %d: want at least 1", c.opt.Limit)
	case c.opt.Window < time.Second:
		return c, fmt.Errorf("-window %v: want at least 1s", c.opt.Window)
	case c.opt.Duration <= 0:
		return c, fmt.Errorf("-duration %v: want more than 0", c.opt.Duration)
	case !(c.opt.MinRate > 0) || !(c.opt.MaxRate >= c.opt.MinRate):
		return c, fmt.Errorf("-min-rate %v, -max-rate %v: want 0 < min ≤ max", c.opt.MinRate, c.opt.MaxRate)
	}
	return c, nil
}
