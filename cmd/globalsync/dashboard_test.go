package main

import (
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/geoquota/geoquota/budget/coord"
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

// browser starts headless Chromium, stopped when the test ends.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancelTimeout)
	return ctx
}

// page is the dashboard as the browser drew it.
type page struct {
	t   *testing.T
	ctx context.Context
}

// load opens url afresh and waits until the page has drawn a rule's
// leases and charts.
func load(t *testing.T, ctx context.Context, url string) page {
	t.Helper()
	err := chromedp.Do(ctx,
		chromedp.Navigate("about:blank"),
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(`table.rule tr.lease-row`)),
		chromedp.WaitVisible(chromedp.CSS(`svg.chart path.series`)),
	)
	if err != nil {
		t.Fatalf("loading %s: %v", url, err)
	}
	return page{t, ctx}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](p page, expr string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// text is the text of the elements css selects, one string each.
func (p page) text(css string) []string {
	p.t.Helper()
	return eval[[]string](p, `[...document.querySelectorAll(`+"`"+css+"`"+`)].map(e => e.textContent)`)
}

// count is how many elements css selects.
func (p page) count(css string) int {
	p.t.Helper()
	return eval[int](p, "document.querySelectorAll(`"+css+"`).length")
}

// marked is how many of a rule's charts hold a marker css selects.
func (p page) marked(rule, css string) int {
	p.t.Helper()
	return eval[int](p, `[...document.querySelectorAll('svg.chart[data-rule="`+rule+`"]')].filter(c => c.querySelector(`+"`"+css+"`"+`)).length`)
}

// shows fails the test unless the page's text holds every one of want.
func (p page) shows(what string, want ...string) {
	p.t.Helper()
	body := eval[string](p, `document.body.innerText`)
	for _, w := range want {
		if !strings.Contains(body, w) {
			p.t.Errorf("%s: the page does not show %q; it shows:\n%s", what, w, body)
		}
	}
}

// cell is the text of one region's cell (td class) in a rule's table.
func (p page) cell(rule, region, class string) string {
	p.t.Helper()
	got := p.text(`table.rule[data-rule="` + rule + `"] tr[data-region="` + region + `"] td.` + class)
	if len(got) != 1 {
		p.t.Fatalf("rule %s, region %s: %d cells %s, want 1", rule, region, len(got), class)
	}
	return got[0]
}

// screenshot writes the whole page to the test's artifact directory
// (go test -artifacts keeps it).
func (p page) screenshot(name string) {
	p.t.Helper()
	png, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatal(err)
	}
	path := filepath.Join(p.t.ArtifactDir(), name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// timeOfDay is a time axis's label.
var timeOfDay = regexp.MustCompile(`^\d\d:\d\d:\d\d$`)

// hasTimeAxis fails the test unless every chart has a time axis with two
// labels or more, each a time of day.
func (p page) hasTimeAxis() {
	p.t.Helper()
	charts := p.count(`svg.chart`)
	labels := p.text(`svg.chart g.time-axis text.tick`)
	if charts == 0 || len(labels) < 2*charts {
		p.t.Errorf("%d time labels on %d charts, want two or more on each: %q", len(labels), charts, labels)
	}
	for _, l := range labels {
		if !timeOfDay.MatchString(l) {
			p.t.Errorf("time axis label %q, want a time of day (15:04:05)", l)
		}
	}
}

// TestDashboardInABrowser loads the dashboard in headless Chromium while
// three regions run, two of them taking traffic, globalsync's reads behind
// a token the page is opened with: the instance says it leads, the
// regions appear, every region's lease is granted and held, and a chart
// per figure has a line per region and a time axis. A screenshot goes to
// the test's artifact directory (go test -artifacts keeps it).
func TestDashboardInABrowser(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"ap", "eu", "us"}
	ap := w.region("ap", ns.ClientURL(), regions, strictRules)
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	us := w.region("us", ns.ClientURL(), regions, strictRules)
	svc := w.service("gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 250 * time.Millisecond})
	// With an admin token, which the page takes from its fragment.
	web := httptest.NewServer(httpHandler(svc, prometheus.NewRegistry(), "gs", "t0ken"))
	t.Cleanup(web.Close)
	w.waitFor(250*time.Millisecond, "every region holds a lease", func() bool {
		for _, r := range []*region{ap, eu, us} {
			if _, ok := r.lease(); !ok {
				return false
			}
		}
		return true
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
	w.waitFor(250*time.Millisecond, "every region reports the lease it holds", func() bool {
		return enforcing(svc, "g", regions, coord.EnforcingLease)
	})

	p := load(t, browser(t), web.URL+"/#token=t0ken")
	p.shows("the leader", "gs leads.")
	if rows, lines := p.count(`tr.region`), p.count(`svg.chart[data-rule="g"] path.series`); rows != 3 || lines != 6 {
		t.Fatalf("the page shows %d regions and %d lines, want 3 regions and a line per region in each of 2 charts", rows, lines)
	}
	for _, r := range regions {
		if got := p.cell("g", r, "granted"); !strings.HasSuffix(got, " valid") {
			t.Errorf("%s granted %q, want a valid lease", r, got)
		}
		if got := p.cell("g", r, "enforced"); !strings.HasSuffix(got, " valid") {
			t.Errorf("%s reports %q, want a valid lease", r, got)
		}
	}
	p.hasTimeAxis()
	p.screenshot("dashboard.png")
}

// TestDashboardFollowerAndPartition: two instances. The follower's page
// says it follows, names the leader and links to its dashboard, and shows
// the leader's leases, as the leader's page does. Then ap falls silent
// (cut off): on both pages ap is not heard, its lease is granted (its
// floor, renewed by the leader) but ap's last report says it has lapsed,
// and the faults are listed and marked on the charts. Then the leader
// goes: the other's page says it leads, with the change marked.
func TestDashboardFollowerAndPartition(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"ap", "eu", "us"}
	ap := w.region("ap", ns.ClientURL(), regions, strictRules)
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	w.region("us", ns.ClientURL(), regions, strictRules)
	cfg := Config{Regions: regions, Rebalance: 250 * time.Millisecond, LeaderTTL: time.Second}
	a := w.service("a", ns.ClientURL(), cfg)
	b := w.service("b", ns.ClientURL(), cfg)
	urls := map[*Service]string{}
	for _, s := range []*Service{a, b} {
		web := httptest.NewServer(httpHandler(s, prometheus.NewRegistry(), s.cfg.ID, ""))
		t.Cleanup(web.Close)
		urls[s] = web.URL + "/"
		s.SetURL(urls[s])
	}
	w.waitFor(250*time.Millisecond, "one leads, the other knows it", func() bool {
		ra, rb := a.Readiness(), b.Readiness()
		return ra.Ready && rb.Ready && ra.Role != rb.Role && ra.Leader == rb.Leader && rb.LeaderURL != ""
	})
	leader, follower := a, b
	if b.Leader() {
		leader, follower = b, a
	}
	for _, s := range []*Service{leader, follower} {
		w.waitFor(250*time.Millisecond, s.cfg.ID+" has every region's lease granted and held", func() bool {
			d := s.Dashboard()
			for _, r := range regions {
				l := d.Leases["g"][r]
				if l.Granted == nil || !l.Granted.Valid || l.Granted.By != leader.cfg.ID {
					return false
				}
			}
			return enforcing(s, "g", regions, coord.EnforcingLease)
		})
	}
	for range 10 {
		for range 10 {
			var d regional.Decision
			eu.engine.Check(t.Context(), &regional.Request{APIKey: "k1", Endpoint: "/x"}, &d)
		}
		w.step(250 * time.Millisecond)
	}

	ctx := browser(t)
	p := load(t, ctx, urls[follower]+"#token=none")
	p.shows("the follower", follower.cfg.ID+" follows: "+leader.cfg.ID+" leads.", "Open "+leader.cfg.ID+"'s dashboard", "granted by "+leader.cfg.ID)
	if href := eval[string](p, `document.getElementById("leader-link").href`); href != urls[leader]+"#token=none" {
		t.Errorf("the follower links to %q, want the leader's dashboard %q, with the page's fragment (its token)", href, urls[leader]+"#token=none")
	}
	for _, r := range regions {
		granted, held := p.cell("g", r, "granted"), p.cell("g", r, "enforced")
		if !strings.HasSuffix(granted, " valid") || strings.HasPrefix(granted, "0.000") || !strings.HasSuffix(held, " valid") {
			t.Errorf("the follower shows %s granted %q and holding %q, want the leader's lease, valid, and held", r, granted, held)
		}
	}
	p.hasTimeAxis()
	p.screenshot("follower.png")

	// ap is cut off: globalsync hears it no more, and its last report
	// names a lease that lapses.
	ap.silent.Store(true)
	for _, s := range []*Service{leader, follower} {
		w.waitFor(250*time.Millisecond, s.cfg.ID+" finds ap's lease lapsed by its last report", func() bool {
			e := s.Dashboard().Leases["g"]["ap"].Enforced
			return e != nil && e.State == coord.EnforcingLapsed
		})
	}
	for _, s := range []*Service{leader, follower} {
		p := load(t, ctx, urls[s])
		p.shows(s.cfg.ID+" during the partition", "not heard: cut off, or down", "ap not heard from then on", "ap's lease of g lapsed, by its last report")
		if got := p.cell("g", "ap", "granted"); !strings.HasSuffix(got, " valid") {
			t.Errorf("%s: ap granted %q, want the leader's lease (its floor), valid", s.cfg.ID, got)
		}
		if got := p.cell("g", "ap", "enforced"); !strings.HasPrefix(got, "lapsed: on its floor") || !strings.Contains(got, "its last report") {
			t.Errorf("%s: ap reports %q, want its lease lapsed, by its last report", s.cfg.ID, got)
		}
		if got := p.cell("g", "ap", "note"); got != "granted valid / region reports lapsed" {
			t.Errorf("%s: ap's note %q, want the grant and the report told apart", s.cfg.ID, got)
		}
		if got := p.cell("g", "eu", "enforced"); !strings.HasSuffix(got, " valid") {
			t.Errorf("%s: eu reports %q, want its lease valid", s.cfg.ID, got)
		}
		for _, kind := range []string{FaultSilent, FaultLapsed} {
			if n := p.marked("g", `g.marker[data-kind="`+kind+`"][data-region="ap"]`); n != 2 {
				t.Errorf("%s: %d charts mark ap %s, want both", s.cfg.ID, n, kind)
			}
		}
		p.hasTimeAxis()
		p.screenshot(s.cfg.ID + "-partition.png")
	}

	// The leader goes: the follower takes over.
	leader.Close()
	w.waitFor(250*time.Millisecond, follower.cfg.ID+" leads, and has seen the change", func() bool {
		for _, f := range follower.Dashboard().Faults {
			if f.Kind == FaultLeader {
				return follower.Leader()
			}
		}
		return false
	})
	p = load(t, ctx, urls[follower])
	p.shows("the new leader", follower.cfg.ID+" leads.", follower.cfg.ID+" leads (was "+leader.cfg.ID+")")
	if n := p.marked("g", `g.marker[data-kind="leader"]`); n != 2 {
		t.Errorf("%d charts mark the leader change, want both", n)
	}
	p.screenshot("takeover.png")
}

// enforcing reports whether every region's replicas report a lease of
// rule in state.
func enforcing(s *Service, rule string, regions []string, state string) bool {
	d := s.Dashboard()
	for _, r := range regions {
		if e := d.Leases[rule][r].Enforced; e == nil || e.State != state {
			return false
		}
	}
	return true
}
