package control

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
	"github.com/geoquota/geoquota/transport/namespace"
	"github.com/nats-io/nats.go"
)

// replicaOf is one regiond replica of region eu in this process: engine,
// membership and, if natsURL is set, gossip.
type replicaOf struct {
	engine  *regional.Engine
	members *Members
	gossip  *Gossip
}

func startReplica(t *testing.T, name string, peers []string, natsURL string) *replicaOf {
	t.Helper()
	var members atomic.Pointer[Members]
	rules, err := regional.Parse("rules.yaml", []byte(`
rules:
  - { id: r, by: [api_key], algorithm: fixed_window, limit: 3, window: 1h }
`))
	if err != nil {
		t.Fatal(err)
	}
	r := &replicaOf{}
	r.engine = regional.New(regional.Config{Region: "eu", Logger: discardLogger(), Global: regional.GlobalConfig{Regions: []string{"eu", "us"}},
		OnDenied: func(d regional.Denial) {
			if m := members.Load(); m != nil {
				m.TellDenial(d)
			}
		}}, rules)
	m, err := StartMembers(MembersConfig{Name: name, Addr: "127.0.0.1:0", Peers: peers, Profile: "local",
		SecretKey: []byte("0123456789abcdef"), Logger: discardLogger()}, r.engine)
	if err != nil {
		t.Fatal(err)
	}
	members.Store(m)
	r.members = m
	t.Cleanup(func() { m.Shutdown() })
	if natsURL != "" {
		nc, err := nats.Connect(natsURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		cfg := gossipConfig("eu")
		cfg.Replica, cfg.Elected, cfg.AntiEntropy, cfg.Counters, cfg.Engine = name, m.Elected, 100*time.Millisecond, r.engine, r.engine
		r.gossip = runGossip(t, nc, cfg)
	}
	return r
}

// TestMembersElectAndShareDenials: three replicas find each other (with
// an encryption key); the first by name is elected; a key one replica
// finds over its limit is denied by the others from their denial caches;
// when the elected replica dies without a word, another is elected, and
// it is the one that now answers for the region.
func TestMembersElectAndShareDenials(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{})
	a := startReplica(t, "a", nil, ns.ClientURL())
	b := startReplica(t, "b", []string{a.members.Addr()}, ns.ClientURL())
	c := startReplica(t, "c", []string{a.members.Addr()}, "")
	all := []*replicaOf{a, b, c}
	waitFor(t, 10*time.Second, "three replicas see each other", func() bool {
		for _, r := range all {
			if len(r.members.Names()) != 3 {
				return false
			}
		}
		return true
	})
	if !a.members.Elected() || b.members.Elected() || c.members.Elected() {
		t.Fatalf("elected: a %v b %v c %v, want a alone", a.members.Elected(), b.members.Elected(), c.members.Elected())
	}

	check := func(r *replicaOf) regional.Decision {
		var d regional.Decision
		if err := r.engine.Check(context.Background(), &regional.Request{APIKey: "k1"}, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for range 3 {
		check(a)
	}
	if d := check(a); d.Allowed {
		t.Fatal("a's 4th request allowed")
	}
	waitFor(t, 5*time.Second, "b and c deny k1 from their denial caches", func() bool {
		db, dc := check(b), check(c)
		return !db.Allowed && db.Limit().Cached && !dc.Allowed && dc.Limit().Cached
	})

	// us, which lost its counters, asks eu for them: the elected replica
	// answers for the region.
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	seq := 0
	askOwn := func() {
		seq++
		m := nats.NewMsg(namespace.Names{}.Ask("eu", "us"))
		m.Header.Set(gossip.HeaderReplica, "us-1")
		m.Header.Set(gossip.HeaderInstance, "1")
		m.Header.Set(gossip.HeaderSeq, fmt.Sprint(seq))
		m.Data = []byte(`{"own":true}`)
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	answered := func(r *replicaOf) bool { return r.gossip.Node().Stats().AsksAnswered.Load() > 0 }
	waitFor(t, 5*time.Second, "a answers for eu", func() bool { askOwn(); return answered(a) })
	if answered(b) {
		t.Fatal("b answered for eu while a was elected")
	}
	a.gossip.Close()
	a.members.Shutdown() // as SIGKILL would: no goodbye
	waitFor(t, 15*time.Second, "b elected after a died", b.members.Elected)
	waitFor(t, 5*time.Second, "b answers for eu", func() bool { askOwn(); return answered(b) })
	if c.members.Elected() {
		t.Fatal("c elected too")
	}
}
