package main

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/geoquota/geoquota/budget"
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

// percentage is how the page writes a fraction of the limit.
var percentage = regexp.MustCompile(`^\d+\.\d{1,2}%$`)

// decimals are fractions of the limit written as they were before the
// page wrote percentages (0.033).
var decimals = regexp.MustCompile(`\b0\.\d{3}\b`)

// inPercent fails the test unless the page writes every granted lease
// and every report of what a region enforces, asks and admits as a
// percentage of the limit, and no bare fraction anywhere.
func (p page) inPercent(rule string) {
	p.t.Helper()
	for _, c := range []string{"granted", "enforced", "demand", "admitted"} {
		for _, got := range p.text(`table.rule[data-rule="` + rule + `"] td.` + c) {
			first, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(got, "lapsed: on its floor, "), "no lease yet: on its floor, "), " ")
			if got != "—" && !percentage.MatchString(first) {
				p.t.Errorf("%s cell %q, want a percentage of the limit", c, got)
			}
		}
	}
	if body := eval[string](p, `document.body.innerText`); decimals.MatchString(body) {
		p.t.Errorf("the page writes %q, a fraction, not a percentage", decimals.FindString(body))
	}
}

// axis is what a chart's y axis is fitted to: the largest value it draws
// and its top.
func (p page) axis(rule, kind string) (most, top float64) {
	p.t.Helper()
	v := eval[[]float64](p, `(c => [+c.dataset.most, +c.dataset.top])(document.querySelector('svg.chart.`+kind+`[data-rule="`+rule+`"]'))`)
	return v[0], v[1]
}

// fitsAxis fails the test unless a chart's y axis fits what it draws: a
// top above the largest value, and less than twice it (or the least top);
// its top grid label says the top.
func (p page) fitsAxis(rule, kind string, least float64) {
	p.t.Helper()
	most, top := p.axis(rule, kind)
	if !(top >= most && top <= 2*max(most, least)) {
		p.t.Errorf("%s chart: axis top %v for values up to %v, want a top that fits them (at least %v)", kind, top, most, least)
	}
	labels := p.text(`svg.chart.` + kind + `[data-rule="` + rule + `"] text.grid`)
	if want := strconv.FormatFloat(math.Round(100*100*top)/100, 'f', -1, 64) + "%"; len(labels) < 3 || labels[len(labels)-1] != want {
		p.t.Errorf("%s chart: grid labels %q, want three or more up to %s", kind, labels, want)
	}
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
// regions appear, every region's lease is granted and held, as
// percentages of the limit, each with why the leader granted it (eu and
// us: their demand met and the spare shared out; ap, idle: its floor), a
// chart per figure has a line per region and a time axis, the admissions'
// axis fits them (at 13% of the limit a window, not up to the limit), and
// the lease moves are listed with their reasons and pointed on the chart
// of shares. A screenshot goes to the test's artifact directory (go test
// -artifacts keeps it).
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
	// Ten seconds of traffic in eu and us, a sample each rebalance: 80
	// requests a window of 2 s each, 13.3% of the limit (as far as NATS
	// delivers the heartbeats on time). It goes on until the page is
	// loaded.
	traffic := func() {
		checks(t, eu, 10, 1)
		checks(t, us, 10, 1)
	}
	// Time moves in lockstep with NATS's deliveries: every heartbeat
	// heard and every lease delivered before the next step.
	for range 40 {
		traffic()
		w.lockstep(250 * time.Millisecond)
	}
	for i := 0; !enforcing(svc, "g", regions, coord.EnforcingLease) || reason(svc, "g", "eu") != budget.WhySpare || reason(svc, "g", "us") != budget.WhySpare; i++ {
		if i == 8 {
			var got []string
			for r, l := range svc.Dashboard().Leases["g"] {
				state := "none"
				if l.Enforced != nil {
					state = l.Enforced.State
				}
				got = append(got, fmt.Sprintf("%s: granted for %q, enforcing %s", r, reason(svc, "g", r), state))
			}
			t.Fatalf("every region reports the lease it holds, eu's and us's of their demand and spare: not after 2 s more (%s)", strings.Join(got, "; "))
		}
		traffic()
		w.lockstep(250 * time.Millisecond)
	}

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
	p.inPercent("g")
	if got, want := p.cell("g", "ap", "why"), "floor — it asks nothing of the rule"; !strings.HasPrefix(got, want) {
		t.Errorf("ap's lease: %q, want %q…", got, want)
	}
	for _, r := range []string{"eu", "us"} {
		got, want := p.cell("g", r, "why"), regexp.MustCompile(`^demand and spare — it asks \d+\.\d% of the limit a window, met in full, and holds \d+\.\d% more`)
		if !want.MatchString(got) {
			t.Errorf("%s's lease: %q, want %s…", r, got, want)
		}
	}
	p.hasTimeAxis()
	p.fitsAxis("g", "admitting", 0.05)
	if most, top := p.axis("g", "admitting"); most < 0.13 || top >= 0.5 {
		t.Errorf("admitting chart: values up to %v on an axis up to %v, want eu's and us's 13%% on an axis well below the limit", most, top)
	}
	if n, note := p.count(`svg.chart.admitting g.limit`), p.count(`svg.chart.admitting text.limit-note`); n != 0 || note != 1 {
		t.Errorf("admitting chart: %d limit lines and %d notes, want the note that the limit is above the scale, and no line", n, note)
	}
	p.fitsAxis("g", "shares", 0.1)
	// The first lease is the even split, or the floors alone if the
	// first rebalance came before the first heartbeats over NATS (a
	// leader has heard no region yet).
	moves := p.text(`ul.moves[data-rule="g"] li.move[data-region="eu"]`)
	if len(moves) == 0 || !strings.Contains(moves[len(moves)-1], "eu 33.3% → ") && !strings.Contains(moves[len(moves)-1], "eu 3.3% → ") ||
		!strings.Contains(moves[0], ": demand and spare — it asks") {
		t.Errorf("eu's moves %q, newest first, want its moves from its first lease (the even split, or the floors) on, to its demand and spare, and why", moves)
	}
	points := p.text(`svg.chart.shares[data-rule="g"] circle.move[data-region="eu"] title`)
	if len(points) == 0 || !strings.Contains(points[len(points)-1], "demand and spare") {
		t.Errorf("the chart of shares points eu's moves %q, want them, each with why", points)
	}
	p.screenshot("dashboard.png")
}

// TestDashboardAxisReachesTheLimit: with a region admitting at more than
// half the limit a window, the admissions' axis rises to show the limit,
// a line marks it, and its top still fits what is drawn.
func TestDashboardAxisReachesTheLimit(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"eu", "us"}
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	w.region("us", ns.ClientURL(), regions, strictRules)
	svc := w.service("gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 250 * time.Millisecond})
	web := httptest.NewServer(httpHandler(svc, prometheus.NewRegistry(), "gs", ""))
	t.Cleanup(web.Close)
	w.waitFor(250*time.Millisecond, "eu holds a lease", func() bool {
		_, ok := eu.lease()
		return ok
	})
	// 64 requests a quarter of a second over 8 keys: 64 a key a window
	// of 2 s, 85% of the limit summed over them (each key far from its
	// own limit, so none gets a budget of its own).
	for range 12 {
		checks(t, eu, 64, 8)
		w.lockstep(250 * time.Millisecond)
	}
	p := load(t, browser(t), web.URL+"/")
	most, top := p.axis("g", "admitting")
	if most < 0.5 || top < 1 {
		t.Errorf("admitting chart: values up to %v on an axis up to %v, want more than half the limit, and the limit on the axis", most, top)
	}
	p.fitsAxis("g", "admitting", 1)
	if n, note := p.count(`svg.chart.admitting g.limit`), p.count(`svg.chart.admitting text.limit-note`); n != 1 || note != 0 {
		t.Errorf("admitting chart: %d limit lines and %d notes, want the line", n, note)
	}
	p.screenshot("limit.png")
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
	// Traffic in eu from now on, 13.3% of the limit.
	for range 10 {
		checks(t, eu, 10, 1)
		w.lockstep(250 * time.Millisecond)
	}

	ctx := browser(t)
	p := load(t, ctx, urls[follower]+"#token=none")
	p.shows("the follower", follower.cfg.ID+" follows: "+leader.cfg.ID+" leads.", "Open "+leader.cfg.ID+"'s dashboard", "granted by "+leader.cfg.ID)
	if href := eval[string](p, `document.getElementById("leader-link").href`); href != urls[leader]+"#token=none" {
		t.Errorf("the follower links to %q, want the leader's dashboard %q, with the page's fragment (its token)", href, urls[leader]+"#token=none")
	}
	for _, r := range regions {
		granted, held := p.cell("g", r, "granted"), p.cell("g", r, "enforced")
		if !strings.HasSuffix(granted, " valid") || strings.HasPrefix(granted, "0.0%") || !strings.HasSuffix(held, " valid") {
			t.Errorf("the follower shows %s granted %q and holding %q, want the leader's lease, valid, and held", r, granted, held)
		}
		// The reasons come in the leader's documents.
		if got := p.cell("g", r, "why"); !strings.Contains(got, " — ") {
			t.Errorf("the follower shows why %s was granted its lease as %q, want the leader's reason", r, got)
		}
	}
	p.inPercent("g")
	p.hasTimeAxis()
	p.screenshot("follower.png")

	// ap is cut off: globalsync hears it no more, and its last report
	// names a lease that lapses.
	ap.silent.Store(true)
	for _, s := range []*Service{leader, follower} {
		w.waitFor(250*time.Millisecond, s.cfg.ID+" finds ap's lease lapsed by its last report, and ap granted its floor for its silence", func() bool {
			checks(t, eu, 10, 1)
			e := s.Dashboard().Leases["g"]["ap"].Enforced
			return e != nil && e.State == coord.EnforcingLapsed && reason(s, "g", "ap") == budget.WhySilent
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
		if got, want := p.cell("g", "ap", "why"), "floor — not heard lately (cut off, or down): its demand no longer counts"; !strings.HasPrefix(got, want) {
			t.Errorf("%s: why ap is granted its floor: %q, want %q…", s.cfg.ID, got, want)
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

// checks makes n checks in region r, over keys k0 to k<keys-1> in turn.
func checks(t *testing.T, r *region, n, keys int) {
	for i := range n {
		var d regional.Decision
		r.engine.Check(t.Context(), &regional.Request{APIKey: fmt.Sprintf("k%d", i%keys), Endpoint: "/x"}, &d)
	}
}

// reason is why the leader granted region its lease of rule, as s
// knows it.
func reason(s *Service, rule, region string) budget.Why {
	if g := s.Dashboard().Leases[rule][region].Granted; g != nil && g.Reason != nil {
		return g.Reason.Why
	}
	return ""
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
