package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/transport/control"
	"github.com/geoquota/geoquota/transport/namespace"
)

// TestNATSConfigFlags: each bad flag is refused, naming it, and nothing
// is written.
func TestNATSConfigFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-regions", "us,eu"}, "-out"},
		{[]string{"-out", dir}, "-regions"},
		{[]string{"-out", dir, "-regions", "us,,eu"}, `region ""`},
		{[]string{"-out", dir, "-regions", "us,e.u"}, "e.u"},
		{[]string{"-out", dir, "-regions", "us,eu,us"}, "named twice"},
		{[]string{"-out", dir, "-regions", "us,globalsync"}, "globalsync"},
		{[]string{"-out", dir, "-regions", "us", "-deployment", "pr.od"}, "-deployment"},
		{[]string{"-out", dir, "-regions", "us", "surplus"}, "surplus"},
	} {
		err := run(append([]string{"nats-config"}, tc.args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("nats-config %v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("a refused nats-config wrote %s: %v", dir, err)
	}
	var help strings.Builder
	if err := run([]string{"nats-config", "-h"}, &help, io.Discard); err != nil {
		t.Fatalf("nats-config -h: %v", err)
	}
	for _, want := range []string{"usage: go run ./deploy/local nats-config", "-deployment", "-regions", "-out", "docs/operations.md"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("nats-config -h does not say %q:\n%s", want, help.String())
		}
	}
}

// TestNATSConfig writes a named deployment's NATS accounts with
// nats-config and starts a server on them (the embedded one and Debian's
// nats-server): only the deployment's identities get in; globalsync makes
// and writes the buckets, which a region reads and cannot write; each
// region's gossip goes through under its own name only, and not under
// another region's or another deployment's names.
func TestNATSConfig(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	args := []string{"nats-config", "-deployment", "prod", "-regions", "us,eu,ap", "-out", dir}
	var out strings.Builder
	if err := run(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"regiond-us", "regiond-eu", "regiond-ap", "globalsync", "operator"} {
		seed := filepath.Join(dir, id+".nk")
		fi, err := os.Stat(seed)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v; want a seed only its owner reads", seed, fi, err)
		}
		if !strings.Contains(out.String(), seed) {
			t.Errorf("nats-config does not say what %s is for:\n%s", seed, out.String())
		}
	}
	if !strings.Contains(out.String(), "regiond --region us --deployment prod --nats-nkey") {
		t.Errorf("nats-config does not give regiond its flags:\n%s", out.String())
	}
	if err := run(args, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("nats-config over its own output: %v, want a refusal", err)
	}

	n, err := namespace.New("prod")
	if err != nil {
		t.Fatal(err)
	}
	var unnamed namespace.Names
	for _, binary := range []bool{false, true} {
		name := "embedded"
		if binary {
			name = "binary"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			srv := harness.NewNATS(t, harness.NATSOptions{Binary: binary, JetStream: true, Include: filepath.Join(dir, "accounts.conf")})

			if nc, err := nats.Connect(srv.ClientURL(), nats.Timeout(2*time.Second)); err == nil {
				nc.Close()
				t.Fatal("an anonymous client connected")
			} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Fatalf("anonymous client: %v, want an authorization violation", err)
			}
			as := func(id, inbox string) (*nats.Conn, *violations) {
				o, err := nats.NkeyOptionFromSeed(filepath.Join(dir, id+".nk"))
				if err != nil {
					t.Fatal(err)
				}
				v := new(violations)
				opts := []nats.Option{o, nats.ErrorHandler(v.handler), nats.Timeout(2 * time.Second)}
				if inbox != "" {
					opts = append(opts, nats.CustomInboxPrefix(inbox))
				}
				nc, err := nats.Connect(srv.ClientURL(), opts...)
				if err != nil {
					t.Fatalf("%s: %v", id, err)
				}
				t.Cleanup(nc.Close)
				return nc, v
			}
			gsc, _ := as("globalsync", n.Inbox(namespace.GlobalSync))
			usc, usv := as("regiond-us", n.Inbox("us"))
			euc, _ := as("regiond-eu", n.Inbox("eu"))
			opc, _ := as("operator", "")

			// globalsync makes the buckets and writes a budget; us reads it
			// and cannot write it.
			gsJS, _ := jetstream.New(gsc)
			var budgets jetstream.KeyValue
			for _, cfg := range []jetstream.KeyValueConfig{control.BudgetsBucketConfig(n), control.RulesBucketConfig(n), control.LeaderBucketConfig(n)} {
				kv, err := gsJS.CreateOrUpdateKeyValue(ctx, cfg)
				if err != nil {
					t.Fatalf("globalsync makes %s: %v", cfg.Bucket, err)
				}
				if cfg.Bucket == n.BudgetsBucket() {
					budgets = kv
				}
			}
			if _, err := budgets.Put(ctx, "r.x", []byte("doc 1")); err != nil {
				t.Fatalf("globalsync writes a budget: %v", err)
			}
			usJS, _ := jetstream.New(usc)
			usBudgets, err := usJS.KeyValue(ctx, n.BudgetsBucket())
			if err != nil {
				t.Fatalf("us opens the budgets: %v", err)
			}
			if en, err := usBudgets.Get(ctx, "r.x"); err != nil || string(en.Value()) != "doc 1" {
				t.Fatalf("us reads a budget: %v, %v", en, err)
			}
			pctx, pcancel := context.WithTimeout(ctx, time.Second)
			_, err = usBudgets.Put(pctx, "r.x", []byte("forged"))
			pcancel()
			if err == nil {
				t.Fatal("us wrote a budget")
			}

			// Gossip: us's and eu's own go through; us's under eu's name,
			// as globalsync, and under the unnamed deployment's names do not.
			sub, err := opc.SubscribeSync(">")
			if err != nil {
				t.Fatal(err)
			}
			opc.Flush()
			refused := []string{n.Delta("eu"), n.Heartbeat("eu"), n.PushBudgets(), n.Ask("eu", namespace.GlobalSync), unnamed.Delta("us")}
			for _, subject := range append(refused, n.Delta("us")) {
				if err := usc.Publish(subject, []byte(subject)); err != nil {
					t.Fatal(err)
				}
			}
			usc.Flush()
			if err := euc.Publish(n.Delta("eu"), []byte("eu")); err != nil {
				t.Fatal(err)
			}
			euc.Flush()
			for _, want := range []string{n.Delta("us"), n.Delta("eu")} {
				for {
					m, err := sub.NextMsg(10 * time.Second)
					if err != nil {
						t.Fatalf("waiting for %s: %v", want, err)
					}
					if strings.HasPrefix(m.Subject, "$JS.") || strings.HasPrefix(m.Subject, "_INBOX") || strings.HasPrefix(m.Subject, "$KV.") {
						continue // JetStream's own traffic, in the account
					}
					if m.Subject != want {
						t.Fatalf("got %s (%q), want only %s: us published under a name not its own", m.Subject, m.Data, want)
					}
					break
				}
			}
			for _, subject := range refused {
				harness.WaitFor(t, 10*time.Second, "a permissions violation reported for "+subject, func() bool { return usv.has(subject) })
			}
		})
	}
}

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
