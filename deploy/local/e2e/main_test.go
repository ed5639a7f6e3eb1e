//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// binDir holds the regiond and globalsync binaries every deployment of
// the run uses: built once by TestMain, or taken from GEOQUOTA_E2E_BIN.
var binDir string

func TestMain(m *testing.M) {
	if dir := os.Getenv("GEOQUOTA_E2E_BIN"); dir != "" {
		// Binaries built beforehand (by CI, say): no build.
		binDir = dir
		goleak.VerifyTestMain(m, leakOptions...) // exits
		return
	}
	dir, err := os.MkdirTemp("", "geoquota-e2e-bin-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	err = harness.BuildDaemons(ctx, dir)
	cancel()
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	binDir = dir
	goleak.VerifyTestMain(m, append(leakOptions, goleak.Cleanup(func(int) { os.RemoveAll(dir) }))...)
}

var leakOptions = []goleak.Option{
	// toxiproxy's latency toxic, interrupted while a connection closes,
	// may block for good handing its last chunk on.
	goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"),
}
