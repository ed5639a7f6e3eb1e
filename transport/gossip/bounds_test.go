package gossip

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/namespace"
)

// testNode returns replica eu-1 of region eu (of eu and us), on an
// engine with an in-memory store and a global rule, at now.
func testNode(t testing.TB, now time.Time) (*Node, *regional.Engine) {
	t.Helper()
	clock := func() time.Time { return now }
	rules, err := regional.Parse("rules.yaml", []byte("rules: [{id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 100, window: 1m}]"))
	if err != nil {
		t.Fatal(err)
	}
	st := regional.NewMemoryStore(clock)
	st.SetRegion("eu")
	e := regional.New(regional.Config{Region: "eu", Store: st, Clock: clock, Global: regional.GlobalConfig{Regions: []string{"eu", "us"}}}, rules)
	n, err := New(Config{Region: "eu", Replica: "eu-1", Instance: "1", Counters: e, Engine: e}, now)
	if err != nil {
		t.Fatal(err)
	}
	return n, e
}

// FuzzStep hands a replica arbitrary messages of every kind (what anyone
// who can publish on NATS could send): it never panics, counts each
// message received, sends nothing but its own region's subjects, and
// keeps its records bounded.
func FuzzStep(f *testing.F) {
	var names namespace.Names
	d, _ := crdt.AppendDelta(nil, crdt.Delta{Origin: "us", To: 1, Entries: []crdt.Entry{{ID: crdt.ID{Key: "gq:{g:k}", Epoch: 1_800_000_000_000},
		Slots: []crdt.Slot{{Region: "us", P: 5}}}}})
	f.Add(uint8(namespace.Delta), "us", "us-1", uint64(1), d)
	f.Add(uint8(namespace.Ask), "us", "us-1", uint64(2), []byte(`{"streams":[{"replica":"eu-1","instance":"1","since":0}],"others":true,"own":true}`))
	f.Add(uint8(namespace.Heartbeat), "us", "us-1", uint64(3), []byte(`{"region":"us","replica":"us-1","rules":{"g":{"admitted":3}}}`))
	f.Add(uint8(namespace.Repair), namespace.GlobalSync, "gs", uint64(1), d)
	big, _ := encodeDelta(deltaOf(randomKeys(100))) // compressed
	f.Add(uint8(namespace.Delta), "us", "us-2", uint64(1), big)
	now := time.Unix(1_800_000_000, 0)
	n, _ := testNode(f, now)
	f.Fuzz(func(t *testing.T, kind uint8, from, replica string, seq uint64, data []byte) {
		var subject string
		switch namespace.Kind(kind % 4) {
		case namespace.Delta:
			subject = names.Delta(from)
		case namespace.Ask:
			subject = names.Ask("eu", from)
		case namespace.Repair:
			subject = names.Repair("eu", from)
		default:
			subject = names.Heartbeat(from)
		}
		received := n.stats.Received.Load()
		out := n.Step(context.Background(), now, Message{Subject: subject, Header: Header{Replica: replica, Instance: "x", Seq: seq}, Data: data})
		if replica != "eu-1" && n.stats.Received.Load() != received+1 {
			t.Fatal("a message was not counted as received")
		}
		for _, m := range out {
			if k, sender, _, ok := names.Parse(m.Subject); !ok || sender != "eu" {
				t.Fatalf("sent %q (%v), not as eu", m.Subject, k)
			}
		}
		if len(n.senders) > maxSenders || len(n.heard) > maxHeard || len(n.askers) > maxAskers {
			t.Fatalf("records grew: %d senders, %d heard, %d askers", len(n.senders), len(n.heard), len(n.askers))
		}
	})
}

// TestWhatSendersMayMakeANodeHoldIsBounded: messages under names outside
// a replica's regions are refused and counted, whatever their kind; a
// flood of replica names keeps at most maxSenders replay records, the
// latest among them; and an observer, which has no list of regions, hears
// of at most maxHeard.
func TestWhatSendersMayMakeANodeHoldIsBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	n, e := testNode(t, now)
	var names namespace.Names
	ctx := context.Background()
	ask := func(from, replica string, seq uint64) Message {
		return Message{Subject: names.Ask("eu", from), Header: Header{Replica: replica, Instance: "x", Seq: seq}, Body: Ask{Others: true}}
	}

	for _, m := range []Message{
		{Subject: names.Delta("mars"), Header: Header{Replica: "m2", Instance: "x", Seq: 1}, Data: []byte("x")},
		{Subject: names.Heartbeat("mars"), Header: Header{Replica: "m3", Instance: "x", Seq: 1}, Body: Heartbeat{Region: "mars", Replica: "m3"}},
	} {
		before := n.stats.UnknownRegion.Load()
		if out := n.Step(ctx, now, m); len(out) != 0 || n.stats.UnknownRegion.Load() != before+1 {
			t.Errorf("%s: answered %d, unknown-region %d → %d; want refused and counted", m.Subject, len(out), before, n.stats.UnknownRegion.Load())
		}
	}
	// An ask from a region outside the set is answered (a region being
	// added asks before the others list it), but the region is not heard.
	before := n.stats.UnknownRegion.Load()
	n.Step(ctx, now, ask("mars", "m1", 1))
	if n.stats.UnknownRegion.Load() != before || n.stats.AsksAnswered.Load() == 0 {
		t.Errorf("an ask from mars: refused %d, answered %d; want answered", n.stats.UnknownRegion.Load()-before, n.stats.AsksAnswered.Load())
	}
	if _, heard := n.LastHeard("mars"); heard {
		t.Error("a region outside the set was noted as heard")
	}
	before = n.stats.UnknownRegion.Load()
	n.Step(ctx, now, ask(namespace.GlobalSync, "gs-1", 1))
	n.Step(ctx, now, ask("us", "us-1", 1))
	if n.stats.UnknownRegion.Load() != before {
		t.Error("globalsync's or a listed region's ask was refused as from an unknown region")
	}

	for i := range maxSenders + 500 {
		n.Step(ctx, now.Add(time.Duration(i)*time.Millisecond), ask("us", fmt.Sprint("r", i), 1))
	}
	if got := len(n.senders); got > maxSenders {
		t.Fatalf("%d replay records after a flood of replica names, want at most %d", got, maxSenders)
	}
	last := fmt.Sprint("r", maxSenders+499)
	replayed := n.stats.Replayed.Load()
	n.Step(ctx, now.Add(time.Hour), ask("us", last, 1))
	if n.stats.Replayed.Load() != replayed+1 {
		t.Error("the latest sender's record was dropped: its replay went through")
	}

	o, err := New(Config{Region: namespace.GlobalSync, Replica: "gs-1", Instance: "1", Counters: e, Observer: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	hb := func(o *Node, r string, at time.Time) {
		o.Step(ctx, at, Message{Subject: names.Heartbeat(r), Header: Header{Replica: r + "-1", Instance: "x", Seq: uint64(at.UnixNano())},
			Body: Heartbeat{Region: r, Replica: r + "-1"}})
	}
	for i := range maxHeard + 50 {
		hb(o, fmt.Sprint("r", i), now.Add(time.Duration(i)*time.Millisecond))
	}
	if len(o.heard) != maxHeard || o.stats.UnknownRegion.Load() != 0 {
		t.Fatalf("an observer heard of %d regions, refused %d; want %d, the least lately heard forgotten", len(o.heard), o.stats.UnknownRegion.Load(), maxHeard)
	}
	// A real region still gets in after a flood of made-up names.
	hb(o, "eu", now.Add(time.Hour))
	if _, heard := o.LastHeard("eu"); !heard {
		t.Error("eu not heard after a flood of names")
	}
	// An observer given its regions hears them alone.
	o2, err := New(Config{Region: namespace.GlobalSync, Replica: "gs-2", Instance: "1", Counters: e, Observer: true, Regions: []string{"eu", "us"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	hb(o2, "mars", now)
	hb(o2, "eu", now)
	if _, heard := o2.LastHeard("mars"); heard || o2.stats.UnknownRegion.Load() != 1 {
		t.Errorf("an observer of eu and us heard mars (refused %d)", o2.stats.UnknownRegion.Load())
	}
	if _, heard := o2.LastHeard("eu"); !heard {
		t.Error("an observer of eu and us did not hear eu")
	}
}
