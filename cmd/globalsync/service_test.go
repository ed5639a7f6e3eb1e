package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/control"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
	"github.com/geoquota/geoquota/transport/gossip"
	"github.com/geoquota/geoquota/transport/namespace"
)

// The tests here check the daemon's glue: NATS, JetStream KV, the leader's
// compare-and-swap, gRPC, HTTP and the dashboard, against real servers.
// Time is the tests' own (a clock they move, every daemon part ticked by
// hand): only NATS's deliveries take real time, and the tests wait for
// them. What globalsync decides is budget/coord's, tested in its scripts
// and, with every region, in the simulator.

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// world is a test's time, and every part it ticks.
type world struct {
	t        *testing.T
	mu       sync.Mutex
	now      time.Time
	regions  []*region
	services []*Service
	names    namespace.Names // the deployment of every region and service
}

func newWorld(t *testing.T) *world { return &world{t: t, now: time.Now()} }

func (w *world) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

// step moves time on by d and ticks every part: the regions' gossip
// (their heartbeats), then every service and its gossip.
func (w *world) step(d time.Duration) {
	w.mu.Lock()
	w.now = w.now.Add(d)
	regions, services := w.regions, w.services
	w.mu.Unlock()
	for _, r := range regions {
		if !r.silent.Load() {
			r.gossip.Tick()
		}
	}
	for _, s := range services {
		if s.closed.Load() {
			continue
		}
		s.Gossip().Tick()
		s.Tick(w.t.Context())
	}
}

// waitFor steps time by d until cond holds, or fails after a while of real
// time (NATS's deliveries).
func (w *world) waitFor(d time.Duration, what string, cond func() bool) {
	w.t.Helper()
	harness.WaitFor(w.t, 20*time.Second, what, func() bool {
		w.step(d)
		return cond()
	})
}

// lockstep steps time by d, then waits in real time until NATS has
// delivered what the step sent: every service has heard every region's
// heartbeat of this step, and every region holds each leader's newest
// leases. Time then runs no faster than NATS delivers, however loaded the
// machine, so that no region goes stale, and no lease lapses, only
// because a delivery took longer than the test's steps. For tests in
// which every region speaks and every service runs.
func (w *world) lockstep(d time.Duration) {
	w.t.Helper()
	w.step(d)
	now := w.clock()
	w.mu.Lock()
	regions, services := w.regions, w.services
	w.mu.Unlock()
	harness.WaitFor(w.t, 20*time.Second, "every region heard and every lease delivered", func() bool {
		for _, s := range services {
			for _, r := range regions {
				if at, ok := s.Gossip().Node().LastHeard(r.name); !ok || at.Before(now) {
					return false
				}
			}
			for _, doc := range s.Budgets() {
				for _, r := range regions {
					if l, _, ok := r.engine.Lease(doc.Rule); !ok || l.Seq < doc.Seq {
						return false
					}
				}
			}
		}
		return true
	})
}

// region is one regiond replica in this process: an engine on memory, its
// gossip, and its budget and rules watchers. A silent one sends nothing
// (no heartbeat, no delta): globalsync no longer hears it.
type region struct {
	name   string
	engine *regional.Engine
	gossip *control.Gossip
	silent atomic.Bool
}

// strictRules is a strict global limit.
const strictRules = `
rules:
  - { id: g, match: { api_key: "k*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 600, window: 2s }
`

func (w *world) region(name, natsURL string, regions []string, rules string) *region {
	t := w.t
	t.Helper()
	rs, err := regional.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	r := &region{name: name}
	// The regions here hear each other only when a test steps time: a
	// lag of 1 µs keeps elastic borrowing from holding back what the
	// other may have admitted meanwhile, whatever the phase of the window.
	r.engine = regional.New(regional.Config{Region: name, Clock: w.clock, Logger: quiet(),
		Global: regional.GlobalConfig{Regions: regions, Lag: time.Microsecond}}, rs)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	node, err := gossip.New(gossip.Config{Region: name, Replica: name + "-1", Instance: control.NewInstance(), Heartbeat: 100 * time.Millisecond,
		Counters: r.engine, Engine: r.engine, Names: w.names}, w.clock())
	if err != nil {
		t.Fatal(err)
	}
	if r.gossip, err = control.StartGossip(nc, node, control.GossipOptions{Clock: w.clock, Manual: true, Logger: quiet()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.gossip.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { control.WatchBudgets(ctx, js, node.Names(), r.engine, quiet(), nil) })
	wg.Go(func() { control.WatchRules(ctx, js, node.Names(), r.engine, quiet(), nil) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	w.mu.Lock()
	w.regions = append(w.regions, r)
	w.mu.Unlock()
	return r
}

// service starts a globalsync instance, ticked by the world.
func (w *world) service(id, natsURL string, cfg Config) *Service {
	t := w.t
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID, cfg.Logger, cfg.Clock, cfg.Manual, cfg.Names = id, quiet(), w.clock, true, w.names
	s, err := Start(t.Context(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); nc.Close() })
	w.mu.Lock()
	w.services = append(w.services, s)
	w.mu.Unlock()
	return s
}

func (r *region) lease() (budget.Lease, bool) {
	l, _, ok := r.engine.Lease("g")
	return l, ok
}

// TestLeaderTakeover: two globalsync instances; the leader goes away and
// the other leads once the leader's claim has lapsed, knowing the leases
// in force; the region's lease is renewed throughout and never lapses. On
// the embedded server and on Debian's nats-server (2.9), whose JetStream
// KV production deployments may run.
func TestLeaderTakeover(t *testing.T) {
	for _, binary := range []bool{false, true} {
		t.Run(fmt.Sprintf("binary=%v", binary), func(t *testing.T) { testLeaderTakeover(t, binary) })
	}
}

func testLeaderTakeover(t *testing.T, binary bool) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true, Binary: binary})
	w := newWorld(t)
	regions := []string{"eu", "us"}
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	cfg := Config{Regions: regions, Rebalance: 200 * time.Millisecond, LeaderTTL: time.Second}
	a := w.service("a", ns.ClientURL(), cfg)
	b := w.service("b", ns.ClientURL(), cfg)
	w.waitFor(100*time.Millisecond, "one leads", func() bool { return a.Leader() != b.Leader() })
	w.waitFor(100*time.Millisecond, "eu holds a lease", func() bool { _, ok := eu.lease(); return ok })
	leader, follower := a, b
	if b.Leader() {
		leader, follower = b, a
	}
	before, _ := eu.lease()
	gone := w.clock()
	leader.Close()
	w.waitFor(100*time.Millisecond, "the follower leads", follower.Leader)
	took := w.clock().Sub(gone)
	t.Logf("the follower led %v after the leader went away", took)
	// The claim, the skew allowance, and a step to notice.
	if limit := cfg.LeaderTTL + budget.DefaultConfig().Skew + 100*time.Millisecond; took > limit {
		t.Fatalf("takeover took %v, want within the leader's claim and the skew allowance (%v)", took, limit)
	}
	w.waitFor(100*time.Millisecond, "eu's lease renewed by the new leader", func() bool {
		l, _ := eu.lease()
		if !l.Holds(w.clock()) {
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
// region within 2 seconds (of real time: the bucket's and the push's
// deliveries); rules that do not compile are not published, and the
// regions keep the last good ones.
func TestRulesReachRegions(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"eu", "us"}
	eu := w.region("eu", ns.ClientURL(), regions, strictRules)
	us := w.region("us", ns.ClientURL(), regions, strictRules)
	var yaml atomic.Value
	yaml.Store([]byte(strings.Replace(strictRules, "limit: 600", "limit: 700", 1)))
	svc := w.service("gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 200 * time.Millisecond,
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
	w.waitFor(200*time.Millisecond, "the first rules published", limitIs(700))
	yaml.Store([]byte(strings.Replace(strictRules, "limit: 600", "limit: 900", 1)))
	changed := time.Now()
	w.step(200 * time.Millisecond) // the tick that publishes them
	harness.WaitFor(t, 5*time.Second, "the changed rules in force", limitIs(900))
	took := time.Since(changed)
	t.Logf("changed rules in force in every region %v after the tick that publishes them began", took)
	if took > 2*time.Second {
		t.Errorf("rules took %v to reach every region, want within 2s", took)
	}
	yaml.Store([]byte("rules: [ { id: broken, algorithm: nonsense } ]"))
	for range 3 {
		w.step(200 * time.Millisecond) // three rebalances: the bad rules would be published by now
	}
	// A marker, pushed after: once it is in force, the bad rules would have been.
	if err := control.PushRules(svc.nc, svc.subjects, 1<<40, []byte(strings.Replace(strictRules, "limit: 600", "limit: 901", 1))); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 5*time.Second, "the marker in force", limitIs(901))
	if !svc.Leader() {
		t.Fatal("the only globalsync does not lead")
	}
	rev, _ := svc.rulesKV.Get(t.Context(), control.RulesKey)
	if rev == nil || strings.Contains(string(rev.Value()), "broken") {
		t.Fatal("invalid rules were published")
	}
}

// TestStrictRulesNotPublished: envoyproxy/ratelimit's example directory,
// whose metadata geoquota reads and does not enforce, is published as it
// is, unless StrictRules (--rules-strict), which refuses it naming each
// metadata and publishes nothing.
func TestStrictRulesNotPublished(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	src, err := regional.ReadRules("../../regional/testdata/ratelimit-examples")
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	read := func() ([]byte, error) { return src, nil }
	strict := w.service("strict", ns.ClientURL(), Config{Regions: []string{"eu"}, StrictRules: true, RulesYAML: read})
	err = strict.publishRules(t.Context(), w.clock())
	if err == nil || !strings.Contains(err.Error(), "--rules-strict: ") ||
		!strings.Contains(err.Error(), `rule "rl.service_service_1": descriptors[5].metadata: not enforced`) ||
		!strings.Contains(err.Error(), `rule "rl.service_service_2": descriptors[6].metadata: not enforced`) {
		t.Fatalf("strict: %v", err)
	}
	if _, err := strict.rulesKV.Get(t.Context(), control.RulesKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("strict: rules published (%v)", err)
	}
	lenient := w.service("lenient", ns.ClientURL(), Config{Regions: []string{"eu"}, RulesYAML: read})
	if err := lenient.publishRules(t.Context(), w.clock()); err != nil {
		t.Fatal(err)
	}
	if en, err := lenient.rulesKV.Get(t.Context(), control.RulesKey); err != nil || !bytes.Equal(en.Value(), src) {
		t.Fatalf("not strict: rules not published (%v)", err)
	}
}

// TestDeploymentsApart: two deployments (--deployment a and b) on one
// NATS server, each with the same regions and a globalsync: each
// globalsync leads its own, and each deployment's regions hold their own
// globalsync's rules and leases, none of the other's.
func TestDeploymentsApart(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	regions := []string{"eu", "us"}
	type deployment struct {
		w     *world
		limit int64
		svc   *Service
		rs    []*region
	}
	var ds []*deployment
	for i, name := range []string{"a", "b"} {
		names, err := namespace.New(name)
		if err != nil {
			t.Fatal(err)
		}
		d := &deployment{w: newWorld(t), limit: int64(700 + 100*i)}
		d.w.names = names
		for _, r := range regions {
			d.rs = append(d.rs, d.w.region(r, ns.ClientURL(), regions, strictRules))
		}
		yaml := []byte(strings.Replace(strictRules, "limit: 600", fmt.Sprintf("limit: %d", d.limit), 1))
		d.svc = d.w.service("gs-"+name, ns.ClientURL(), Config{Regions: regions, Rebalance: 200 * time.Millisecond,
			RulesYAML: func() ([]byte, error) { return yaml, nil }})
		ds = append(ds, d)
	}
	for _, d := range ds {
		d.w.waitFor(200*time.Millisecond, "globalsync "+d.svc.cfg.ID+" leads", d.svc.Leader)
		d.w.waitFor(200*time.Millisecond, "its rules and leases in its regions", func() bool {
			for _, r := range d.rs {
				if g := r.engine.Rules().Rule("g"); g == nil || g.Base.Limit != d.limit {
					return false
				}
				if _, ok := r.lease(); !ok {
					return false
				}
			}
			return true
		})
	}
	for _, d := range ds {
		if !d.svc.Leader() {
			t.Errorf("%s no longer leads: the other deployment's claim reached it", d.svc.cfg.ID)
		}
		for _, r := range d.rs {
			if g := r.engine.Rules().Rule("g"); g.Base.Limit != d.limit {
				t.Errorf("%s of %s: limit %d, want its own globalsync's %d", r.name, d.w.names.Deployment(), g.Base.Limit, d.limit)
			}
		}
		for _, b := range d.svc.Budgets() {
			if b.Leader != d.svc.cfg.ID {
				t.Errorf("deployment %s holds a budget of %s", d.w.names.Deployment(), b.Leader)
			}
		}
	}
}

// TestGlobalSyncAPI serves geoquota.v1.GlobalSync over gRPC on loopback:
// the global usage of a window as merged from the regions, the leases,
// and the regions; bad input is InvalidArgument naming the field. And the
// dashboard's page and data over HTTP.
func TestGlobalSyncAPI(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	regions := []string{"eu", "us"}
	// An hour's window: the 7 checks below stay in the window that is
	// asked about however many steps NATS's deliveries take.
	rules := strings.Replace(strictRules, "window: 2s", "window: 1h", 1)
	eu := w.region("eu", ns.ClientURL(), regions, rules)
	w.region("us", ns.ClientURL(), regions, rules)
	svc := w.service("gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 200 * time.Millisecond})
	client := pb.NewGlobalSyncClient(serveGRPC(t, svc))
	ctx := t.Context()

	w.waitFor(100*time.Millisecond, "eu holds a lease", func() bool { _, ok := eu.lease(); return ok })
	for range 7 {
		var d regional.Decision
		eu.engine.Check(ctx, &regional.Request{APIKey: "k7", Endpoint: "/x"}, &d)
	}
	var u *pb.GetGlobalUsageResponse
	var err error
	w.waitFor(100*time.Millisecond, "globalsync's copy has eu's 7", func() bool {
		u, err = client.GetGlobalUsage(ctx, &pb.GetGlobalUsageRequest{Rule: "g", Key: "k7"})
		return err == nil && u.GetGlobalUsed() == 7
	})
	if len(u.Regions) != 2 || u.Regions[0].Region != "eu" || u.Regions[0].Used != 7 || u.Regions[0].GetShare() <= 0 || u.Regions[1].Used != 0 {
		t.Fatalf("GetGlobalUsage: %v", u)
	}
	// A region's own usage report knows the other regions' shares too,
	// from the leases it watches.
	w.waitFor(100*time.Millisecond, "eu knows us's share", func() bool {
		ru, err := eu.engine.Usage(ctx, "g", &regional.Request{APIKey: "k7", Endpoint: "/x"})
		return err == nil && len(ru.Regions) == 2 && ru.Regions[1].Region == "us" && ru.Regions[1].Share > 0 && ru.GlobalUsed == 7
	})
	b, err := client.GetBudgets(ctx, &pb.GetBudgetsRequest{})
	if err != nil || len(b.Budgets) != 1 || b.Budgets[0].Rule != "g" || len(b.Budgets[0].Leases) != 2 {
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
	// A window by any instant in it; one no longer kept is NotFound,
	// WINDOW_EXPIRED, not a window nobody used; one not begun is refused.
	now := svc.cfg.Clock()
	if at, err := client.GetGlobalUsage(ctx, &pb.GetGlobalUsageRequest{Rule: "g", Key: "k7", WindowStartUnixMs: now.UnixMilli()}); err != nil ||
		at.WindowStartUnixMs != u.WindowStartUnixMs || at.GlobalUsed != 7 {
		t.Fatalf("GetGlobalUsage of the window of now: %v, %v; want the window of %d", at, err, u.WindowStartUnixMs)
	}
	for _, in := range []*pb.GetGlobalUsageRequest{
		{Rule: "g", Key: "k7", WindowStartUnixMs: now.Add(-2 * time.Hour).UnixMilli()}, // kept some 1h10m from its start
		{Rule: "nope", Key: "k7", WindowStartUnixMs: now.Add(-48 * time.Hour).UnixMilli()},
	} {
		_, err := client.GetGlobalUsage(ctx, in)
		st, _ := status.FromError(err)
		var reason string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				reason = info.Reason
			}
		}
		if st.Code() != codes.NotFound || reason != "WINDOW_EXPIRED" || !strings.Contains(st.Message(), "no longer kept") || !strings.Contains(st.Message(), "usage history") {
			t.Fatalf("GetGlobalUsage(%v): %v, want NotFound WINDOW_EXPIRED", in, err)
		}
	}
	if _, err := client.GetGlobalUsage(ctx, &pb.GetGlobalUsageRequest{Rule: "g", Key: "k7", WindowStartUnixMs: now.Add(2 * time.Hour).UnixMilli()}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("GetGlobalUsage of a window not begun: %v, want InvalidArgument", err)
	}

	// The dashboard: a page that loads nothing from elsewhere, and the
	// figures it draws.
	web := httptest.NewServer(httpHandler(svc, prometheus.NewRegistry(), "gs", ""))
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
	w.waitFor(100*time.Millisecond, "the dashboard has eu's lease and admissions", func() bool {
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

// TestBooksClosedOverNATS: regions cut off from each other (here: never
// joined, each on a lease of its own) admit more than a limit together; the
// leader hears their usage through the gossip, closes the window's books,
// counts the over-admission in its metric and publishes the debt in the
// next budget documents. (Who is held to account, and how much: the
// coordinator's scripts, budget/coord/testdata/books.txt.)
func TestBooksClosedOverNATS(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	const rules = `
rules:
  - { id: g, match: { api_key: "k*" }, by: [api_key], scope: global, mode: elastic, carry_debt: true, algorithm: fixed_window, limit: 600, window: 2s }
`
	rs, err := regional.Parse("rules.yaml", []byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	regions := []string{"eu", "us"}
	eu := w.region("eu", ns.ClientURL(), regions, rules)
	us := w.region("us", ns.ClientURL(), regions, rules)
	reg := prometheus.NewRegistry()
	svc := w.service("gs", ns.ClientURL(), Config{Regions: regions, Rebalance: 250 * time.Millisecond, AntiEntropy: time.Second,
		Rules: rs, Registry: reg, RedactKeys: true})
	w.waitFor(250*time.Millisecond, "both regions hold leases", func() bool {
		_, a := eu.lease()
		_, b := us.lease()
		return a && b
	})
	// A window that starts now: each region admits its whole lease, and
	// borrows what it cannot see the other use (neither hears the other:
	// their deltas are not delivered while time stands still), 700 in
	// all.
	start := w.clock()
	for _, r := range []*region{eu, us} {
		for range 350 {
			var d regional.Decision
			r.engine.Check(t.Context(), &regional.Request{APIKey: "k1", Endpoint: "/x"}, &d)
		}
	}
	key := regional.CounterKey("g", "k1")
	window := time.UnixMilli(start.UnixMilli() / 2000 * 2000)
	used := func() int64 {
		u := svc.GlobalUsage(key, window)
		return u["eu"] + u["us"]
	}
	w.waitFor(250*time.Millisecond, "globalsync's copy holds the window", func() bool { return used() > 600 })
	total := used()
	var found []int64
	w.waitFor(250*time.Millisecond, "over-admission found", func() bool {
		for _, oa := range svc.OverAdmissions() {
			if oa.Key != regional.RedactKey(key) {
				t.Fatalf("over-admission reported of key %q, want the hash %q of %q", oa.Key, regional.RedactKey(key), key)
			}
			found = append(found, oa.Amount)
		}
		return len(found) > 0
	})
	sum := int64(0)
	for _, a := range found {
		sum += a
	}
	if sum < total-600-int64(len(regions)) || sum > total-600 {
		t.Fatalf("over-admission put on regions sums to %d, want %d (less rounding)", sum, total-600)
	}
	if bc := svc.Dashboard().BooksClosedMS; bc < window.Add(2*time.Second).UnixMilli() {
		t.Errorf("the dashboard says books closed by %d, before the end of the window found over", bc)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "geoquota_over_admitted_total" {
			for _, m := range mf.GetMetric() {
				counted += m.GetCounter().GetValue()
			}
		}
	}
	if int64(counted) != sum {
		t.Fatalf("geoquota_over_admitted_total counts %v, the books %d", counted, sum)
	}
	w.waitFor(250*time.Millisecond, "debt withheld from a region's lease", func() bool {
		for _, r := range []*region{eu, us} {
			if l, _ := r.lease(); l.Debt > 0 {
				return true
			}
		}
		return false
	})
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--nats is required"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--lease-ttl", "1h"}, "--lease-ttl"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--require-auth"}, "--require-auth: the NATS connection"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-user", "u"}, "--nats-password"},
		{[]string{"--nats", "nats://127.0.0.1:4222", "--nats-creds", "/nonexistent.creds"}, "--nats-creds"},
	} {
		if _, err := parseFlags(tc.args, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"--nats", "nats://gs:pw@127.0.0.1:4222", "--require-auth"}, func(string) string { return "" }); err != nil {
		t.Errorf("credentials in the URL with --require-auth: %v", err)
	}
}

// TestReadsNeedTheToken: with --admin-token, every /v1 read and
// geoquota.v1.GlobalSync call needs it (the scheme in any case); the
// dashboard's page, health, metrics and gRPC health stay open.
func TestReadsNeedTheToken(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	svc := w.service("gs", ns.ClientURL(), Config{Regions: []string{"eu", "us"}, Rebalance: 200 * time.Millisecond})
	web := httptest.NewServer(httpHandler(svc, prometheus.NewRegistry(), "gs", "s3cret"))
	t.Cleanup(web.Close)
	get := func(path, auth string) int {
		req, _ := http.NewRequest(http.MethodGet, web.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := web.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusUnauthorized && res.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s: 401 without WWW-Authenticate", path)
		}
		return res.StatusCode
	}
	for _, path := range []string{"/v1/budgets", "/v1/regions", "/v1/over-admissions", "/v1/dashboard"} {
		for auth, want := range map[string]int{"": 401, "Bearer wrong": 401, "s3cret": 401, "Bearer s3cret": 200, "bearer s3cret": 200} {
			if got := get(path, auth); got != want {
				t.Errorf("GET %s with %q: %d, want %d", path, auth, got, want)
			}
		}
	}
	for _, path := range []string{"/", "/healthz", "/metrics"} {
		if got := get(path, ""); got != 200 {
			t.Errorf("GET %s without the token: %d, want 200", path, got)
		}
	}
	if got := get("/readyz", ""); got == 401 {
		t.Errorf("GET /readyz without the token: %d, want it open (200 or 503)", got)
	}
	// Errors are JSON, as every geoquota API's: 401, 404, 405.
	for _, c := range []struct {
		method, path, auth string
		status             int
		code               string
	}{
		{http.MethodGet, "/v1/budgets", "", 401, "UNAUTHENTICATED"},
		{http.MethodGet, "/v1/nothing", "", 404, "NOT_FOUND"},
		{http.MethodPost, "/v1/budgets", "Bearer s3cret", 405, "METHOD_NOT_ALLOWED"},
		{http.MethodDelete, "/", "", 405, "METHOD_NOT_ALLOWED"},
	} {
		req, _ := http.NewRequest(c.method, web.URL+c.path, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		res, err := web.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code, Message string }
		}
		derr := json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != c.status || derr != nil || body.Error.Code != c.code || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %d %+v (%v), want %d %s as JSON", c.method, c.path, res.StatusCode, body, derr, c.status, c.code)
		}
	}
	// A region never heard from: last_heard_ms null, not a number.
	{
		req, _ := http.NewRequest(http.MethodGet, web.URL+"/v1/regions", nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		res, err := web.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Regions []map[string]any `json:"regions"`
		}
		json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if len(body.Regions) != 2 {
			t.Fatalf("/v1/regions: %v", body)
		}
		for _, r := range body.Regions {
			if v, ok := r["last_heard_ms"]; !ok || v != nil {
				t.Errorf("/v1/regions: a region never heard from has last_heard_ms %v (given: %v), want null", v, ok)
			}
		}
	}
	// Lists are [] before anything is in them, never null.
	for _, path := range []string{"/v1/budgets", "/v1/over-admissions"} {
		req, _ := http.NewRequest(http.MethodGet, web.URL+path, nil)
		req.Header.Set("Authorization", "Bearer s3cret")
		res, err := web.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.TrimSpace(string(body)) != "[]" {
			t.Errorf("GET %s of a new service: %q, want []", path, body)
		}
	}

	conn := serveGRPC(t, svc, grpc.UnaryInterceptor(requireToken("s3cret")))
	client := pb.NewGlobalSyncClient(conn)
	ctx := t.Context()
	if _, err := client.GetBudgets(ctx, &pb.GetBudgetsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetBudgets without the token: %v, want Unauthenticated", err)
	}
	if _, err := client.ListRegions(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer wrong"), &pb.ListRegionsRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("ListRegions with a wrong token: %v, want Unauthenticated", err)
	}
	if _, err := client.GetBudgets(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer s3cret"), &pb.GetBudgetsRequest{}); err != nil {
		t.Errorf("GetBudgets with the token: %v", err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health without the token: %v", err)
	}
}

// serveGRPC serves geoquota.v1.GlobalSync and health from svc on loopback
// with opts, and returns a connection to it; both end with the test.
func serveGRPC(t *testing.T, svc *Service, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	pb.RegisterGlobalSyncServer(srv, grpcServer{s: svc})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestHelp: globalsync -h and --help are a request for help (main prints
// it to stdout and exits 0: daemon.ParseFailed) holding every flag, the
// variables that set them and where the documentation is.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "--help"} {
		_, err := parseFlags([]string{h}, func(string) string { return "" })
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("globalsync %s: %v, want a request for help", h, err)
		}
		for _, want := range []string{"usage: globalsync [flags]", "-nats", "-http-addr", "GEOQUOTA_NATS", "docs/operations.md"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("globalsync %s says nothing of %q:\n%s", h, want, err)
			}
		}
	}
}

// TestReadyz: /readyz answers 503 until the instance knows who leads (it
// has read or taken the leader's claim), then 200 with its role; 503 again
// once its last read of the claim is older than the leader TTL, and while
// NATS is away. /healthz stays 200 throughout.
func TestReadyz(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	w := newWorld(t)
	cfg := Config{Regions: []string{"eu", "us"}, Rebalance: 200 * time.Millisecond, LeaderTTL: time.Second}
	serve := func(s *Service) string {
		web := httptest.NewServer(httpHandler(s, prometheus.NewRegistry(), s.cfg.ID, "s3cret"))
		t.Cleanup(web.Close)
		return web.URL
	}
	type answer struct {
		Status, Role, Leader string
		Error                struct{ Code, Message string }
	}
	get := func(url, path string) (int, answer) {
		t.Helper()
		res, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var a answer
		if path == "/readyz" {
			if err := json.NewDecoder(res.Body).Decode(&a); err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
		}
		return res.StatusCode, a
	}
	a := w.service("a", ns.ClientURL(), cfg)
	aURL := serve(a)
	if code, got := get(aURL, "/readyz"); code != 503 || got.Error.Code != "NOT_READY" || !strings.Contains(got.Error.Message, "who leads") {
		t.Fatalf("/readyz before the first tick: %d %+v, want 503 NOT_READY saying it does not know who leads", code, got)
	}
	w.step(200 * time.Millisecond)
	if code, got := get(aURL, "/readyz"); code != 200 || got.Status != "ready" || got.Role != "leader" || got.Leader != "a" {
		t.Fatalf("/readyz of the only instance: %d %+v, want 200, leading", code, got)
	}
	b := w.service("b", ns.ClientURL(), cfg)
	bURL := serve(b)
	w.step(200 * time.Millisecond)
	if code, got := get(bURL, "/readyz"); code != 200 || got.Role != "follower" || got.Leader != "a" {
		t.Fatalf("/readyz of the second instance: %d %+v, want 200, following a", code, got)
	}
	// Ticks stop while time goes on: what it knows of the leader is old.
	w.mu.Lock()
	w.now = w.now.Add(2 * cfg.LeaderTTL)
	w.mu.Unlock()
	if code, got := get(bURL, "/readyz"); code != 503 || !strings.Contains(got.Error.Message, "leader TTL") {
		t.Fatalf("/readyz with the claim last read %v ago: %d %+v, want 503", 2*cfg.LeaderTTL, code, got)
	}
	w.step(200 * time.Millisecond)
	if code, got := get(bURL, "/readyz"); code != 200 {
		t.Fatalf("/readyz once ticking again: %d %+v, want 200", code, got)
	}
	ns.Stop()
	harness.WaitFor(t, 20*time.Second, "b not ready without NATS", func() bool {
		code, got := get(bURL, "/readyz")
		return code == 503 && strings.Contains(got.Error.Message, "NATS")
	})
	if code, _ := get(bURL, "/healthz"); code != 200 {
		t.Fatalf("/healthz without NATS: %d, want 200", code)
	}
}

// TestHealthFollowsReadiness: gRPC health says what /readyz says, and
// NOT_SERVING once stopped.
func TestHealthFollowsReadiness(t *testing.T) {
	hs := health.NewServer()
	var ready atomic.Bool
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		followReadiness(ctx, hs, func() Readiness { return Readiness{Ready: ready.Load()} }, time.Millisecond)
	}()
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := hs.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status
	}
	waitStatus := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for status() != want {
			if time.Now().After(deadline) {
				t.Fatalf("health %v, want %v", status(), want)
			}
			time.Sleep(time.Millisecond) // polling the condition, with a deadline
		}
	}
	waitStatus(healthpb.HealthCheckResponse_NOT_SERVING)
	ready.Store(true)
	waitStatus(healthpb.HealthCheckResponse_SERVING)
	ready.Store(false)
	waitStatus(healthpb.HealthCheckResponse_NOT_SERVING)
	ready.Store(true)
	waitStatus(healthpb.HealthCheckResponse_SERVING)
	cancel()
	<-done
	if s := status(); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("after stopping: %v", s)
	}
}

// TestDocumentTooLarge: a budget document larger than the NATS servers
// take is refused before it is sent, with an error that says what to
// change (rebalance then goes on: not another leader's doing).
func TestDocumentTooLarge(t *testing.T) {
	doc := budget.Document{Rule: "g", Seq: 3, Counters: map[string]map[string]budget.CounterLeaseDoc{"k1": {}, "k2": {}}}
	if err := fits(doc, 900, 1000); err != nil {
		t.Fatalf("900 bytes of 1000: %v", err)
	}
	err := fits(doc, 2000, 1000)
	if err == nil || !strings.Contains(err.Error(), "its 2 counters") || !strings.Contains(err.Error(), "max_payload of 1000") {
		t.Fatalf("2000 bytes of 1000: %v", err)
	}
}
