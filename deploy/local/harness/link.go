package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
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

func (l *Link) port() int {
	_, p, _ := net.SplitHostPort(l.addr)
	n, _ := strconv.Atoi(p)
	return n
}

// Cutoff reports whether the link is cut.
func (l *Link) Cutoff() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

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

// gatewayFrom is a toxic that lets through only gateway connections dialled
// by one cluster: it reads the CONNECT a gateway sends first and closes the
// connection unless its "gateway" names that cluster. NATS servers tell
// each other every gateway address they know (gatewayGossip keeps the
// links' addresses out of that), and without it a server cut off from
// another on its own link would redial it through a link meant for a
// third cluster.
type gatewayFrom struct {
	Cluster string `json:"cluster"`
}

// gatewayFromState is what one connection has shown so far.
type gatewayFromState struct {
	head   []byte
	passed bool
}

func (t *gatewayFrom) NewState() any { return new(gatewayFromState) }

func (t *gatewayFrom) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*gatewayFromState)
	pipe(stub, func(c *stream.StreamChunk) bool {
		if st.passed {
			stub.Output <- c
			return true
		}
		st.head = append(st.head, c.Data...)
		line, _, complete := bytes.Cut(st.head, []byte("\r\n"))
		if !complete {
			return len(st.head) <= 64<<10
		}
		var connect struct {
			Gateway string `json:"gateway"`
		}
		js, isConnect := bytes.CutPrefix(line, []byte("CONNECT "))
		if !isConnect || json.Unmarshal(js, &connect) != nil || connect.Gateway != t.Cluster {
			return false
		}
		st.passed = true
		stub.Output <- &stream.StreamChunk{Data: st.head, Timestamp: c.Timestamp}
		st.head = nil
		return true
	})
}

// pipe runs a toxic: f takes each chunk that comes in, until the stub is
// interrupted (toxics changed: the state carries on), the stream ends, or
// f returns false, which closes the connection.
func pipe(stub *toxics.ToxicStub, f func(c *stream.StreamChunk) bool) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil || !f(c) {
				stub.Close()
				return
			}
		}
	}
}

// gatewayGossip is a toxic on what a gateway link carries back to the
// server that dialled: it drops the INFO lines that gossip other
// clusters' gateway addresses ("gateway_cmd": 1). A server tells each
// server that dials it the addresses it dials the other clusters at — its
// own links — and the dialler adds them to those it redials: cut off from
// b on its own link, a would dial b through c's link to b, and be seen
// connected until gatewayFrom closed it (nats-server's
// gossipGatewaysToInboundGateway, processImplicitGateway). What the
// accepting side of a gateway sends is lines alone (INFO, PING, PONG,
// interest): messages go out only on the dialler's side.
type gatewayGossip struct{}

// gatewayGossipState is a line not yet complete.
type gatewayGossipState struct{ partial []byte }

func (t *gatewayGossip) NewState() any { return new(gatewayGossipState) }

func (t *gatewayGossip) Pipe(stub *toxics.ToxicStub) {
	st := stub.State.(*gatewayGossipState)
	crlf := []byte("\r\n")
	pipe(stub, func(c *stream.StreamChunk) bool {
		st.partial = append(st.partial, c.Data...)
		var out []byte
		rest := st.partial
		for {
			line, after, complete := bytes.Cut(rest, crlf)
			if !complete {
				break
			}
			if !isGatewayGossip(line) {
				out = append(append(out, line...), crlf...)
			}
			rest = after
		}
		st.partial = append([]byte(nil), rest...)
		if len(out) > 0 {
			stub.Output <- &stream.StreamChunk{Data: out, Timestamp: c.Timestamp}
		}
		return len(st.partial) <= 1<<20
	})
}

// isGatewayGossip reports whether a line is an INFO gossiping gateway
// addresses.
func isGatewayGossip(line []byte) bool {
	js, ok := bytes.CutPrefix(line, []byte("INFO "))
	if !ok {
		return false
	}
	var info struct {
		Cmd int `json:"gateway_cmd"`
	}
	return json.Unmarshal(js, &info) == nil && info.Cmd == 1
}

func init() {
	toxics.Register(gatewayFromToxic, new(gatewayFrom))
	toxics.Register(gatewayGossipToxic, new(gatewayGossip))
}

const (
	gatewayFromToxic   = "geoquota_gateway_from"
	gatewayGossipToxic = "geoquota_gateway_gossip"
)

// startGatewayLink starts a link to a NATS server's gateway port that only
// cluster from's gateway connections may use.
func startGatewayLink(upstream, from string) (*Link, error) {
	l, err := StartLink(upstream)
	if err != nil {
		return nil, err
	}
	for _, js := range []string{
		fmt.Sprintf(`{"name":"gateway_from","type":%q,"stream":"upstream","attributes":{"cluster":%q}}`, gatewayFromToxic, from),
		fmt.Sprintf(`{"name":"gateway_gossip","type":%q,"stream":"downstream"}`, gatewayGossipToxic),
	} {
		if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
			l.Stop()
			return nil, fmt.Errorf("harness: gateway link from %s to %s: %w", from, upstream, err)
		}
	}
	return l, nil
}
