//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
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
