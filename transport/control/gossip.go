package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/geoquota/geoquota/transport/gossip"
)

// GossipOptions configures the NATS side of a gossip node.
type GossipOptions struct {
	// Timeout bounds each merge of a message into the region's store. 2s.
	Timeout time.Duration
	// Clock gives the node its time; nil means time.Now.
	Clock func() time.Time
	// Manual leaves the ticking to the caller (Gossip.Tick): a test that
	// drives the node's time. Otherwise a goroutine ticks the node when
	// it is due, until Close.
	Manual bool
	Logger *slog.Logger
}

// Gossip carries a gossip node's messages over NATS: it hands every
// message on the node's subjects to Step, ticks the node when it is due,
// and publishes what Step and Tick return. Its methods are safe for
// concurrent use.
type Gossip struct {
	nc   *nats.Conn
	node *gossip.Node
	opts GossipOptions
	subs []*nats.Subscription

	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// NewInstance returns a random name for this run of a replica
// (gossip.Config.Instance, and Replica if none is set).
func NewInstance() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// StartGossip subscribes to the node's subjects and, unless Manual, starts
// ticking it. Stop it with Close.
func StartGossip(nc *nats.Conn, node *gossip.Node, opts GossipOptions) (*Gossip, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g := &Gossip{nc: nc, node: node, opts: opts, stop: make(chan struct{}), done: make(chan struct{})}
	for _, subject := range node.Subscriptions() {
		sub, err := nc.Subscribe(subject, g.receive)
		if err != nil {
			g.unsubscribe()
			return nil, fmt.Errorf("control: gossip: subscribe %s: %w", subject, err)
		}
		g.subs = append(g.subs, sub)
	}
	if err := nc.FlushTimeout(opts.Timeout); err != nil {
		// The server has not confirmed the subscriptions; they stand
		// and will be confirmed on reconnection.
		opts.Logger.Warn("gossip: subscriptions not confirmed", "err", err)
	}
	if opts.Manual {
		close(g.done)
	} else {
		go g.run()
	}
	return g, nil
}

// Node returns the node the gossip carries.
func (g *Gossip) Node() *gossip.Node { return g.node }

// run ticks the node whenever it is due, until Close; then it publishes
// what changed since the last tick.
func (g *Gossip) run() {
	defer close(g.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-g.stop:
			g.publish(g.node.Flush())
			return
		case <-timer.C:
			g.Tick()
			timer.Reset(max(0, time.Until(g.node.Next())))
		}
	}
}

// Tick has the node do what is due now, and publishes it.
func (g *Gossip) Tick() { g.publish(g.node.Tick(g.opts.Clock())) }

// Close stops the ticking and waits for it, then the subscriptions.
func (g *Gossip) Close() {
	g.closeOnce.Do(func() {
		close(g.stop)
		<-g.done
		g.unsubscribe()
	})
}

func (g *Gossip) unsubscribe() {
	for _, s := range g.subs {
		s.Unsubscribe()
	}
}

func (g *Gossip) receive(m *nats.Msg) {
	seq, _ := strconv.ParseUint(m.Header.Get(gossip.HeaderSeq), 10, 64)
	msg := gossip.Message{Subject: m.Subject, Data: m.Data, Header: gossip.Header{Replica: m.Header.Get(gossip.HeaderReplica),
		Instance: m.Header.Get(gossip.HeaderInstance), Seq: seq}}
	ctx, cancel := context.WithTimeout(context.Background(), g.opts.Timeout)
	defer cancel()
	g.publish(g.node.Step(ctx, g.opts.Clock(), msg))
}

// publish sends messages; one that cannot go is handed back to the node
// (a delta's changes go again with the next).
func (g *Gossip) publish(msgs []gossip.Message) {
	for _, m := range msgs {
		if err := g.send(m); err != nil {
			g.node.Unsent(m)
			if !errors.Is(err, nats.ErrConnectionClosed) {
				g.opts.Logger.Warn("gossip: publish", "subject", m.Subject, "err", err)
			}
		}
	}
}

func (g *Gossip) send(m gossip.Message) error {
	data, err := m.Encode()
	if err != nil {
		return err
	}
	nm := nats.NewMsg(m.Subject)
	nm.Data = data
	nm.Header.Set(gossip.HeaderReplica, m.Header.Replica)
	if m.Header.Instance != "" {
		nm.Header.Set(gossip.HeaderInstance, m.Header.Instance)
	}
	nm.Header.Set(gossip.HeaderSeq, strconv.FormatUint(m.Header.Seq, 10))
	if err := g.nc.PublishMsg(nm); err != nil {
		return fmt.Errorf("control: gossip: publish %s: %w", m.Subject, err)
	}
	g.node.Stats().Sent.Add(1)
	return nil
}
