package gossip

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/namespace"
)

// TestWhatSendersMayMakeANodeHoldIsBounded: messages under names outside
// a replica's regions are refused and counted, whatever their kind; a
// flood of replica names keeps at most maxSenders replay records, the
// latest among them; and an observer, which has no list of regions, hears
// of at most maxHeard.
func TestWhatSendersMayMakeANodeHoldIsBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
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
	var names namespace.Names
	ctx := context.Background()
	ask := func(from, replica string, seq uint64) Message {
		return Message{Subject: names.Ask("eu", from), Header: Header{Replica: replica, Instance: "x", Seq: seq}, Body: Ask{Others: true}}
	}

	for _, m := range []Message{
		ask("mars", "m1", 1),
		{Subject: names.Delta("mars"), Header: Header{Replica: "m2", Instance: "x", Seq: 1}, Data: []byte("x")},
		{Subject: names.Heartbeat("mars"), Header: Header{Replica: "m3", Instance: "x", Seq: 1}, Body: Heartbeat{Region: "mars", Replica: "m3"}},
	} {
		before := n.stats.UnknownRegion.Load()
		if out := n.Step(ctx, now, m); len(out) != 0 || n.stats.UnknownRegion.Load() != before+1 {
			t.Errorf("%s: answered %d, unknown-region %d → %d; want refused and counted", m.Subject, len(out), before, n.stats.UnknownRegion.Load())
		}
	}
	if _, heard := n.LastHeard("mars"); heard {
		t.Error("a region outside the set was noted as heard")
	}
	before := n.stats.UnknownRegion.Load()
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
	for i := range maxHeard + 50 {
		r := fmt.Sprint("r", i)
		o.Step(ctx, now, Message{Subject: names.Heartbeat(r), Header: Header{Replica: r + "-1", Instance: "x", Seq: 1}, Body: Heartbeat{Region: r, Replica: r + "-1"}})
	}
	if len(o.heard) != maxHeard || o.stats.UnknownRegion.Load() != 50 {
		t.Fatalf("an observer heard of %d regions, refused %d; want %d and %d", len(o.heard), o.stats.UnknownRegion.Load(), maxHeard, 50)
	}
}
