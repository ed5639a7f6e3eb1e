package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/geoquota/geoquota/cmd/internal/daemon"
	"github.com/geoquota/geoquota/sim"
)

const usage = `usage: sim <command> [flags]

commands:
  load      generate load against a regiond API and report throughput and latency
  run       run a scenario in the simulator: deterministic, in virtual time
  accuracy  compare the sliding window counter with the exact sliding window log
  live      run a scenario against a local deployment in real time, and the simulator beside it
  floor     serve Envoy RLS answering OK to everything: the protocol's floor, for benchmarks

Run "sim <command> -h" for a command's flags. Documentation: docs/simulation.md.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	case "load":
		cfg, err := parseLoadFlags(args[1:])
		if err != nil {
			return daemon.ParseFailed(stdout, stderr, "sim load", err)
		}
		rep, err := runLoad(ctx, cfg, stderr)
		if err != nil {
			fmt.Fprintln(stderr, "sim load:", err)
			return 1
		}
		rep.print(stdout, cfg)
		return 0
	case "run":
		cfg, err := parseRunFlags(args[1:])
		if err != nil {
			return daemon.ParseFailed(stdout, stderr, "sim run", err)
		}
		if err := runSim(cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "sim run:", err)
			return 1
		}
		return 0
	case "accuracy":
		cfg, err := parseAccuracyFlags(args[1:])
		if err != nil {
			return daemon.ParseFailed(stdout, stderr, "sim accuracy", err)
		}
		rep, err := sim.Accuracy(cfg.seed, cfg.opt)
		if err == nil {
			err = rep.WriteText(stdout)
		}
		if err != nil {
			fmt.Fprintln(stderr, "sim accuracy:", err)
			return 1
		}
		return 0
	case "live":
		cfg, err := parseLiveFlags(args[1:])
		if err != nil {
			return daemon.ParseFailed(stdout, stderr, "sim live", err)
		}
		if err := runLive(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "sim live:", err)
			return 1
		}
		return 0
	case "floor":
		cfg, err := parseFloorFlags(args[1:])
		if err != nil {
			return daemon.ParseFailed(stdout, stderr, "sim floor", err)
		}
		daemon.SetGC() // as regiond's
		if err := runFloor(ctx, cfg, func(a net.Addr) { fmt.Fprintln(stderr, "sim floor: serving Envoy RLS on", a) }); err != nil {
			fmt.Fprintln(stderr, "sim floor:", err)
			return 1
		}
		return 0
	default:
		fmt.Fprintf(stderr, "sim: unknown command %q\n%s", args[0], usage)
		return 2
	}
}
