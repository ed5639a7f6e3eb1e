package main

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
)

// chromiumPath finds Debian's chromium, or fails saying how to install it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found in PATH: install it with: apt-get install chromium")
	return ""
}

// TestDashboardInABrowser loads the dashboard in headless Chromium while
// three regions run, two of them taking traffic, globalsync's reads behind
// a token the page is opened with: the regions appear, and a
// chart per figure with a line per region. A screenshot goes to the test's artifact directory
// (go test -artifacts keeps it).
func TestDashboardInABrowser(t *testing.T) {
	bin := chromiumPath(t)
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"ap", "eu", "us"}
	w.region("ap", ns.ClientURL(), regions, strictRules)
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	us := w.region("us", ns.ClientURL(), regions, strictRules)
	svc := w.service("gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 250 * time.Millisecond})
	// With an admin token, which the page takes from its fragment.
	web := httptest.NewServer(httpHandler(svc, prometheus.NewRegistry(), "gs", "t0ken"))
	t.Cleanup(web.Close)
	w.waitFor(250*time.Millisecond, "both regions hold leases", func() bool {
		_, a := eu.lease()
		_, b := us.lease()
		return a && b
	})
	// Ten seconds of traffic in eu and us, a sample each rebalance.
	for range 40 {
		for range 10 {
			var d regional.Decision
			eu.engine.Check(t.Context(), &regional.Request{APIKey: "k1", Endpoint: "/x"}, &d)
			us.engine.Check(t.Context(), &regional.Request{APIKey: "k1", Endpoint: "/x"}, &d)
		}
		w.step(250 * time.Millisecond)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1200, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	defer cancelTimeout()

	err := chromedp.Do(ctx,
		chromedp.Navigate(web.URL+"/#token=t0ken"),
		chromedp.WaitVisible(chromedp.CSS(`tr.region[data-region="us"]`)),
		chromedp.WaitVisible(chromedp.CSS(`svg.chart polyline.series`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("tr.region").length`))
	if err != nil {
		t.Fatal(err)
	}
	lines, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('svg.chart[data-rule="g"] polyline.series').length`))
	if err != nil {
		t.Fatal(err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if rows != 3 || lines != 6 {
		t.Fatalf("the page shows %d regions and %d lines, want 3 regions and a line per region in each of 2 charts", rows, lines)
	}
	path := filepath.Join(t.ArtifactDir(), "dashboard.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}
