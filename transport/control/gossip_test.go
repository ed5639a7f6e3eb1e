package control

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
	"github.com/nats-io/nats.go"
)

const gossipRules = `
rules:
  - id: tenant-global
    match: { api_key: "sk_*" }
    by: [api_key]
    scope: global
    mode: elastic
    algorithm: fixed_window
    limit: 1000
    window: 1h
`

var gossipRegions = []string{"ap", "eu", "us"}

// gossipRegion is one region: its redis-server, engine and gossip, on its
// own NATS cluster of a supercluster.
type gossipRegion struct {
	name   string
	redis  *harness.Redis
	store  *regional.RedisStore
	engine *regional.Engine
	nc     *nats.Conn
	gossip *Gossip
}

// gossipConfig is a region's gossip, fast: the tests wait on its results.
func gossipConfig(region string) gossip.Config {
	return gossip.Config{Region: region, Interval: 50 * time.Millisecond, AntiEntropy: 200 * time.Millisecond,
		Heartbeat: 100 * time.Millisecond}
}

func startGossipRegion(t *testing.T, name, natsURL string, srv *harness.Redis) *gossipRegion {
	t.Helper()
	return startGossipRegionOn(t, name, natsURL, srv, gossipConfig(name), GossipOptions{Logger: discardLogger()})
}

// startGossipRegionWith starts a region on its own redis-server with the
// given gossip configuration and options.
func startGossipRegionWith(t *testing.T, name, natsURL string, cfg gossip.Config, opts GossipOptions) *gossipRegion {
	t.Helper()
	return startGossipRegionOn(t, name, natsURL, nil, cfg, opts)
}

func startGossipRegionOn(t *testing.T, name, natsURL string, srv *harness.Redis, cfg gossip.Config, opts GossipOptions) *gossipRegion {
	t.Helper()
	if srv == nil {
		srv = harness.NewRedis(t, harness.RedisOptions{})
	}
	store, err := regional.NewRedisStore(t.Context(), srv.URL(), regional.RedisOptions{Region: name, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	rules, err := regional.Parse("rules.yaml", []byte(gossipRules))
	if err != nil {
		t.Fatal(err)
	}
	r := &gossipRegion{name: name, redis: srv, store: store}
	// A lag of a microsecond: elastic checks borrow up to the ceiling
	// whatever the pace (which follows the wall clock's place in the hour).
	r.engine = regional.New(regional.Config{Region: name, Store: store, Logger: discardLogger(),
		Global: regional.GlobalConfig{Regions: gossipRegions, Lag: time.Microsecond}}, rules)
	if r.nc, err = nats.Connect(natsURL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.nc.Close)
	cfg.Counters, cfg.Engine = r.engine, r.engine
	r.gossip = startGossip(t, r.nc, cfg, opts)
	return r
}

func (r *gossipRegion) admit(t *testing.T, key string, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		var d regional.Decision
		if err := r.engine.Check(t.Context(), &regional.Request{APIKey: key, Endpoint: "/x"}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	return allowed
}

// window reads the current window of key's global counter from the
// region's redis-server.
func (r *gossipRegion) window(t *testing.T, key string) []crdt.Slot {
	t.Helper()
	start := time.Now().UnixMilli() / 3_600_000 * 3_600_000
	slots, err := r.store.ReadGlobal(t.Context(), []byte("gq:{tenant-global:"+key+"}"), start)
	if err != nil {
		t.Fatal(err)
	}
	return slots
}

func newGossipSupercluster(t *testing.T) *harness.Supercluster {
	sc := harness.NewSupercluster(t, harness.SuperclusterOptions{Clusters: gossipRegions})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := sc.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestGossipConverges admits in three regions, each on its own Redis and
// its own NATS cluster joined by gateways: every region's Redis comes to
// hold every region's slot, and elastic checks in one region see what the
// others admitted.
func TestGossipConverges(t *testing.T) {
	sc := newGossipSupercluster(t)
	regions := map[string]*gossipRegion{}
	for _, name := range gossipRegions {
		regions[name] = startGossipRegion(t, name, sc.Cluster(name).ClientURLs(), nil)
	}
	// Subscriptions cross gateways asynchronously: wait until a message
	// from each region reaches the others (heartbeats suffice).
	waitFor(t, 10*time.Second, "every region hears every other", func() bool {
		for _, r := range regions {
			for _, o := range gossipRegions {
				if _, ok := r.gossip.Node().LastHeard(o); o != r.name && !ok {
					return false
				}
			}
		}
		return true
	})
	admitted := map[string]uint64{"ap": 100, "eu": 200, "us": 300}
	for name, n := range admitted {
		if got := regions[name].admit(t, "sk_1", int(n)); got != int(n) {
			t.Fatalf("%s admitted %d of %d", name, got, n)
		}
	}
	want := []crdt.Slot{{Region: "ap", P: 100}, {Region: "eu", P: 200}, {Region: "us", P: 300}}
	waitFor(t, 10*time.Second, "every Redis holds every slot", func() bool {
		for _, r := range regions {
			if !slices.Equal(r.window(t, "sk_1"), want) {
				return false
			}
		}
		return true
	})
	// Elastic: the ceiling is 990 (1% headroom); 600 are used.
	if got := regions["eu"].admit(t, "sk_1", 500); got != 390 {
		t.Fatalf("eu admitted %d more, want 390 up to the ceiling", got)
	}
	for _, r := range regions {
		// (Regressed slots are not bad here: a repair relaying a region's
		// slot may overtake that region's own, older delta.)
		if s := r.gossip.Node().Stats(); s.Malformed.Load()+s.UnknownRegion.Load()+s.Spoofed.Load()+s.Replayed.Load() != 0 {
			t.Fatalf("%s refused good messages: malformed %d, unknown %d, spoofed %d, replayed %d", r.name,
				s.Malformed.Load(), s.UnknownRegion.Load(), s.Spoofed.Load(), s.Replayed.Load())
		}
	}
}

// TestGossipRepairsAndRecovers: a region that missed the deltas (it was
// not there) gets them by anti-entropy; a region whose Redis was flushed
// and whose replica restarted gets its own slots back from its peers.
func TestGossipRepairsAndRecovers(t *testing.T) {
	sc := newGossipSupercluster(t)
	ap := startGossipRegion(t, "ap", sc.Cluster("ap").ClientURLs(), nil)
	eu := startGossipRegion(t, "eu", sc.Cluster("eu").ClientURLs(), nil)
	waitFor(t, 10*time.Second, "ap and eu hear each other", func() bool {
		_, a := ap.gossip.Node().LastHeard("eu")
		_, b := eu.gossip.Node().LastHeard("ap")
		return a && b
	})
	// Within their floors (us is not heard yet, so elastic mode does not
	// borrow): 33 each.
	if got := ap.admit(t, "sk_2", 20) + eu.admit(t, "sk_2", 30); got != 50 {
		t.Fatalf("ap and eu admitted %d of 50", got)
	}
	waitFor(t, 10*time.Second, "ap and eu agree", func() bool {
		return len(ap.window(t, "sk_2")) == 2 && len(eu.window(t, "sk_2")) == 2
	})
	// us starts late: it missed every delta.
	us := startGossipRegion(t, "us", sc.Cluster("us").ClientURLs(), nil)
	want := []crdt.Slot{{Region: "ap", P: 20}, {Region: "eu", P: 30}}
	waitFor(t, 10*time.Second, "us repaired by anti-entropy", func() bool { return slices.Equal(us.window(t, "sk_2"), want) })
	if us.gossip.Node().Stats().Repaired.Load() == 0 {
		t.Fatal("us converged without repairs")
	}

	// eu loses its Redis and its replica: a new one on the empty Redis
	// gets eu's 30 back from the peers' copies before it admits more.
	eu.gossip.Close()
	if err := eu.store.Client().FlushAll(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	eu2 := startGossipRegion(t, "eu", sc.Cluster("eu").ClientURLs(), eu.redis)
	waitFor(t, 10*time.Second, "eu's own slot recovered", func() bool { return slices.Equal(eu2.window(t, "sk_2"), want) })
}

// TestGossipRefusesBadMessages sends malformed, spoofed, unknown-region
// and replayed messages: each is counted, none changes the counters.
func TestGossipRefusesBadMessages(t *testing.T) {
	srv := harness.NewNATS(t, harness.NATSOptions{})
	eu := startGossipRegion(t, "eu", srv.ClientURL(), nil)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	delta := func(origin, slotRegion string, p uint64) []byte {
		start := time.Now().UnixMilli() / 3_600_000 * 3_600_000
		b, err := crdt.AppendDelta(nil, crdt.Delta{Origin: origin, To: 1, Entries: []crdt.Entry{{
			ID: crdt.ID{Key: "gq:{tenant-global:sk_3}", Epoch: start}, Slots: []crdt.Slot{{Region: slotRegion, P: p}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	send := func(subject string, data []byte, replica, seq string) {
		m := nats.NewMsg(subject)
		m.Data, m.Header = data, nats.Header{}
		if replica != "" {
			m.Header.Set(gossip.HeaderReplica, replica)
			m.Header.Set(gossip.HeaderSeq, seq)
		}
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	s := eu.gossip.Node().Stats()
	send("geoquota.delta.us", []byte("not a delta"), "r1", "1")      // malformed
	send("geoquota.delta.us", delta("us", "us", 5), "", "")          // no replica header
	send("geoquota.delta.us", delta("ap", "ap", 7), "r2", "1")       // us sending as ap
	send("geoquota.delta.mars", delta("mars", "mars", 9), "r3", "1") // unknown region
	send("geoquota.delta.us", delta("us", "us", 11), "r4", "1")      // good
	send("geoquota.delta.us", delta("us", "us", 13), "r4", "1")      // replay of r4's 1
	send("geoquota.delta.us", delta("us", "us", 4), "r4", "2")       // us's slot going down
	send("geoquota.delta.us", delta("us", "ap", 50), "r4", "3")      // us relaying ap's slot in a delta
	waitFor(t, 5*time.Second, "every message counted", func() bool {
		return s.Received.Load() == 8
	})
	if s.Malformed.Load() != 2 || s.Spoofed.Load() != 2 || s.UnknownRegion.Load() != 1 || s.Replayed.Load() != 1 || s.Regressed.Load() != 1 {
		t.Fatalf("counted malformed %d spoofed %d unknown %d replayed %d regressed %d; want 2 2 1 1 1",
			s.Malformed.Load(), s.Spoofed.Load(), s.UnknownRegion.Load(), s.Replayed.Load(), s.Regressed.Load())
	}
	if got := eu.window(t, "sk_3"); !slices.Equal(got, []crdt.Slot{{Region: "us", P: 11}}) {
		t.Fatalf("window after bad messages: %v, want us's 11 alone", got)
	}
}
