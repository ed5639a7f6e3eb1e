package harness

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/geoquota/geoquota/transport/control"
	"github.com/geoquota/geoquota/transport/namespace"
)

// violations collects a connection's asynchronous errors: the server's
// permission violations come that way.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	v.errs = append(v.errs, err.Error())
	v.mu.Unlock()
}

func (v *violations) has(subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.errs {
		if strings.Contains(strings.ToLower(e), "permissions violation") && strings.Contains(e, subject) {
			return true
		}
	}
	return false
}

// TestIdentitiesKeepToTheirSubjects starts two clusters whose only users
// are a deployment's identities (namespace.Names.Region and GlobalSync): an anonymous client is refused; globalsync makes
// and writes the buckets and a region watches them across the gateway; a
// region's gossip goes through under its own name and not under another's,
// and a region writes no bucket and deletes none.
func TestIdentitiesKeepToTheirSubjects(t *testing.T) {
	serverKinds(t, func(t *testing.T, binary bool) {
		ctx := testContext(t)
		dir := t.TempDir()
		var s namespace.Names
		usPerms, gsPerms := s.Region("us"), s.GlobalSync()
		us, err := NewIdentity(dir, "regiond-us", &usPerms)
		if err != nil {
			t.Fatal(err)
		}
		gs, err := NewIdentity(dir, "globalsync", &gsPerms)
		if err != nil {
			t.Fatal(err)
		}
		op, err := NewIdentity(dir, "operator", nil)
		if err != nil {
			t.Fatal(err)
		}
		sc := NewSupercluster(t, SuperclusterOptions{Binary: binary, JetStream: true, Clusters: []string{"us", "eu"},
			Users: []*Identity{us, gs, op}})

		if nc, err := nats.Connect(sc.Cluster("us").ClientURLs(), nats.Timeout(2*time.Second)); err == nil {
			nc.Close()
			t.Fatal("an anonymous client connected")
		} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Fatalf("anonymous client: %v, want an authorization violation", err)
		}
		as := func(id *Identity, cluster, inbox string) (*nats.Conn, *violations) {
			o, err := id.Option()
			if err != nil {
				t.Fatal(err)
			}
			v := new(violations)
			opts := []nats.Option{o, nats.ErrorHandler(v.handler)}
			if inbox != "" {
				opts = append(opts, nats.CustomInboxPrefix(inbox))
			}
			return connect(t, sc.Cluster(cluster).ClientURLs(), opts...), v
		}
		gsc, _ := as(gs, "eu", s.Inbox(namespace.GlobalSync))
		usc, usv := as(us, "us", s.Inbox("us"))
		opc, _ := as(op, "us", "")

		// globalsync makes the buckets and writes a budget; us watches it.
		gsJS, _ := jetstream.New(gsc)
		var budgets jetstream.KeyValue
		for _, cfg := range []jetstream.KeyValueConfig{control.BudgetsBucketConfig(s), control.RulesBucketConfig(s), control.LeaderBucketConfig(s)} {
			kv, err := gsJS.CreateOrUpdateKeyValue(ctx, cfg)
			if err != nil {
				t.Fatalf("globalsync makes %s: %v", cfg.Bucket, err)
			}
			if cfg.Bucket == s.BudgetsBucket() {
				budgets = kv
			}
		}
		if _, err := budgets.Put(ctx, "r.x", []byte("doc 1")); err != nil {
			t.Fatalf("globalsync writes a budget: %v", err)
		}
		usJS, _ := jetstream.New(usc)
		var seen jetstream.KeyValueEntry
		err = poll(ctx, func(ctx context.Context) error {
			kv, err := usJS.KeyValue(ctx, s.BudgetsBucket())
			if err != nil {
				return err
			}
			w, err := kv.WatchAll(ctx)
			if err != nil {
				return err
			}
			defer w.Stop()
			for en := range w.Updates() {
				if en != nil {
					seen = en
					return nil
				}
			}
			return errors.New("watch ended")
		})
		if err != nil || string(seen.Value()) != "doc 1" {
			t.Fatalf("us watching the budgets: %v, %v", seen, err)
		}

		// us gossips as us; as eu its message is dropped, and it is told.
		sub, err := opc.SubscribeSync(s.Prefix() + ".>")
		if err != nil {
			t.Fatal(err)
		}
		opc.Flush()
		for _, subject := range []string{s.Delta("eu"), s.Heartbeat("eu"), s.PushBudgets(), s.Ask("eu", "globalsync"), s.Delta("us")} {
			if err := usc.Publish(subject, []byte(subject)); err != nil {
				t.Fatal(err)
			}
		}
		usc.Flush()
		m, err := sub.NextMsg(10 * time.Second)
		if err != nil || m.Subject != s.Delta("us") {
			t.Fatalf("first gossip through from us: %v, %v; want only %s", m, err, s.Delta("us"))
		}
		err = poll(ctx, func(context.Context) error {
			for _, subject := range []string{s.Delta("eu"), s.Heartbeat("eu"), s.PushBudgets(), s.Ask("eu", "globalsync")} {
				if !usv.has(subject) {
					return errors.New("no permissions violation reported for " + subject)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		// us reads no one's replies but its own.
		for _, subject := range []string{"_INBOX.>", s.Inbox(namespace.GlobalSync) + ".>"} {
			if _, err := usc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
		}
		usc.Flush()
		err = poll(ctx, func(context.Context) error {
			for _, subject := range []string{"_INBOX.>", s.Inbox(namespace.GlobalSync) + ".>"} {
				if !usv.has(subject) {
					return errors.New("no permissions violation reported for a subscription to " + subject)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		// us writes no bucket and deletes none.
		usBudgets, err := usJS.KeyValue(ctx, s.BudgetsBucket())
		if err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = usBudgets.Put(pctx, "r.x", []byte("forged"))
		cancel()
		if err == nil {
			t.Fatal("us wrote a budget")
		}
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		err = usJS.DeleteKeyValue(dctx, s.RulesBucket())
		cancel()
		if err == nil {
			t.Fatal("us deleted the rules bucket")
		}
		for _, bucket := range []string{s.BudgetsBucket(), s.RulesBucket()} {
			if _, err := gsJS.KeyValue(ctx, bucket); err != nil {
				t.Fatalf("bucket %s after us tried: %v", bucket, err)
			}
		}
		if en, err := budgets.Get(ctx, "r.x"); err != nil || string(en.Value()) != "doc 1" {
			t.Fatalf("budget after us tried to forge it: %v, %v", en, err)
		}
	})
}
