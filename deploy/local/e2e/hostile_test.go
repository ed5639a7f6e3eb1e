//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/control"
	"github.com/geoquota/geoquota/transport/gossip"
	"github.com/geoquota/geoquota/transport/namespace"
)

// TestHostileClients attacks a deployment that runs as shipped
// (authentication on), from the same network: without credentials, with
// credentials the servers do not know, and with a region's own identity
// (a region compromised). Every forgery is refused or changes nothing:
// what the regions counted stays what was sent, the rules and the leader
// stay, and each refusal is counted by its reason.
func TestHostileClients(t *testing.T) {
	d := deploy(t, harness.DeploymentOptions{Regions: []string{"us", "eu"}, Replicas: 2, GlobalSyncs: 1,
		Rules: []byte(strictRules(100, time.Hour))})
	us, eu := d.Region("us"), d.Region("eu")
	st := openStores(t, d)
	// What is really counted: 3 checks in us, 2 in eu, of key k1.
	window := time.Now().Truncate(time.Hour).UnixMilli()
	for range 3 {
		if code, _, body := check(t, us.Replicas[0], "k1"); code != http.StatusOK {
			t.Fatalf("a check in us: %d %s", code, body)
		}
	}
	for range 2 {
		if code, _, body := check(t, eu.Replicas[0], "k1"); code != http.StatusOK {
			t.Fatalf("a check in eu: %d %s", code, body)
		}
	}
	if window != time.Now().Truncate(time.Hour).UnixMilli() {
		t.Skip("the hour turned while counting") // a rerun lands inside one
	}
	counted := func() error {
		for _, r := range []string{"us", "eu"} {
			s, err := st.slots(r, "k1", window)
			if err != nil {
				return err
			}
			if s["us"] != 3 || s["eu"] != 2 || len(s) != 2 {
				return fmt.Errorf("%s's Redis holds %v of k1, want us 3 and eu 2", r, s)
			}
		}
		return nil
	}
	waitNoErr(t, 30*time.Second, "both regions count what was sent", counted)

	urls := us.NATS.ClientURLs()
	// No credentials, and credentials the servers do not know.
	if nc, err := nats.Connect(urls, nats.Timeout(2*time.Second), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("an anonymous client connected")
	}
	stranger, err := harness.NewIdentity(t.TempDir(), "stranger", nil)
	if err != nil {
		t.Fatal(err)
	}
	opt, _ := stranger.Option()
	if nc, err := nats.Connect(urls, opt, nats.Timeout(2*time.Second), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("a client with an nkey the servers do not know connected")
	}

	// A region's own identity: us, compromised.
	var mu sync.Mutex
	var violations []string
	opt, _ = d.Identity("regiond-us").Option()
	nc, err := nats.Connect(urls, opt, nats.Timeout(2*time.Second), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		violations = append(violations, err.Error())
		mu.Unlock()
	}))
	if err != nil {
		t.Fatalf("us's identity: %v", err)
	}
	defer nc.Close()
	var names namespace.Names
	seq := uint64(time.Now().UnixNano())
	publish := func(subject string, d crdt.Delta) {
		t.Helper()
		b, err := crdt.AppendDelta(nil, d)
		if err != nil {
			t.Fatal(err)
		}
		seq++
		m := nats.NewMsg(subject)
		m.Data = b
		m.Header.Set(gossip.HeaderReplica, "intruder")
		m.Header.Set(gossip.HeaderInstance, "x")
		m.Header.Set(gossip.HeaderSeq, strconv.FormatUint(seq, 10))
		if err := nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	k1 := regional.CounterKey("g", "k1")
	slot := func(region string, p uint64) []crdt.Slot { return []crdt.Slot{{Region: region, P: p}} }
	// Under another region's name, and on globalsync's subjects: refused
	// by the servers.
	publish(names.Delta("eu"), crdt.Delta{Origin: "eu", To: 1, Entries: []crdt.Entry{{ID: crdt.ID{Key: k1, Epoch: window}, Slots: slot("eu", 1000)}}})
	for _, subject := range []string{names.PushBudgets(), names.PushRules(), names.Heartbeat("eu"), names.Ask("eu", namespace.GlobalSync)} {
		if err := nc.Publish(subject, []byte(`{"rule":"g","seq":999999999,"leases":{"us":{"floor":0,"share":1}}}`)); err != nil {
			t.Fatal(err)
		}
	}
	js, _ := jetstream.New(nc)
	for bucket, key := range map[string]string{names.BudgetsBucket(): control.BudgetKey("g"), names.RulesBucket(): control.RulesKey, names.LeaderBucket(): control.LeaderKey} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		if kv, err := js.KeyValue(ctx, bucket); err == nil {
			if _, err := kv.Put(ctx, key, []byte("rules: []\n")); err == nil {
				t.Errorf("us wrote %s/%s", bucket, key)
			}
		}
		cancel()
	}
	// Under its own name, what the receivers must refuse themselves:
	// another region's slot (twice: one of a region no one knows), a
	// window of 2100, a rule no one has, a replay.
	later := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	publish(names.Delta("us"), crdt.Delta{Origin: "us", To: 1, Entries: []crdt.Entry{{ID: crdt.ID{Key: k1, Epoch: window}, Slots: slot("eu", 1000)}}})
	publish(names.Delta("us"), crdt.Delta{Origin: "us", To: 2, Entries: []crdt.Entry{{ID: crdt.ID{Key: k1, Epoch: later}, Slots: slot("us", 1000)}}})
	publish(names.Delta("us"), crdt.Delta{Origin: "us", To: 3, Entries: []crdt.Entry{{ID: crdt.ID{Key: regional.CounterKey("nope", "x"), Epoch: window}, Slots: slot("us", 1000)}}})
	publish(names.Delta("us"), crdt.Delta{Origin: "us", To: 4, Entries: []crdt.Entry{{ID: crdt.ID{Key: k1, Epoch: window}, Slots: slot("mars", 1000)}}})
	seq-- // the same number again: a replay
	publish(names.Delta("us"), crdt.Delta{Origin: "us", To: 4, Entries: []crdt.Entry{{ID: crdt.ID{Key: k1, Epoch: window}, Slots: slot("us", 1000)}}})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// A region no one knows, as only an identity allowed every subject
	// (the operator's) may name one.
	opt, _ = d.Identity("operator").Option()
	op, err := nats.Connect(urls, opt, nats.Timeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	b, _ := crdt.AppendDelta(nil, crdt.Delta{Origin: "mars", To: 1, Entries: []crdt.Entry{{ID: crdt.ID{Key: k1, Epoch: window}, Slots: slot("mars", 1000)}}})
	m := nats.NewMsg(names.Delta("mars"))
	m.Data = b
	m.Header.Set(gossip.HeaderReplica, "martian")
	m.Header.Set(gossip.HeaderSeq, "1")
	if err := op.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	op.Flush()

	waitNoErr(t, 15*time.Second, "the servers refused us's forgeries", func() error {
		mu.Lock()
		defer mu.Unlock()
		all := strings.Join(violations, "\n")
		for _, subject := range []string{names.Delta("eu"), names.PushBudgets(), names.PushRules(), names.Heartbeat("eu"), names.Ask("eu", namespace.GlobalSync)} {
			if !strings.Contains(all, `"`+subject+`"`) {
				return fmt.Errorf("no permissions violation for %s in %q", subject, all)
			}
		}
		return nil
	})
	for _, rep := range eu.Replicas {
		waitNoErr(t, 15*time.Second, rep.Name+" counted the forgeries it refused", func() error {
			for _, reason := range []string{"spoofed", "ahead", "unknown_rule", "unknown_region", "replayed"} {
				if v, err := metricValue(rep, `geoquota_gossip_refused_total{reason="`+reason+`"}`); err != nil || v < 1 {
					return fmt.Errorf("%s refused %v for %s (%v)", rep.Name, v, reason, err)
				}
			}
			return nil
		})
	}

	// A node that is not one of eu's replicas asks to join them.
	cfg := memberlist.DefaultLocalConfig()
	cfg.Name, cfg.BindAddr, cfg.BindPort, cfg.AdvertisePort = "intruder", "127.0.0.1", 0, 0
	cfg.LogOutput = io.Discard
	ml, err := memberlist.Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := ml.Join([]string{eu.Replicas[0].Memberlist}); err == nil || n > 0 {
		t.Errorf("a node without the key joined eu's replicas: %d, %v", n, err)
	}
	ml.Shutdown()

	// Nothing counted changed; the rules, the budgets' leader and the
	// leading globalsync are as they were.
	if err := counted(); err != nil {
		t.Error(err)
	}
	for _, r := range []string{"us", "eu"} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		keys, err := st.clients[r].Keys(ctx, "*").Result()
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if strings.Contains(k, strconv.FormatInt(later, 10)) || strings.Contains(k, "{nope:") || strings.Contains(k, "mars") {
				t.Errorf("%s's Redis holds %s", r, k)
			}
		}
	}
	if code, _, body := check(t, eu.Replicas[1], "k1"); code != http.StatusOK || !strings.Contains(body, `"limit":100`) {
		t.Errorf("a check in eu after the attack: %d %s; want allowed under the limit of 100", code, body)
	}
	if !leads(d.GlobalSyncs[0]) {
		t.Error("globalsync no longer leads")
	}
	if seq, leader := budgetSeq(d.GlobalSyncs[0]); seq == 0 || leader != d.GlobalSyncs[0].Name {
		t.Errorf("the budgets of g: seq %d by %q, want globalsync's own", seq, leader)
	}
}

// waitNoErr polls f until it returns nil, or fails the test with its last
// error after within.
func waitNoErr(t *testing.T, within time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, with a deadline
	}
}

// metricValue reads one series from a daemon's /metrics.
func metricValue(dm *harness.Daemon, series string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+dm.HTTPAddr+"/metrics", nil)
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, errors.New("no series " + series)
}
