//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/sim"
	"github.com/geoquota/geoquota/sim/live"
)

// TestTenantsGetTheirOwnLimit: three tenants under one strict global rule
// (300 per 5s each), each homed in a different region (90% of its calls
// there, the rest spread over the other two), each asking for nearly
// twice its limit. Every tenant gets at least 95% of its own limit in
// every window once its budget follows it, wherever its traffic is, and
// never more; globalsync finds no over-admission.
func TestTenantsGetTheirOwnLimit(t *testing.T) {
	const limit, window = 300, 5 * time.Second
	regions := []string{"us", "eu", "ap"}
	d := deploy(t, harness.DeploymentOptions{Regions: regions, GlobalSyncs: 1, Rules: []byte(strictRules(limit, window))})
	st := openStores(t, d)
	loads := map[string]*load{}
	for _, home := range regions {
		rates := map[string]int{}
		for _, r := range regions {
			rates[r] = 6
		}
		rates[home] = 100
		loads["k-"+home] = startLoadAt(t, d, "k-"+home, window, rates)
	}
	// Two windows for the budgets to follow the tenants (a tenant gets
	// one of its own once its region is denied under the rule's), then
	// three whole windows to judge.
	first := nextWindow(window, 2*window)
	last := first.Add(3 * window)
	sleepUntil(last.Add(500 * time.Millisecond))
	for _, ld := range loads {
		ld.Stop()
	}
	for key, ld := range loads {
		windows := ld.ledger.windows()
		got := agree(t, d, st, key, windows, 15*time.Second)
		judge(t, ld.ledger, got, windows, fixedLimit(limit))
		for w := first; w.Before(last); w = w.Add(window) {
			var total int64
			for _, n := range got[w.UnixMilli()] {
				total += n
			}
			if total < limit*95/100 {
				t.Errorf("%s, window %s: admitted %d of its limit of %d (%v), want at least 95%%",
					key, w.Format("15:04:05"), total, limit, got[w.UnixMilli()])
			}
		}
	}
	noOverAdmission(t, d)
}

// TestTenantDemandMovesInsideAnHour: one tenant's calls move from us to eu
// inside an hour window, after us has used part of the tenant's limit; eu
// gets what us did not use, and the tenant fills at least 95% of its limit
// in that window, never more.
func TestTenantDemandMovesInsideAnHour(t *testing.T) {
	const limit, window = 1200, time.Hour
	regions := []string{"us", "eu", "ap"}
	d := deploy(t, harness.DeploymentOptions{Regions: regions, GlobalSyncs: 1, Rules: []byte(strictRules(limit, window))})
	st := openStores(t, d)
	w := nextWindow(window, 0).Add(-window) // the window in course
	if time.Until(w.Add(window)) < 2*time.Minute {
		sleepUntil(w.Add(window + time.Second)) // too close to its end: the next
		w = w.Add(window)
	}
	// us uses about a third of the limit, then the tenant moves to eu,
	// which asks for more than the rest.
	ld := startLoadAt(t, d, "k-mover", window, map[string]int{"us": 60})
	harness.WaitFor(t, 30*time.Second, "us having admitted a third of the limit", func() bool {
		return ld.ledger.admitted(w.UnixMilli())["us"] >= limit/3
	})
	ld.Stop()
	usUsed := ld.ledger.admitted(w.UnixMilli())["us"]
	moved := time.Now()
	ld2 := startLoadAt(t, d, "k-mover", window, map[string]int{"eu": 60})
	harness.WaitFor(t, 60*time.Second, "eu filling what us left of the limit", func() bool {
		return usUsed+ld2.ledger.admitted(w.UnixMilli())["eu"] >= limit*95/100
	})
	t.Logf("us used %d; eu filled the limit to 95%% %v after the move", usUsed, time.Since(moved).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // and no more than the limit after
	ld2.Stop()
	got := agree(t, d, st, "k-mover", []int64{w.UnixMilli()}, 15*time.Second)
	for region, seen := range map[string]int64{"us": usUsed, "eu": ld2.ledger.admitted(w.UnixMilli())["eu"]} {
		if got[w.UnixMilli()][region] < seen {
			t.Errorf("%s counted %d, its clients saw %d admitted", region, got[w.UnixMilli()][region], seen)
		}
	}
	var total int64
	for _, n := range got[w.UnixMilli()] {
		total += n
	}
	if total > limit || total < limit*95/100 {
		t.Errorf("window %s: admitted %d (%v), want 95%% to 100%% of %d", w.Format("15:04"), total, got[w.UnixMilli()], limit)
	}
	noOverAdmission(t, d)
}

// TestFreeTierTenantsGetTheirLimitLive: the free tier's many tenants,
// each with a small limit (scenario tenants-free-live: 1,000 tenants
// homed over three regions, 80% of each one's calls at home, Zipf demand,
// 1,500 calls a second), played as sim live plays it on three regions,
// its time scaled down to 15 s windows: a limit of 38 a window, some 65
// tenants asking for more in each. No tenant is admitted more than its
// limit in any window, as its clients saw, and globalsync finds none
// over. The tenants over their limit get most of it: the median at least
// 85% in every window; one in twenty (p5) at least 65% in the first
// window, while their budgets form, and 80% in the second. A region's
// part of a tenant's limit is a few calls, and the calls it gets of that
// tenant vary by as many: measured 2026-11-27, live, p5 79–82% and then
// 92%, the median 95–97% (simulated, ten seeds: p5 82–87% and 89–95%, the
// median 95–97%); with 10 s windows (a limit of 25) p5 fell to 52–68% and
// 76–88%. False rejections stay under 6% (measured 2.4–2.8%).
func TestFreeTierTenantsGetTheirLimitLive(t *testing.T) {
	regions := []string{"us", "eu", "ap"}
	d := deploy(t, harness.DeploymentOptions{Regions: regions, GlobalSyncs: 1, Rules: []byte(strictRules(600, 5*time.Second))})
	base, err := sim.Load("tenants-free-live")
	if err != nil {
		t.Fatal(err)
	}
	sc, _, _, err := live.Fit(base, regions, 15*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	const seed = 1
	simulated, err := sim.Run(sc, "strict", seed, sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	played, err := live.Play(ctx, live.Run{Deployment: d.State(), Links: d, Scenario: sc, Mode: "strict",
		Simulated: simulated, Seed: seed, Log: t.Output()})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("played in %v", time.Since(start).Round(100*time.Millisecond))
	var b strings.Builder
	for _, rep := range []*sim.Report{simulated, played} {
		rep.WriteText(&b)
		b.WriteString("\n")
	}
	t.Logf("simulated, then live:\n%s", b.String())

	// A store that answers too late, the machine busy, fails a strict
	// limit's calls closed (503) for a while: not what this test judges,
	// but too many would leave little to judge.
	if played.Failed > played.Requests/5 {
		t.Errorf("%d requests failed, %d answered: more than 20%%", played.Failed, played.Requests)
	}
	if pct := 100 * float64(played.FalseRejected) / float64(played.Requests); pct >= 6 {
		t.Errorf("false rejections %.2f%%, want under 6%%", pct)
	}
	full := 0
	for _, w := range played.Windows {
		if w.OverTotal > 0 {
			t.Errorf("window %v: %d tenants admitted more than their limit of %d, the worst %d more", w.Start, w.OverCount, sc.Rule.Limit, w.Over)
		}
		if !w.Full {
			continue
		}
		full++
		u := w.Tenants
		if u.Count < 40 {
			t.Errorf("window %v: %d tenants asked for more than their limit, want more to judge", w.Start, u.Count)
		}
		if u.P50 < 0.85 {
			t.Errorf("window %v: the median tenant over its limit admitted %.1f%% of it, want at least 85%%", w.Start, 100*u.P50)
		}
		want := 0.80
		if w.Start == 0 {
			want = 0.65 // budgets forming
		}
		if u.P5 < want {
			t.Errorf("window %v: one in twenty tenants over their limit (p5) admitted %.1f%% of it or less, want at least %.0f%% (the least: %s, %.1f%%)",
				w.Start, 100*u.P5, 100*want, u.Worst, 100*u.Min)
		}
	}
	if full != 2 {
		t.Errorf("%d full windows played, want 2", full)
	}
	noOverAdmission(t, d)
}
