package harness

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// serverKinds runs a test against the embedded server and Debian's binary.
func serverKinds(t *testing.T, f func(t *testing.T, binary bool)) {
	for _, binary := range []bool{false, true} {
		name := "embedded"
		if binary {
			name = "binary"
		}
		t.Run(name, func(t *testing.T) { f(t, binary) })
	}
}

func connect(t *testing.T, urls string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond), nats.Timeout(2 * time.Second)}, opts...)
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestNATSServer(t *testing.T) {
	serverKinds(t, func(t *testing.T, binary bool) {
		ctx := testContext(t)
		n := NewNATS(t, NATSOptions{Binary: binary, JetStream: true})
		reconnected := make(chan struct{}, 1)
		nc := connect(t, n.ClientURL(), nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}))

		sub, err := nc.SubscribeSync("greet")
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish("greet", []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "hi" {
			t.Fatalf("pub/sub: %v, %v", m, err)
		}

		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "rules"})
		if err != nil {
			t.Fatal(err)
		}
		w, err := kv.Watch(ctx, "current", jetstream.UpdatesOnly())
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		rev, err := kv.Put(ctx, "current", []byte("v1"))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case e := <-w.Updates():
			if e == nil || string(e.Value()) != "v1" || e.Revision() != rev {
				t.Fatalf("watch delivered %v", e)
			}
		case <-ctx.Done():
			t.Fatal("no watch update")
		}
		// Compare-and-swap on the revision: a stale update is refused.
		if _, err := kv.Update(ctx, "current", []byte("v2"), rev); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Update(ctx, "current", []byte("stale"), rev); err == nil {
			t.Fatal("update on a stale revision succeeded")
		}

		port := n.ClientAddr()
		if err := n.Kill(); err != nil {
			t.Fatal(err)
		}
		if n.Running() {
			t.Fatal("still running after Kill")
		}
		if err := n.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if n.ClientAddr() != port {
			t.Fatalf("restarted on %s, was %s", n.ClientAddr(), port)
		}
		select {
		case <-reconnected:
		case <-ctx.Done():
			t.Fatal("client did not reconnect after restart")
		}
		// The JetStream store survived the kill.
		err = poll(ctx, func(ctx context.Context) error {
			e, err := kv.Get(ctx, "current")
			if err != nil {
				return err
			}
			if string(e.Value()) != "v2" {
				return fmt.Errorf("value %q after restart", e.Value())
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func TestSupercluster(t *testing.T) {
	serverKinds(t, func(t *testing.T, binary bool) {
		ctx := testContext(t)
		sc := NewSupercluster(t, SuperclusterOptions{Binary: binary, JetStream: true, Clusters: []string{"us-east", "eu-west", "ap-south"}})
		if len(sc.Clusters) != 3 || sc.Cluster("eu-west") == nil || sc.Cluster("mars") != nil {
			t.Fatalf("clusters: %+v", sc.Clusters)
		}
		us := connect(t, sc.Cluster("us-east").ClientURLs())
		ap := connect(t, sc.Cluster("ap-south").ClientURLs())

		// A request from us-east answered in ap-south crosses a gateway.
		sub, err := ap.Subscribe("usage.ap-south", func(m *nats.Msg) { m.Respond(append([]byte("ap-south got "), m.Data...)) })
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		ap.Flush()
		requestAcross(ctx, t, us, "usage.ap-south", "ping", "ap-south got ping")

		// A KV bucket made in one cluster is read and watched from another.
		usJS, _ := jetstream.New(us)
		apJS, _ := jetstream.New(ap)
		kv, err := usJS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "budgets"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "share.ap-south", []byte("0.3")); err != nil {
			t.Fatal(err)
		}
		err = poll(ctx, func(ctx context.Context) error {
			apKV, err := apJS.KeyValue(ctx, "budgets")
			if err != nil {
				return err
			}
			e, err := apKV.Get(ctx, "share.ap-south")
			if err != nil {
				return err
			}
			if string(e.Value()) != "0.3" {
				return fmt.Errorf("value %q", e.Value())
			}
			return nil
		})
		if err != nil {
			t.Fatalf("KV across the gateway: %v", err)
		}

		// A server killed and restarted rejoins; messages cross again.
		eu := sc.Cluster("eu-west").Servers[0]
		if err := eu.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := eu.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sc.WaitConnected(ctx); err != nil {
			t.Fatal(err)
		}
		euc := connect(t, sc.Cluster("eu-west").ClientURLs())
		requestAcross(ctx, t, euc, "usage.ap-south", "again", "ap-south got again")
	})
}

func TestSuperclusterRoutes(t *testing.T) {
	ctx := testContext(t)
	sc := NewSupercluster(t, SuperclusterOptions{Clusters: []string{"a", "b"}, ServersPerCluster: 2})
	if got := len(sc.Servers()); got != 4 {
		t.Fatalf("%d servers, want 4", got)
	}
	// In from one server of a cluster, out from the other server of another.
	a := connect(t, sc.Cluster("a").Servers[0].ClientURL())
	b := connect(t, sc.Cluster("b").Servers[1].ClientURL())
	sub, err := b.Subscribe("x", func(m *nats.Msg) { m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	b.Flush()
	requestAcross(ctx, t, a, "x", "hello", "hello")
}

// requestAcross sends a request until it is answered: interest takes a
// moment to propagate over gateways.
func requestAcross(ctx context.Context, t *testing.T, nc *nats.Conn, subject, data, want string) {
	t.Helper()
	err := poll(ctx, func(ctx context.Context) error {
		m, err := nc.RequestWithContext(ctx, subject, []byte(data))
		if err != nil {
			return err
		}
		if string(m.Data) != want {
			return fmt.Errorf("reply %q, want %q", m.Data, want)
		}
		return nil
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("request on %s: %v", subject, err)
	}
}

func TestNATSOnTakenPortsIsNotReady(t *testing.T) {
	serverKinds(t, func(t *testing.T, binary bool) {
		other := NewNATS(t, NATSOptions{Binary: binary})
		dir := t.TempDir()
		n := &NATS{name: uniqueName("intruder"), ports: other.ports, dir: dir, binary: binary}
		if err := n.writeConfig(nil, nil); err != nil {
			t.Fatal(err)
		}
		err := n.startAndWait(testContext(t))
		defer n.Stop()
		if !errors.Is(err, errPortTaken) {
			t.Fatalf("start on taken ports: %v, want errPortTaken", err)
		}
	})
}

// outboundGateway returns the port a server's outbound gateway connection
// to cluster is connected to, or 0 without one.
func outboundGateway(ctx context.Context, n *NATS, cluster string) (int, error) {
	var gatewayz struct {
		Outbound map[string]struct {
			Connection struct {
				Port int `json:"port"`
			} `json:"connection"`
		} `json:"outbound_gateways"`
	}
	if err := n.monitor(ctx, "/gatewayz", &gatewayz); err != nil {
		return 0, err
	}
	return gatewayz.Outbound[cluster].Connection.Port, nil
}

// gatewayURLs returns the addresses a server dials cluster's gateways at
// (host:port), as its monitoring reports them.
func gatewayURLs(ctx context.Context, n *NATS, cluster string) ([]string, error) {
	var varz struct {
		Gateway struct {
			Gateways []struct {
				Name string   `json:"name"`
				URLs []string `json:"urls"`
			} `json:"gateways"`
		} `json:"gateway"`
	}
	if err := n.monitor(ctx, "/varz", &varz); err != nil {
		return nil, err
	}
	for _, g := range varz.Gateway.Gateways {
		if g.Name == cluster {
			return g.URLs, nil
		}
	}
	return nil, fmt.Errorf("nats: no gateway %s in /varz", cluster)
}

// TestSuperclusterLinks: with Links, every gateway connection goes
// through a link; cutting a cluster's links both ways cuts it off from
// that cluster alone, it does not find its way around them while cut, and
// healing them joins the clusters again.
func TestSuperclusterLinks(t *testing.T) {
	serverKinds(t, func(t *testing.T, binary bool) {
		ctx := testContext(t)
		sc := NewSupercluster(t, SuperclusterOptions{Binary: binary, Clusters: []string{"a", "b", "c"}, Links: true})
		if sc.Link("a", "a") != nil || len(sc.Link("a", "b")) != 1 {
			t.Fatalf("links a→a %v, a→b %v", sc.Link("a", "a"), sc.Link("a", "b"))
		}
		a := connect(t, sc.Cluster("a").ClientURLs())
		for _, name := range []string{"b", "c"} {
			nc := connect(t, sc.Cluster(name).ClientURLs())
			sub, err := nc.Subscribe("echo."+name, func(m *nats.Msg) { m.Respond(m.Data) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sub.Unsubscribe() })
			nc.Flush()
			requestAcross(ctx, t, a, "echo."+name, "hi", "hi")
		}
		for _, from := range []string{"a", "b", "c"} {
			for _, to := range []string{"a", "b", "c"} {
				if from == to {
					continue
				}
				port, err := outboundGateway(ctx, sc.Cluster(from).Servers[0], to)
				if err != nil {
					t.Fatal(err)
				}
				if want := sc.Link(from, to)[0].port(); port != want {
					t.Errorf("%s's gateway to %s is connected to port %d, not its link's %d", from, to, port, want)
				}
				// The addresses it would redial: its own links and the
				// advertised nowhere, none it was told of by the
				// others (another cluster's link to to).
				urls, err := gatewayURLs(ctx, sc.Cluster(from).Servers[0], to)
				if err != nil {
					t.Fatal(err)
				}
				for _, u := range urls {
					own := u == "127.0.0.1:1"
					for _, l := range sc.Link(from, to) {
						own = own || u == l.Addr()
					}
					if !own {
						t.Errorf("%s would redial %s at %s, not a link of its own (%v)", from, to, u, urls)
					}
				}
			}
		}

		cut := func(heal bool) {
			for _, l := range append(sc.Link("a", "b"), sc.Link("b", "a")...) {
				if heal {
					if err := l.Heal(); err != nil {
						t.Fatal(err)
					}
				} else {
					l.Cut()
				}
			}
		}
		cut(false)
		err := poll(ctx, func(ctx context.Context) error {
			if port, err := outboundGateway(ctx, sc.Cluster("a").Servers[0], "b"); err != nil || port != 0 {
				return fmt.Errorf("a's gateway to b still connected to %d (%v)", port, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// The gateway redials every second: for three seconds it must not
		// reach b around its link.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if port, err := outboundGateway(ctx, sc.Cluster("a").Servers[0], "b"); err != nil || port != 0 {
				t.Fatalf("a's gateway to b while cut: port %d, %v (b listens on %s, link %s)", port, err, sc.Cluster("b").Servers[0].GatewayAddr(), sc.Link("a", "b")[0].Addr())
			}
			time.Sleep(50 * time.Millisecond) // polling a condition that must hold throughout
		}
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = a.RequestWithContext(rctx, "echo.b", []byte("cut"))
		cancel()
		if err == nil {
			t.Fatal("a request from a reached b while their links were cut")
		}
		requestAcross(ctx, t, a, "echo.c", "still", "still")

		cut(true)
		if err := sc.WaitConnected(ctx); err != nil {
			t.Fatal(err)
		}
		requestAcross(ctx, t, a, "echo.b", "healed", "healed")
	})
}
