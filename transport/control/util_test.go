package control

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/geoquota/geoquota/transport/gossip"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		// memberlist's Shutdown does not wait for a probe in flight; it
		// ends at the probe's timeout.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).triggerFunc"))
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.WaitFor(t, within, what, cond)
}

// runGossip makes a gossip node of cfg (a new instance) and carries it
// over nc, ticking it on time.Now, until the test ends.
func runGossip(t *testing.T, nc *nats.Conn, cfg gossip.Config) *Gossip {
	t.Helper()
	return startGossip(t, nc, cfg, GossipOptions{Logger: discardLogger()})
}

// startGossip carries a new node of cfg over nc.
func startGossip(t *testing.T, nc *nats.Conn, cfg gossip.Config, opts GossipOptions) *Gossip {
	t.Helper()
	if cfg.Instance == "" {
		cfg.Instance = NewInstance()
	}
	if cfg.Replica == "" {
		cfg.Replica = cfg.Region + "-" + cfg.Instance
	}
	clock := opts.Clock
	if clock == nil {
		clock = time.Now
	}
	n, err := gossip.New(cfg, clock())
	if err != nil {
		t.Fatal(err)
	}
	g, err := StartGossip(nc, n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}
