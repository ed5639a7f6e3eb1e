package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/geoquota/geoquota/cmd/internal/daemon"
)

func main() {
	daemon.SetGC() // GOGC=400 unless set
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseFlags(os.Args[1:], os.Getenv)
	if err != nil {
		os.Exit(daemon.ParseFailed(os.Stdout, os.Stderr, "regiond", err))
	}
	if err := run(ctx, cfg, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "regiond:", err)
		os.Exit(1)
	}
}
