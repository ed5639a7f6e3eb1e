package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Link is a network link between two processes on loopback that a test
// can cut, heal and slow down: an in-process toxiproxy in front of
// upstream. Connect to Addr instead of upstream. Safe for concurrent use.
type Link struct {
	mu    sync.Mutex
	proxy *toxiproxy.Proxy
	addr  string
	cut   bool
}

var (
	toxiServerOnce sync.Once
	toxiServer     *toxiproxy.ApiServer
)

// NewLink starts a link to upstream on a free loopback port, stopped when
// the test ends.
func NewLink(t testing.TB, upstream string) *Link {
	t.Helper()
	l, err := StartLink(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	return l
}

// StartLink starts a link to upstream on a free loopback port.
func StartLink(upstream string) (*Link, error) {
	toxiServerOnce.Do(func() {
		toxiServer = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	})
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	p := toxiproxy.NewProxy(toxiServer, "link-"+addr, addr, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("harness: link to %s: %w", upstream, err)
	}
	return &Link{proxy: p, addr: addr}, nil
}

// Addr is where to connect to reach upstream through the link.
func (l *Link) Addr() string { return l.addr }

// Cut closes every connection through the link and refuses new ones,
// until Heal.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		l.proxy.Stop()
		l.cut = true
	}
}

// Heal lets connections through again, on the same address.
func (l *Link) Heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		return nil
	}
	var err error
	for range 50 { // the port may linger a moment after Stop
		if err = l.proxy.Start(); err == nil {
			l.cut = false
			return nil
		}
		time.Sleep(20 * time.Millisecond) // retrying a bind, bounded
	}
	return fmt.Errorf("harness: healing link %s: %w", l.addr, err)
}

// SetLatency delays everything through the link by d each way (0: none).
func (l *Link) SetLatency(d time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, dir := range []string{"upstream", "downstream"} {
		name := "latency_" + dir
		if l.proxy.Toxics.GetToxic(name) != nil {
			if err := l.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
				return err
			}
		}
		if d > 0 {
			js := fmt.Sprintf(`{"name":%q,"type":"latency","stream":%q,"attributes":{"latency":%d}}`, name, dir, d.Milliseconds())
			if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Stop closes the link for good.
func (l *Link) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		l.proxy.Stop()
		l.cut = true
	}
}
