//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// TestRedisKilled: eu's redis-server is killed with SIGKILL mid-window
// under load and restarted empty 1.5s later. While it is down every eu
// replica keeps answering, each rule per its fallback: the strict rule
// that fails closed with 503, a global rule with the default fallback
// admitting its part of the region's allowance in memory, marked
// degraded. The strict limit holds in every window —
// the window of the kill included, where eu must not admit again what it
// had admitted before its Redis forgot it — and once back, eu's Redis
// holds every window again, both regions' slots, so every region's count
// still includes what eu admitted before the kill.
func TestRedisKilled(t *testing.T) {
	const limit, window = 600, 5 * time.Second
	rules := strictRules(limit, window) +
		"  - { id: o, match: { api_key: \"o*\" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: 600, window: 5s }\n"
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu"}, GlobalSyncs: 1, Rules: []byte(rules),
		GlobalSyncArgs: []string{"--lease-ttl", "3s"}})
	st := openStores(t, d)
	ld := startLoad(t, d, "k1", window, perRegionRate)
	waitLeases(t, d, "k1", reserve/2, 30*time.Second)

	eu := d.Region("eu")
	b := nextWindow(window, time.Second)
	sleepUntil(b.Add(1500 * time.Millisecond))
	before := b.Add(-window).UnixMilli()
	if err := eu.Redis.Kill(); err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	t.Logf("eu's Redis killed at %s, eu having admitted %d in the window", killAt.Format("15:04:05.000"), ld.ledger.admitted(b.UnixMilli())["eu"])
	for _, rep := range eu.Replicas {
		// Once the replicas have heard each other's count (a gossip
		// round), each admits its part in memory.
		var status int
		var degraded bool
		var body string
		harness.WaitFor(t, 5*time.Second, rep.Name+" admitting o1 without its Redis", func() bool {
			status, degraded, body = check(t, rep, "o1")
			return status == http.StatusOK
		})
		if !degraded {
			t.Errorf("%s without its Redis, a global rule's default fallback: %d, X-RateLimit-Degraded %v: %s; want 200, degraded", rep.Name, status, degraded, body)
		}
	}
	sleepUntil(killAt.Add(1500 * time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := eu.Redis.Restart(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	restartAt := time.Now()
	harness.WaitFor(t, 10*time.Second, "eu's restarted Redis given back the window before the kill", func() bool {
		got, err1 := st.slots("eu", "k1", before)
		want, err2 := st.slots("us", "k1", before)
		return err1 == nil && err2 == nil && len(want) == 2 && got["us"] == want["us"] && got["eu"] == want["eu"]
	})
	t.Logf("eu's Redis has the window before the kill back %v after its restart", time.Since(restartAt).Round(time.Millisecond))

	last, got := settle(t, d, st, ld, window, window, fixedLimit(limit))
	if n := got[b.UnixMilli()]["eu"]; n == 0 {
		t.Errorf("window of the kill: eu counted nothing")
	}
	failed, closed, _ := ld.ledger.outcomes()
	if failed["eu"] > 0 {
		t.Errorf("eu's replicas left %d calls unanswered without their Redis", failed["eu"])
	}
	if closed["eu"] == 0 {
		t.Errorf("no 503 from eu while its Redis was down: the strict rule fails closed")
	}
	checkUsage(t, d, "k1", last, got[last])
	noOverAdmission(t, d)
}

// check sends one POST /v1/check for api_key key to a replica and returns
// the status, whether the answer says degraded, and the body.
func check(t *testing.T, rep *harness.Daemon, key string) (int, bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rep.HTTPAddr+"/v1/check",
		strings.NewReader(`{"descriptors":{"api_key":"`+key+`","endpoint":"/x"},"cost":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		t.Errorf("%s: /v1/check: %v", rep.Name, err)
		return 0, false, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a checkAnswer
	json.Unmarshal(b, &a)
	header := resp.Header.Get("X-RateLimit-Degraded") == "true"
	if resp.StatusCode == http.StatusOK && header != a.Degraded { // an error's body says nothing of it
		t.Errorf("%s: X-RateLimit-Degraded %q but degraded %v in the body", rep.Name, resp.Header.Get("X-RateLimit-Degraded"), a.Degraded)
	}
	return resp.StatusCode, header, strings.TrimSpace(string(b))
}

// TestNATSServerKilled: eu's NATS server is killed under load for longer
// than a lease, and restarted. eu keeps answering from its Redis, on its
// floor once its lease lapses; after the restart eu holds a lease again,
// the regions hear each other again, every window's counts converge and
// nothing admitted is lost; the strict limit holds throughout.
func TestNATSServerKilled(t *testing.T) {
	const limit, window = 600, 5 * time.Second
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu"}, GlobalSyncs: 1,
		Rules: []byte(strictRules(limit, window)), GlobalSyncArgs: []string{"--lease-ttl", "3s"}})
	st := openStores(t, d)
	floor := reserve / 2
	ld := startLoad(t, d, "k1", window, perRegionRate)
	waitLeases(t, d, "k1", floor, 30*time.Second)

	eu := d.Region("eu")
	sleepUntil(nextWindow(window, time.Second).Add(time.Second))
	if err := eu.NATS.Servers[0].Kill(); err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	sleepUntil(killAt.Add(5 * time.Second)) // longer than the 3s lease
	for _, rep := range eu.Replicas {
		// k1 has a budget of its own (both regions are denied for
		// it): its floors split the reserve by demand, each at most
		// the rule's; eu asks for half of it.
		if got := ownShare(eu, rep, "k1"); got > floor+1e-6 || got < 0.9*floor {
			t.Errorf("%s, without NATS for 5s: enforces a share of %.4f, want its floor, about %.4f and no more", rep.Name, got, floor)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := eu.NATS.Servers[0].Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.NATS.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	restartAt := time.Now()
	if n := ld.ledger.count(func(a admission) bool { return a.region == "eu" && a.at.After(killAt) && a.at.Before(restartAt) }); n == 0 {
		t.Errorf("eu admitted nothing without NATS")
	}
	harness.WaitFor(t, 20*time.Second, "eu holding a lease again after its NATS server's restart", func() bool {
		for _, rep := range eu.Replicas {
			if ownShare(eu, rep, "k1") <= floor+0.01 {
				return false
			}
		}
		return true
	})
	t.Logf("eu holds a lease %v after its NATS server is back", time.Since(restartAt).Round(time.Millisecond))
	harness.WaitFor(t, 15*time.Second, "every replica hearing the other region again", func() bool {
		return heardFromAll(d, "k1")
	})

	last, got := settle(t, d, st, ld, window, window, fixedLimit(limit))
	failed, _, _ := ld.ledger.outcomes()
	if failed["eu"] > 0 {
		t.Errorf("eu's replicas left %d calls unanswered without NATS", failed["eu"])
	}
	checkUsage(t, d, "k1", last, got[last])
	noOverAdmission(t, d)
}

// heardFromAll reports whether every running replica's /v1/usage shows
// every other region heard from lately.
func heardFromAll(d *harness.Deployment, key string) bool {
	for _, r := range d.Regions {
		for _, rep := range r.Replicas {
			if !rep.Running() {
				continue
			}
			u, err := usageOf(rep, key)
			if err != nil || len(u.Regions) != len(d.Regions) {
				return false
			}
			for _, x := range u.Regions {
				if x.Region != r.Name && x.Stale {
					return false
				}
			}
		}
	}
	return true
}

// TestReplicaKilled: eu-1 is killed with SIGKILL mid-window while it
// admits; its clients move to eu-2, which goes on admitting within eu's
// share. The strict limit holds, and what eu-1 admitted before it died is
// counted in both regions' Redis. Restarted, eu-1 serves again and
// reports the same usage as the others.
func TestReplicaKilled(t *testing.T) {
	const limit, window = 600, 5 * time.Second
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu"}, GlobalSyncs: 1,
		Rules: []byte(strictRules(limit, window)), GlobalSyncArgs: []string{"--lease-ttl", "3s"}})
	st := openStores(t, d)
	ld := startLoad(t, d, "k1", window, perRegionRate)
	waitLeases(t, d, "k1", reserve/2, 30*time.Second)

	eu := d.Region("eu")
	victim, sibling := eu.Replicas[0], eu.Replicas[1]
	b := nextWindow(window, time.Second)
	sleepUntil(b.Add(time.Second))
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	byVictim := ld.ledger.admittedBy(victim.Name, b.UnixMilli())
	t.Logf("%s killed at %s, having admitted %d in the window", victim.Name, killAt.Format("15:04:05.000"), byVictim)
	if byVictim == 0 {
		t.Errorf("%s admitted nothing in the window before it was killed: the test meant to kill it while it admitted", victim.Name)
	}
	harness.WaitFor(t, 10*time.Second, "the sibling admitting after the kill", func() bool {
		return ld.ledger.count(func(a admission) bool { return a.replica == sibling.Name && a.at.After(killAt) }) > 0
	})
	sleepUntil(b.Add(window + time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := victim.Restart(ctx); err != nil {
		t.Fatal(err)
	}

	last, got := settle(t, d, st, ld, window, window, fixedLimit(limit))
	if ld.ledger.admittedBy(victim.Name, b.UnixMilli()) != byVictim {
		t.Errorf("%s was seen to admit in the window after it was killed", victim.Name)
	}
	failed, _, _ := ld.ledger.outcomes()
	t.Logf("calls unanswered: %v", failed)
	if failed["eu"] > loadWorkers {
		t.Errorf("eu's clients had %d calls unanswered: more than one per worker, so they did not move to the sibling", failed["eu"])
	}
	checkUsage(t, d, "k1", last, got[last])
	noOverAdmission(t, d)
}

// TestLeaderKilled: two globalsync instances; the leader is killed with
// SIGKILL mid-window under load. The other takes the lead within the
// leader TTL (3s) and a rebalance or two, and publishes leases that the
// regions take: no region's lease lapses — every replica enforces more
// than its floor all along, past the expiry of every lease the dead
// leader issued. The strict limit holds throughout.
func TestLeaderKilled(t *testing.T) {
	const limit, window = 600, 5 * time.Second
	const leaseTTL, leaderTTL, rebalance = 8 * time.Second, 3 * time.Second, time.Second
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu"}, GlobalSyncs: 2,
		Rules: []byte(strictRules(limit, window)), GlobalSyncArgs: []string{"--lease-ttl", leaseTTL.String()}})
	st := openStores(t, d)
	floor := reserve / 2
	ld := startLoad(t, d, "k1", window, perRegionRate)
	waitLeases(t, d, "k1", floor, 30*time.Second)

	var leader, follower *harness.Daemon
	harness.WaitFor(t, 15*time.Second, "one globalsync leading", func() bool {
		leader, follower = nil, nil
		for _, gs := range d.GlobalSyncs {
			if leads(gs) {
				if leader != nil {
					return false
				}
				leader = gs
			} else {
				follower = gs
			}
		}
		return leader != nil && follower != nil
	})
	shares := sample(d, shareOf("k1"))
	sleepUntil(nextWindow(window, time.Second).Add(time.Second))
	oldSeq, _ := budgetSeq(leader)
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	killAt := time.Now()
	harness.WaitFor(t, 15*time.Second, follower.Name+" taking the lead", func() bool { return leads(follower) })
	took := time.Since(killAt)
	t.Logf("%s killed at %s (budgets seq %d); %s leads %v later", leader.Name, killAt.Format("15:04:05.000"), oldSeq, follower.Name, took.Round(time.Millisecond))
	if bound := leaderTTL + 500*time.Millisecond + 2*rebalance + 3*time.Second; took > bound {
		t.Errorf("%s took the lead %v after the leader died; want within the leader TTL and a rebalance (%v, with room for a busy machine)",
			follower.Name, took, bound)
	}
	harness.WaitFor(t, 10*time.Second, follower.Name+" publishing budgets", func() bool {
		seq, by := budgetSeq(follower)
		return by == follower.Name && seq > oldSeq
	})
	sleepUntil(killAt.Add(leaseTTL + 2*time.Second)) // past every lease the dead leader issued
	for rep, rds := range shares.stop() {
		lowest, n, unanswered := math.Inf(1), 0, 0
		for _, rd := range rds {
			if !rd.ok {
				unanswered++
				continue
			}
			n++
			if rd.v < lowest {
				lowest = rd.v
			}
			if rd.v <= floor+0.01 {
				t.Errorf("%s: its share fell to %.4f (floor %.4f) at %s, %v after the leader was killed: its lease lapsed",
					rep, rd.v, floor, rd.at.Format("15:04:05.000"), rd.at.Sub(killAt).Round(time.Millisecond))
				break
			}
		}
		t.Logf("%s: lowest share %.4f in %d readings, %d unanswered", rep, lowest, n, unanswered)
		if n == 0 {
			t.Errorf("%s never answered /v1/usage while the leader changed", rep)
		}
	}

	last, got := settle(t, d, st, ld, window, 0, fixedLimit(limit))
	checkUsage(t, d, "k1", last, got[last])
	noOverAdmission(t, d)
}

// leads reports whether a globalsync says, on /v1/dashboard, that it leads.
func leads(gs *harness.Daemon) bool {
	var dash struct {
		Leader bool `json:"leader"`
	}
	return getJSON("http://"+gs.HTTPAddr+"/v1/dashboard", &dash) == nil && dash.Leader
}

// budgetSeq returns the rebalance number and the leader of the last
// leases of rule g a globalsync published, from /v1/budgets.
func budgetSeq(gs *harness.Daemon) (uint64, string) {
	var docs []struct {
		Rule   string `json:"rule"`
		Seq    uint64 `json:"seq"`
		Leader string `json:"leader"`
	}
	if getJSON("http://"+gs.HTTPAddr+"/v1/budgets", &docs) != nil {
		return 0, ""
	}
	for _, doc := range docs {
		if doc.Rule == "g" {
			return doc.Seq, doc.Leader
		}
	}
	return 0, ""
}

// reading is one sample of a figure a replica reports.
type reading struct {
	at time.Time
	v  float64
	ok bool // the replica answered
}

// sampler asks every replica for a figure every 100ms, until stop.
type sampler struct {
	mu       sync.Mutex
	readings map[string][]reading // by replica
	done     chan struct{}
	wg       sync.WaitGroup
}

func sample(d *harness.Deployment, figure func(*harness.DeployedRegion, *harness.Daemon) (float64, bool)) *sampler {
	s := &sampler{readings: map[string][]reading{}, done: make(chan struct{})}
	for _, r := range d.Regions {
		for _, rep := range r.Replicas {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-s.done:
						return
					case <-tick.C:
					}
					v, ok := figure(r, rep)
					s.mu.Lock()
					s.readings[rep.Name] = append(s.readings[rep.Name], reading{at: time.Now(), v: v, ok: ok})
					s.mu.Unlock()
				}
			}()
		}
	}
	return s
}

// stop ends the sampling and returns every replica's readings, oldest
// first.
func (s *sampler) stop() map[string][]reading {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readings
}

// shareOf is the share of the limit a replica enforces (its region's
// lease's, or its floor), for sample.
func shareOf(key string) func(*harness.DeployedRegion, *harness.Daemon) (float64, bool) {
	return func(r *harness.DeployedRegion, rep *harness.Daemon) (float64, bool) {
		s := ownShare(r, rep, key)
		return s, s >= 0
	}
}

// limitOf is the limit a replica enforces, for sample.
func limitOf(key string) func(*harness.DeployedRegion, *harness.Daemon) (float64, bool) {
	return func(_ *harness.DeployedRegion, rep *harness.Daemon) (float64, bool) {
		u, err := usageOf(rep, key)
		return float64(u.Limit), err == nil
	}
}

// TestRulesChangeDuringPartition: ap is cut off, and the rules change
// under load: the strict limit goes from 600 to 300. us and eu put the
// new limit in force within seconds (within 2s, docs/design.md) and keep it; ap keeps
// the old rules while cut off and takes the new ones once healed, and
// keeps them. Every window holds the limit in force: 600 in windows that
// started before the change, 300 in those that started after it was in
// force in the connected regions.
func TestRulesChangeDuringPartition(t *testing.T) {
	const window = 5 * time.Second
	const oldLimit, newLimit = 600, 300
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu", "ap"}, GlobalSyncs: 1,
		Rules: []byte(strictRules(oldLimit, window)), GlobalSyncArgs: []string{"--lease-ttl", "3s"}})
	st := openStores(t, d)
	ld := startLoad(t, d, "k1", window, perRegionRate)
	waitLeases(t, d, "k1", reserve/3, 30*time.Second)
	limits := sample(d, limitOf("k1"))
	defer limits.stop()

	// Cut ap off 4.5s before a window starts, so that its lease (3s) has
	// lapsed when the first window under the new limit starts: a lease
	// of the higher limit still in force in a region cut off, while the
	// others enforce the lower one, may over-admit in that window
	// (docs/design.md, Partitions: not yet kept).
	sleepUntil(nextWindow(window, 5*time.Second).Add(-4500 * time.Millisecond))
	if err := d.Partition("ap"); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	sleepUntil(cutAt.Add(time.Second))
	if err := d.PublishRules([]byte(strictRules(newLimit, window))); err != nil {
		t.Fatal(err)
	}
	pubAt := time.Now()
	enforcing := func(names ...string) func() bool {
		return func() bool {
			for _, name := range names {
				for _, rep := range d.Region(name).Replicas {
					if u, err := usageOf(rep, "k1"); err != nil || u.Limit != newLimit {
						return false
					}
				}
			}
			return true
		}
	}
	harness.WaitFor(t, 15*time.Second, "us and eu enforcing the new limit", enforcing("us", "eu"))
	inForce := time.Now()
	t.Logf("the rules published at %s; the new limit in force in us and eu %v later", pubAt.Format("15:04:05.000"),
		inForce.Sub(pubAt).Round(time.Millisecond))

	// A whole window with the new limit in force in us and eu, ap cut off.
	sleepUntil(nextWindow(window, 0).Add(window + 500*time.Millisecond))
	if err := d.Heal(); err != nil {
		t.Fatal(err)
	}
	healAt := time.Now()
	t.Logf("ap cut off from %s to %s", cutAt.Format("15:04:05.000"), healAt.Format("15:04:05.000"))
	harness.WaitFor(t, 15*time.Second, "ap enforcing the new limit after the heal", enforcing("ap"))
	t.Logf("the new limit in force in ap %v after the heal", time.Since(healAt).Round(time.Millisecond))

	limit := func(start int64) int64 {
		if start >= inForce.UnixMilli() {
			return newLimit
		}
		return oldLimit // the window started under the old limit
	}
	last, got := settle(t, d, st, ld, window, window, limit)

	// What each replica enforced, all along: the new limit from within a
	// few seconds of the change (ap: of the heal) and never the old again;
	// ap the old limit while cut off.
	for rep, rds := range limits.stop() {
		region := rep[:2]
		from := pubAt // when the new limit is due
		if region == "ap" {
			from = healAt
		}
		var first time.Time // the new limit first seen
		for _, rd := range rds {
			if !rd.ok {
				continue
			}
			switch {
			case region == "ap" && rd.at.After(cutAt.Add(200*time.Millisecond)) && rd.at.Before(healAt) && rd.v != oldLimit:
				t.Errorf("%s, cut off, enforced a limit of %v at %s: want the old rules' %d until it hears of the new",
					rep, rd.v, rd.at.Format("15:04:05.000"), oldLimit)
			case rd.at.Before(from):
			case first.IsZero() && rd.v == newLimit:
				first = rd.at
			case !first.IsZero() && rd.v != newLimit:
				t.Errorf("%s enforced the new limit from %s but a limit of %v again at %s",
					rep, first.Format("15:04:05.000"), rd.v, rd.at.Format("15:04:05.000"))
				first = time.Time{}
			}
		}
		if first.IsZero() {
			t.Errorf("%s did not end enforcing the new limit", rep)
		} else if took := first.Sub(from); took > 4*time.Second {
			t.Errorf("%s enforced the new limit %v after it was due, want within 4s (the 2s rules take to reach every region, and a gateway's redial after a heal)", rep, took.Round(time.Millisecond))
		}
	}
	checkUsage(t, d, "k1", last, got[last])
	noOverAdmission(t, d)
}

// TestStrictLimitThroughRedisStalls: one tenant sends far over a strict
// global limit, with the default fallback, to us's two replicas alone;
// us's Redis stalls past the replicas' timeout (its link slowed to 0.8 s
// each way) for 1.5s at the start of two windows, while us still
// has most of its allowance. The replicas keep to their parts of what us
// may still admit, counted in memory; no window admits more than the
// limit; once the store answers, what they admitted without it is in us's
// slot — counted once: the calls that reached Redis late did nothing, and
// those it ran just before a stall are given back when their replies
// come — the regions agree on it, and globalsync finds no over-admission.
func TestStrictLimitThroughRedisStalls(t *testing.T) {
	const limit, window = 300, 10 * time.Second
	rules := fmt.Sprintf(`rules:
  - { id: g, match: { api_key: "k*" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: %d, window: %s }
`, limit, window)
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu", "ap"}, GlobalSyncs: 1, Rules: []byte(rules), RedisLinks: true})
	st := openStores(t, d)
	ld := startLoadAt(t, d, "k1", window, map[string]int{"us": 240})
	ld.ledger.degradedOK = true
	us := d.Region("us")
	for range 2 {
		b := nextWindow(window, 2*time.Second)
		sleepUntil(b.Add(200 * time.Millisecond))
		// 0.8 s each way: every call times out (50 ms), and every reply
		// comes within the 2 s a pipeline waits for a late one past its
		// deadline, however loaded the machine (at 1 s each way a reply
		// came right at the edge of it, and a late one was counted twice:
		// design.md, A store that fails, what this leaves uncovered).
		if err := us.RedisLink.SetLatency(800 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
		sleepUntil(b.Add(1700 * time.Millisecond))
		if err := us.RedisLink.SetLatency(0); err != nil {
			t.Fatal(err)
		}
		t.Logf("us's Redis stalled from %s to %s; us had admitted %d of the window before", b.Add(200*time.Millisecond).Format("15:04:05.000"),
			b.Add(1700*time.Millisecond).Format("15:04:05.000"), ld.ledger.admittedBefore("us", b.UnixMilli(), b.Add(200*time.Millisecond)))
	}
	settle(t, d, st, ld, window, window, fixedLimit(limit))
	if _, _, degraded := ld.ledger.outcomes(); degraded["us"] == 0 {
		t.Error("us admitted nothing without its store: the stalls tested nothing")
	}
	noOverAdmission(t, d)
}
