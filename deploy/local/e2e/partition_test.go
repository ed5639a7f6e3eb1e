//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// strictRules is one strict global limit on every key k*, in fixed
// windows. It fails closed: on a busy machine a Redis call past its
// timeout must not admit without counting, as fail_open would — what a
// careful operator sets for a strict limit (the default, fail_open, is
// exercised in TestRedisKilled).
func strictRules(limit int64, window time.Duration) string {
	return fmt.Sprintf(`rules:
  - { id: g, match: { api_key: "k*" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: %d, window: %s, fallback: fail_closed }
`, limit, window)
}

// reserve is globalsync's default reserve: the floors of all regions
// together, as a fraction of the limit.
const reserve = 0.10

// perRegionRate is each region's demand, in checks a second: with a limit
// of 600 per 5s window, every region alone asks for the whole limit, so
// the regions together ask for several times it.
const perRegionRate = 120

// TestPartitionAndHeal: three regions under load far above a strict
// limit; ap is cut off from the others for longer than its lease (3s),
// across a whole window. No window admits more than the limit; ap keeps
// serving while cut off, on its floor once its lease has lapsed, and holds
// a lease again after the heal; once healed, every region's Redis holds
// the same count of every window, what the clients saw admitted, and
// /v1/usage reports it in every region, none of them stale.
func TestPartitionAndHeal(t *testing.T) {
	const limit, window = 600, 5 * time.Second
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu", "ap"}, GlobalSyncs: 1,
		Rules: []byte(strictRules(limit, window)), GlobalSyncArgs: []string{"--lease-ttl", "3s"}})
	st := openStores(t, d)
	floor := reserve / 3
	ld := startLoad(t, d, "k1", window, perRegionRate)
	waitLeases(t, d, "k1", floor, 30*time.Second)

	// Cut ap off 4s before a window starts, so that its lease (3s) has
	// lapsed when the window starts; heal after the window has ended.
	b := nextWindow(window, 4200*time.Millisecond)
	sleepUntil(b.Add(-4 * time.Second))
	if err := d.Partition("ap"); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	t.Logf("ap cut off at %s; the window wholly cut off starts at %s", cutAt.Format("15:04:05.000"), b.Format("15:04:05"))
	ap := d.Region("ap")
	sleepUntil(b.Add(window / 2))
	for _, rep := range ap.Replicas {
		// k1 has a budget of its own (every region is denied for it):
		// its floors split the reserve by demand, each at most the
		// rule's; ap asks for a third of it.
		if got := ownShare(ap, rep, "k1"); got > floor+1e-6 || got < 0.9*floor {
			t.Errorf("%s, cut off for %v: enforces a share of %.4f, want its floor, about %.4f and no more", rep.Name, time.Since(cutAt).Round(time.Millisecond), got, floor)
		}
	}
	sleepUntil(b.Add(window + 500*time.Millisecond))
	if err := d.Heal(); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	harness.WaitFor(t, 15*time.Second, "ap holding a lease again after the heal", func() bool {
		for _, rep := range ap.Replicas {
			if ownShare(ap, rep, "k1") <= floor+0.01 {
				return false
			}
		}
		return true
	})
	t.Logf("ap holds a lease %v after the heal", time.Since(healAt).Round(time.Millisecond))

	// A whole window with every region leased again, then the books.
	last, got := settle(t, d, st, ld, window, window, fixedLimit(limit))

	// ap on its floor in the window it was cut off for: serving, and
	// within the floor.
	bw := b.UnixMilli()
	if n, max := got[bw]["ap"], int64(floor*limit); n == 0 || n > max {
		t.Errorf("window %s, ap cut off on its floor of %d: counted %d", b.Format("15:04:05"), max, n)
	}
	if n := ld.ledger.admittedBefore("ap", bw, healAt); n == 0 {
		t.Errorf("ap's clients saw nothing admitted in the window it was cut off for")
	}
	checkUsage(t, d, "k1", last, got[last])
	noOverAdmission(t, d)
}

// settle runs the load on until the first window that starts at least
// lead from now and stops it early in that window, waits for the regions
// to agree on every window and judges the books; it returns the last
// window, still current, and the books.
func settle(t *testing.T, d *harness.Deployment, st *stores, ld *load, window, lead time.Duration, limit func(int64) int64) (int64, books) {
	t.Helper()
	last := nextWindow(window, lead)
	sleepUntil(last.Add(500 * time.Millisecond))
	ld.Stop()
	windows := ld.ledger.windows()
	got := agree(t, d, st, "k1", windows, 15*time.Second)
	judge(t, ld.ledger, got, windows, limit)
	return last.UnixMilli(), got
}

// noOverAdmission wants every running globalsync to have found no
// over-admission: a strict limit never over-admits.
func noOverAdmission(t *testing.T, d *harness.Deployment) {
	t.Helper()
	for _, gs := range d.GlobalSyncs {
		if !gs.Running() {
			continue
		}
		var found []map[string]any
		if err := getJSON("http://"+gs.HTTPAddr+"/v1/over-admissions", &found); err != nil {
			t.Errorf("%s: %v", gs.Name, err)
		} else if len(found) > 0 {
			t.Errorf("%s found over-admission of a strict limit: %v", gs.Name, found)
		}
	}
}

// checkUsage compares every replica's /v1/usage of the current window,
// which must be window, with the counts the regions' Redis agree on, and
// wants every other region heard from lately.
func checkUsage(t *testing.T, d *harness.Deployment, key string, window int64, counted map[string]int64) {
	t.Helper()
	var total int64
	for _, n := range counted {
		total += n
	}
	for _, r := range d.Regions {
		for _, rep := range r.Replicas {
			if !rep.Running() {
				continue
			}
			u, err := usageOf(rep, key)
			if err != nil {
				t.Errorf("%s: /v1/usage: %v", rep.Name, err)
				continue
			}
			ws, err := time.Parse(time.RFC3339, u.WindowStart)
			if err != nil || ws.UnixMilli() != window {
				t.Errorf("%s: /v1/usage is about the window starting %q, want %s: the regions took too long to agree",
					rep.Name, u.WindowStart, time.UnixMilli(window).UTC().Format(time.RFC3339))
				continue
			}
			if u.GlobalUsed != total {
				t.Errorf("%s: /v1/usage global_used %d, the regions' Redis agree on %d (%v)", rep.Name, u.GlobalUsed, total, counted)
			}
			if len(u.Regions) != len(d.Regions) {
				t.Errorf("%s: /v1/usage lists %d regions, want %d: %+v", rep.Name, len(u.Regions), len(d.Regions), u.Regions)
			}
			for _, x := range u.Regions {
				if x.Used != counted[x.Region] {
					t.Errorf("%s: /v1/usage says %s used %d, the regions' Redis agree on %d", rep.Name, x.Region, x.Used, counted[x.Region])
				}
				if x.Region != r.Name && x.Stale {
					t.Errorf("%s: /v1/usage says %s is stale (last heard %dms ago)", rep.Name, x.Region, x.LastHeardMS)
				}
			}
		}
	}
}
