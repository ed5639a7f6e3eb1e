package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// toxiproxy's latency toxic, interrupted while a connection
		// closes, may block for good handing its last chunk on: its
		// leak, in the test's fault proxy, not ours.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// region is one region's regiond in this process: Redis store, engine,
// gossip, and the budget watcher.
type region struct {
	name        string
	store       *regional.RedisStore
	engine      *regional.Engine
	redis       *harness.Redis
	reconnected chan time.Time
}

// gossipInterval is the regions' gossip interval in these tests.
const gossipInterval = 100 * time.Millisecond

func startRegion(t *testing.T, name, natsURL string, regions []string, rules string) *region {
	t.Helper()
	return startRegionGossiping(t, name, natsURL, regions, rules, gossipInterval)
}

// startRegionGossiping is startRegion with a gossip interval of its own.
func startRegionGossiping(t *testing.T, name, natsURL string, regions []string, rules string, interval time.Duration) *region {
	t.Helper()
	return startReplica(t, name, natsURL, regions, rules, interval, harness.NewRedis(t, harness.RedisOptions{}))
}

// startReplica starts one replica of a region on the region's Redis.
func startReplica(t *testing.T, name, natsURL string, regions []string, rules string, interval time.Duration, srv *harness.Redis) *region {
	t.Helper()
	store, err := regional.NewRedisStore(t.Context(), srv.URL(), regional.RedisOptions{Region: name, Timeout: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rs, err := regional.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	r := &region{name: name, store: store, redis: srv}
	r.engine = regional.New(regional.Config{Region: name, Store: store, Logger: quiet(), Timeout: 250 * time.Millisecond,
		Global: regional.GlobalConfig{Regions: regions}}, rs)
	r.reconnected = make(chan time.Time, 16)
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case r.reconnected <- time.Now():
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	g, err := transport.StartGossip(nc, r.engine, transport.GossipConfig{Region: name, Interval: interval,
		Heartbeat: 100 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); transport.WatchBudgets(ctx, js, r.engine, quiet(), nil) }()
		go func() { defer wg.Done(); transport.WatchRules(ctx, js, r.engine, quiet(), nil) }()
		wg.Wait()
	}()
	t.Cleanup(func() { cancel(); <-done; g.Close(); nc.Close() })
	return r
}

func startService(t *testing.T, id, natsURL string, cfg Config) *Service {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID, cfg.Logger = id, quiet()
	s, err := Start(t.Context(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(s.Close); nc.Close() })
	return s
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.WaitFor(t, within, what, cond)
}

// load sends requests for key from the region while stop is open: as
// fast as it can while *rate is 0, else about *rate a second.
func (r *region) load(key string, rate *atomic.Int64, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		next := time.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var d regional.Decision
			r.engine.Check(context.Background(), &regional.Request{APIKey: key, Endpoint: "/x"}, &d)
			if n := rate.Load(); n > 0 {
				next = next.Add(time.Second / time.Duration(n))
				time.Sleep(time.Until(next)) // pacing the load, not waiting for a result
			} else {
				next = time.Now()
			}
		}
	}()
}

// windowTotal reads a window's slots from the region's Redis.
func (r *region) windowTotal(t *testing.T, key string, startMillis int64) map[string]int64 {
	slots, err := r.store.ReadGlobal(t.Context(), []byte("gq:{g:"+key+"}"), startMillis)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, s := range slots {
		out[s.Region] = int64(s.P) - int64(s.N)
	}
	return out
}

// strictRules is a strict global limit. It fails closed: on a busy machine
// a Redis call past its timeout must not admit without counting, as
// fail_open would — what a careful operator sets for a strict limit.
const strictRules = `
rules:
  - { id: g, match: { api_key: "k*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 600, window: 2s, fallback: fail_closed }
`

// TestBudgetsFollowDemand: two regions, demand far above a strict global
// limit in one and modest in the other. Once leases follow the demand,
// every window admits within 1% of the limit and never more; when the
// demand moves to the other region, the leases follow it within a few
// rebalances.
func TestBudgetsFollowDemand(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	regions := []string{"eu", "us"}
	eu := startRegion(t, "eu", ns.ClientURL(), regions, strictRules)
	us := startRegion(t, "us", ns.ClientURL(), regions, strictRules)
	startService(t, "gs1", ns.ClientURL(), Config{Regions: regions, Rebalance: 250 * time.Millisecond})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var euRate, usRate atomic.Int64
	usRate.Store(30) // 60 a window, a tenth of the limit; eu: as fast as it can
	eu.load("k1", &euRate, stop, &wg)
	us.load("k1", &usRate, stop, &wg)
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, 10*time.Second, "both regions hold leases", func() bool {
		_, _, a := eu.engine.Lease("g")
		_, _, b := us.engine.Lease("g")
		return a && b
	})
	const w = 2000 // the window, ms
	// judge checks n whole windows starting at or after from.
	judge := func(what string, from time.Time, n int) {
		t.Helper()
		first := (from.UnixMilli() + w - 1) / w * w
		time.Sleep(time.Until(time.UnixMilli(first + int64(n)*w + 300))) // the windows pass, gossip settles
		for i := range n {
			got := eu.windowTotal(t, "k1", first+int64(i)*w)
			total := got["eu"] + got["us"]
			t.Logf("%s: window %d: %v", what, i, got)
			if total > 600 {
				t.Fatalf("%s: window %d admitted %d, above the strict limit of 600", what, i, total)
			}
			if total < 594 {
				t.Fatalf("%s: window %d admitted %d, not within 1%% of 600", what, i, total)
			}
		}
	}
	judge("eu busy", time.Now().Add(3*time.Second), 3)

	// The demand moves to us; the leases follow.
	// Shift three rebalances before a window starts: the hardest case.
	next := time.Now().UnixMilli()/w*w + 2*w
	time.Sleep(time.Until(time.UnixMilli(next).Add(-3 * 250 * time.Millisecond)))
	shift := time.Now()
	euRate.Store(30)
	usRate.Store(0)
	// Every window that starts three rebalances after the shift is full
	// again. (Within the window of the shift, eu had already used its
	// share: strict mode cannot give that away.)
	judge("us busy", shift.Add(3*250*time.Millisecond), 2)
	if l, _, _ := us.engine.Lease("g"); l.Allowance() < 0.85 {
		t.Fatalf("us's lease after the shift: %+v", l)
	}
}

// TestLeaderTakeover: two globalsync instances; the leader goes away and
// the other leads within one leader lease, knowing the leases in force;
// the regions' leases are renewed throughout and never lapse.
func TestLeaderTakeover(t *testing.T) {
	for _, binary := range []bool{false, true} {
		t.Run(fmt.Sprintf("binary=%v", binary), func(t *testing.T) { testLeaderTakeover(t, binary) })
	}
}

// testLeaderTakeover runs on the embedded server and on Debian's
// nats-server (2.9), whose JetStream KV production deployments may run.
func testLeaderTakeover(t *testing.T, binary bool) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true, Binary: binary})
	regions := []string{"eu", "us"}
	eu := startRegion(t, "eu", ns.ClientURL(), regions, strictRules)
	cfg := Config{Regions: regions, Rebalance: 200 * time.Millisecond, LeaderTTL: time.Second}
	a := startService(t, "a", ns.ClientURL(), cfg)
	b := startService(t, "b", ns.ClientURL(), cfg)
	waitFor(t, 10*time.Second, "one leads", func() bool { return a.Leader() != b.Leader() })
	waitFor(t, 10*time.Second, "eu holds a lease", func() bool { _, _, ok := eu.engine.Lease("g"); return ok })
	leader, follower := a, b
	if b.Leader() {
		leader, follower = b, a
	}
	before, _, _ := eu.engine.Lease("g")
	gone := time.Now()
	leader.Close()
	waitFor(t, 5*time.Second, "the follower leads", follower.Leader)
	took := time.Since(gone)
	t.Logf("the follower led %v after the leader went away", took)
	// The lease, the skew allowance, a rebalance to notice, and room for
	// a busy machine; what matters more is below: eu's lease never lapses.
	if took > cfg.LeaderTTL+budget.DefaultConfig().Skew+time.Second {
		t.Fatalf("takeover took %v, want within the leader lease %v (and the skew allowance)", took, cfg.LeaderTTL)
	}
	waitFor(t, 5*time.Second, "eu's lease renewed by the new leader", func() bool {
		l, _, _ := eu.engine.Lease("g")
		if !l.Holds(time.Now()) {
			t.Fatalf("eu's lease lapsed during the takeover: %+v", l)
		}
		return l.Seq > before.Seq
	})
	for _, d := range follower.Budgets() {
		if d.Rule == "g" && d.Leader != follower.cfg.ID {
			t.Fatalf("budgets published by %q, want the new leader %q", d.Leader, follower.cfg.ID)
		}
	}
}

// TestRulesReachRegions: rules globalsync publishes are in force in every
// region within 2 seconds; rules that do not compile are not published,
// and the regions keep the last good ones.
func TestRulesReachRegions(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	regions := []string{"eu", "us"}
	eu := startRegion(t, "eu", ns.ClientURL(), regions, strictRules)
	us := startRegion(t, "us", ns.ClientURL(), regions, strictRules)
	var yaml atomic.Value
	yaml.Store([]byte(strings.Replace(strictRules, "limit: 600", "limit: 700", 1)))
	svc := startService(t, "gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 200 * time.Millisecond,
		RulesYAML: func() ([]byte, error) { return yaml.Load().([]byte), nil }})
	limitIs := func(n int64) func() bool {
		return func() bool {
			for _, r := range []*region{eu, us} {
				if g := r.engine.Rules().Rule("g"); g == nil || g.Base.Limit != n {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 10*time.Second, "the first rules published", limitIs(700))
	yaml.Store([]byte(strings.Replace(strictRules, "limit: 600", "limit: 900", 1)))
	changed := time.Now()
	waitFor(t, 5*time.Second, "the changed rules in force", limitIs(900))
	took := time.Since(changed)
	t.Logf("changed rules in force in every region %v after they changed", took)
	if took > 2*time.Second {
		t.Errorf("rules took %v to reach every region, want within 2s", took)
	}
	yaml.Store([]byte("rules: [ { id: broken, algorithm: nonsense } ]"))
	time.Sleep(600 * time.Millisecond) // three rebalances: the bad rules would be out by now
	if !limitIs(900)() {
		t.Fatal("invalid rules reached a region")
	}
	if !svc.Leader() {
		t.Fatal("the only globalsync does not lead")
	}
}

// TestGlobalSyncAPI serves geoquota.v1.GlobalSync over gRPC on loopback:
// the global usage of a window as merged from the regions, the leases,
// and the regions; bad input is InvalidArgument naming the field.
func TestGlobalSyncAPI(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	regions := []string{"eu", "us"}
	eu := startRegion(t, "eu", ns.ClientURL(), regions, strictRules)
	startRegion(t, "us", ns.ClientURL(), regions, strictRules)
	svc := startService(t, "gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 200 * time.Millisecond})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterGlobalSyncServer(srv, grpcServer{s: svc})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := pb.NewGlobalSyncClient(conn)
	ctx := t.Context()

	waitFor(t, 10*time.Second, "eu holds a lease", func() bool { _, _, ok := eu.engine.Lease("g"); return ok })
	for range 7 {
		var d regional.Decision
		eu.engine.Check(ctx, &regional.Request{APIKey: "k7", Endpoint: "/x"}, &d)
	}
	var u *pb.GetGlobalUsageResponse
	waitFor(t, 10*time.Second, "globalsync's copy has eu's 7", func() bool {
		u, err = client.GetGlobalUsage(ctx, &pb.GetGlobalUsageRequest{Rule: "g", Key: "k7"})
		return err == nil && u.GetGlobalUsed() == 7
	})
	if len(u.Regions) != 2 || u.Regions[0].Region != "eu" || u.Regions[0].Used != 7 || u.Regions[0].Share <= 0 || u.Regions[1].Used != 0 {
		t.Fatalf("GetGlobalUsage: %v", u)
	}
	// A region's own usage report knows the other regions' shares too,
	// from the leases it watches.
	waitFor(t, 5*time.Second, "eu knows us's share", func() bool {
		ru, err := eu.engine.Usage(ctx, "g", &regional.Request{APIKey: "k7", Endpoint: "/x"})
		return err == nil && len(ru.Regions) == 2 && ru.Regions[1].Region == "us" && ru.Regions[1].Share > 0 && ru.GlobalUsed == 7
	})
	b, err := client.GetBudgets(ctx, &pb.GetBudgetsRequest{})
	if err != nil || len(b.Budgets) != 1 || b.Budgets[0].Rule != "g" || len(b.Budgets[0].Leases) != 2 || !b.Budgets[0].Leases[0].Valid {
		t.Fatalf("GetBudgets: %v, %v", b, err)
	}
	lr, err := client.ListRegions(ctx, &pb.ListRegionsRequest{})
	if err != nil || !lr.Leader || len(lr.Regions) != 2 || lr.Regions[0].PartitionSuspected || lr.Regions[0].Replicas != 1 || len(lr.Regions[0].Leases) != 1 {
		t.Fatalf("ListRegions: %v, %v", lr, err)
	}
	for _, in := range []*pb.GetGlobalUsageRequest{{Key: "k7"}, {Rule: "g"}} {
		_, err := client.GetGlobalUsage(ctx, in)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("GetGlobalUsage(%v): %v, want InvalidArgument", in, err)
		}
	}
	if _, err := client.GetGlobalUsage(ctx, &pb.GetGlobalUsageRequest{Rule: "nope", Key: "k"}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetGlobalUsage of an unknown rule: %v, want NotFound", err)
	}

	// The dashboard: a page that loads nothing from elsewhere, and the
	// figures it draws.
	web := httptest.NewServer(httpHandler(svc, prometheus.NewRegistry(), "gs"))
	t.Cleanup(web.Close)
	hc := web.Client()
	res, err := hc.Get(web.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(string(page), "<title>geoquota globalsync</title>") || !strings.Contains(string(page), `fetch("/v1/dashboard"`) {
		t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if rest := strings.ReplaceAll(string(page), "http://www.w3.org/2000/svg", ""); strings.Contains(rest, "http://") || strings.Contains(rest, "https://") {
		t.Fatal("the dashboard page refers to another site")
	}
	var dash Dashboard
	waitFor(t, 10*time.Second, "the dashboard has eu's lease and admissions", func() bool {
		res, err := hc.Get(web.URL + "/v1/dashboard")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		dash = Dashboard{}
		if json.NewDecoder(res.Body).Decode(&dash) != nil || len(dash.Regions) != 2 {
			return false
		}
		shared, admitted := false, false
		for _, smp := range dash.History {
			p := smp.Rules["g"]["eu"]
			shared = shared || (p.Share > 0 && p.Valid)
			admitted = admitted || p.Admitted > 0
		}
		return shared && admitted
	})
	if !dash.Leader || dash.ID != "gs" || dash.Regions[0].Region != "eu" || dash.Interval != 200 {
		t.Fatalf("dashboard: %+v", dash)
	}
	if res, err := hc.Get(web.URL + "/nothing"); err != nil || res.StatusCode != 404 {
		t.Fatalf("GET /nothing: %v, want 404", err)
	} else {
		res.Body.Close()
	}
}

// TestTwoReplicasInARegion: eu runs two replicas on one Redis, each with
// its own gossip and heartbeat; globalsync adds their demand up and waits
// for both to acknowledge a lease. Under load far above a strict limit in
// both regions, no window admits more than the limit, and the leases still
// fill it.
func TestTwoReplicasInARegion(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	regions := []string{"eu", "us"}
	eu1 := startRegion(t, "eu", ns.ClientURL(), regions, strictRules)
	eu2 := startReplica(t, "eu", ns.ClientURL(), regions, strictRules, gossipInterval, eu1.redis)
	us := startRegion(t, "us", ns.ClientURL(), regions, strictRules)
	svc := startService(t, "gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 250 * time.Millisecond})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var unlimited, slow atomic.Int64
	slow.Store(200) // us: 400 a window, above half the limit: both regions want more than they get
	eu1.load("k1", &unlimited, stop, &wg)
	eu2.load("k1", &unlimited, stop, &wg)
	us.load("k1", &slow, stop, &wg)
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, 10*time.Second, "eu's replicas hold leases", func() bool {
		_, _, a := eu1.engine.Lease("g")
		_, _, b := eu2.engine.Lease("g")
		return a && b
	})
	waitFor(t, 10*time.Second, "globalsync counts two replicas in eu", func() bool {
		for _, st := range svc.Regions() {
			if st.Region == "eu" {
				return st.Replicas == 2
			}
		}
		return false
	})
	const w = 2000
	time.Sleep(3 * time.Second) // the leases follow the demand
	first := time.Now().UnixMilli()/w*w + w
	time.Sleep(time.Until(time.UnixMilli(first + 3*w + 300)))
	for i := range 3 {
		got := us.windowTotal(t, "k1", first+int64(i)*w)
		total := got["eu"] + got["us"]
		t.Logf("window %d: %v", i, got)
		if total > 600 {
			t.Fatalf("window %d admitted %d, above the strict limit of 600", i, total)
		}
		if total < 594 {
			t.Fatalf("window %d admitted %d, not within 1%% of 600", i, total)
		}
	}
}

// TestBooksUseTheLimitOfTheirWindow: a window is judged against the
// highest limit in force while it ran: one that ended before a cut from
// 600 to 300 against 600, the one the cut fell in against 600 too, the
// windows after it against 300.
func TestBooksUseTheLimitOfTheirWindow(t *testing.T) {
	rules := func(limit int) *regional.RuleSet {
		rs, err := regional.Parse("rules.yaml", fmt.Appendf(nil, "rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: %d, window: 10s }\n", limit))
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	cut := time.Date(2026, 1, 1, 0, 0, 15, 0, time.UTC)
	s := &Service{rulesSet: rules(300), earlierRules: []earlierRules{{rules(600), cut}}}
	key := "gq:{g:k1}"
	for _, tc := range []struct {
		start time.Time
		want  int64
	}{
		{cut.Add(-15 * time.Second), 600},
		{cut.Add(-5 * time.Second), 600},
		{cut.Add(5 * time.Second), 300},
	} {
		if got := s.limitDuring(key, 300, tc.start); got != tc.want {
			t.Errorf("window from %v: limit %d, want %d", tc.start.Format(time.TimeOnly), got, tc.want)
		}
	}
}

// TestHigherFloorsOfRegionsOnAnOldLimit: a region whose replicas last
// reported enforcing 600 when the limit is now 300 is left twice its
// floor; one on the current limit, or silent for longer than globalsync
// remembers, is not.
func TestHigherFloorsOfRegionsOnAnOldLimit(t *testing.T) {
	rs, err := regional.Parse("rules.yaml", []byte("rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 300, window: 10s }\n"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rep := func(region string, limit int64, heard time.Time) *replica {
		return &replica{region: region, heard: heard, rules: map[string]*demandTrack{"g": {last: transport.RuleReport{Limit: limit}}}}
	}
	s := &Service{cfg: Config{Budget: budget.DefaultConfig()}, rulesSet: rs, replicas: map[string]*replica{
		"ap-1": rep("ap", 600, now.Add(-30*time.Second)), // cut off before the change
		"ap-2": rep("ap", 300, now),
		"eu-1": rep("eu", 300, now),
		"us-1": rep("us", 900, now.Add(-time.Hour)), // gone
	}}
	regions := []string{"ap", "eu", "us"}
	got := s.higherFloors("g", regions, now)
	floor := budget.DefaultConfig().Floor(3)
	if len(got) != 1 || math.Abs(got["ap"]-2*floor) > 1e-9 {
		t.Fatalf("higher floors %v, want ap's alone at %v", got, 2*floor)
	}
}
