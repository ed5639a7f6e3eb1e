package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/namespace"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestPushedRulesAndBudgets: with no JetStream to watch (a server
// without it, as a region sees JetStream just after a partition heals),
// the rules and budget documents globalsync pushes as plain messages are
// put in force; rules older than those applied are not, nor again over a
// rules file edited since.
func TestPushedRulesAndBudgets(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rulesYAML := func(limit int) []byte {
		return []byte("rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: " + itoa(limit) + ", window: 1m }\n")
	}
	rs, err := regional.Parse("rules.yaml", rulesYAML(100))
	if err != nil {
		t.Fatal(err)
	}
	e := regional.New(regional.Config{Region: "eu", Logger: discardLogger(), Global: regional.GlobalConfig{Regions: []string{"eu", "us"}}}, rs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	var logs harness.LogBuffer
	go func() {
		WatchRules(ctx, js, subjects, e, slog.New(slog.NewTextHandler(&logs, nil)), nil)
		done <- struct{}{}
	}()
	go func() { WatchBudgets(ctx, js, subjects, e, discardLogger(), nil); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	limit := func() int64 { return e.Rules().Rule("g").Base.Limit }
	// The subscriptions are made as the watchers start: push until seen.
	waitFor(t, 5*time.Second, "pushed rules (revision 5) in force", func() bool {
		if err := PushRules(nc, subjects, 5, rulesYAML(200)); err != nil {
			t.Fatal(err)
		}
		nc.Flush()
		return limit() == 200
	})
	// A file edited after revision 5 stays: neither revision 4 nor 5
	// pushed again is applied; 6 is.
	if _, err := e.PutRules("rules.yaml", rulesYAML(400)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ rev, limit int }{{4, 300}, {5, 200}, {6, 600}} {
		if err := PushRules(nc, subjects, uint64(p.rev), rulesYAML(p.limit)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "revision 6 in force", func() bool { return limit() == 600 })
	for rev, want := range map[int]int{4: 0, 5: 1, 6: 1} {
		if got := strings.Count(logs.String(), fmt.Sprintf("published rules in force\" revision=%d ", rev)); got != want {
			t.Errorf("revision %d put in force %d times, want %d:\n%s", rev, got, want, logs.String())
		}
	}

	now := time.Now()
	doc := budget.NewDocument("gs", []budget.Lease{{Rule: "g", Region: "eu", Seq: 3, Floor: 0.05, Share: 0.4, Issued: now, Expires: now.Add(time.Minute)}})
	b, _ := json.Marshal(doc)
	if err := PushBudget(nc, subjects, 9, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the pushed lease held", func() bool {
		l, _, ok := e.Lease("g")
		return ok && l.Seq == 3
	})
}

// TestRulesRevisionsApplyOnce: rules from the bucket and pushed ones go
// through one sequence: a revision already applied, from either, is not
// applied again.
func TestRulesRevisionsApplyOnce(t *testing.T) {
	ns := harness.NewNATS(t, harness.NATSOptions{JetStream: true})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, RulesBucketConfig(subjects))
	if err != nil {
		t.Fatal(err)
	}
	yaml := []byte("rules:\n  - { id: g, by: [api_key], algorithm: fixed_window, limit: 7, window: 1m }\n")
	rev, err := PublishRules(ctx, kv, yaml)
	if err != nil {
		t.Fatal(err)
	}
	rs, _ := regional.Parse("rules.yaml", []byte("rules:\n  - { id: g, by: [api_key], algorithm: fixed_window, limit: 1, window: 1m }\n"))
	e := regional.New(regional.Config{Region: "eu", Logger: discardLogger()}, rs)
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	var logs harness.LogBuffer
	resync := new(Resync)
	go func() {
		WatchRules(wctx, js, subjects, e, slog.New(slog.NewTextHandler(&logs, nil)), resync)
		close(done)
	}()
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, 10*time.Second, "the bucket's rules in force", func() bool { return e.Rules().Rule("g").Base.Limit == 7 })
	// Edited locally after; the same revision pushed changes nothing.
	if _, err := e.PutRules("rules.yaml", []byte("rules:\n  - { id: g, by: [api_key], algorithm: fixed_window, limit: 9, window: 1m }\n")); err != nil {
		t.Fatal(err)
	}
	if err := PushRules(nc, subjects, rev, yaml); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	marker := []byte("rules:\n  - { id: g, by: [api_key], algorithm: fixed_window, limit: 11, window: 1m }\n")
	next, err := PublishRules(ctx, kv, marker)
	if err != nil {
		t.Fatal(err)
	}
	// In force, then logged: wait for the log line too.
	waitFor(t, 10*time.Second, "the next revision in force", func() bool {
		return e.Rules().Rule("g").Base.Limit == 11 && strings.Contains(logs.String(), fmt.Sprintf("published rules in force\" revision=%d ", next))
	})
	for r, want := range map[uint64]int{rev: 1, next: 1} {
		if got := strings.Count(logs.String(), fmt.Sprintf("published rules in force\" revision=%d ", r)); got != want {
			t.Errorf("revision %d put in force %d times, want %d:\n%s", r, got, want, logs.String())
		}
	}

	// The bucket made anew: its revisions start again, and a watch made
	// again (here on a resync) applies them.
	if err := js.DeleteKeyValue(ctx, subjects.RulesBucket()); err != nil {
		t.Fatal(err)
	}
	// The server may still be removing the old bucket's store: "error
	// creating store for stream" (JetStream's 10049) until it has.
	waitFor(t, 10*time.Second, "the bucket made anew", func() bool {
		kv, err = js.CreateKeyValue(ctx, RulesBucketConfig(subjects))
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == 10049 {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})
	anew := []byte("rules:\n  - { id: g, by: [api_key], algorithm: fixed_window, limit: 13, window: 1m }\n")
	if r, err := PublishRules(ctx, kv, anew); err != nil || r >= next {
		t.Fatalf("a new bucket's first revision: %d, %v (the old one was at %d)", r, err, next)
	}
	resync.Fire()
	waitFor(t, 15*time.Second, "a new bucket's rules in force", func() bool { return e.Rules().Rule("g").Base.Limit == 13 })
}

// subjects are the default deployment's.
var subjects namespace.Names

func itoa(n int) string { return strconv.Itoa(n) }
