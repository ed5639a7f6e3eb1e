package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// gcPercent is regiond's GOGC unless the environment sets one: a check
// allocates much that does not live, and collecting when the heap reaches
// five times what lives instead of twice cut CPU per check by a sixth to a
// fifth side by side (docs/benchmarks.md#gc). GOMEMLIMIT caps the heap.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "regiond:", err)
		os.Exit(2)
	}
	if err := run(ctx, cfg, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "regiond:", err)
		os.Exit(1)
	}
}
