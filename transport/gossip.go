package transport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/nats-io/nats.go"
)

// GossipConfig configures a region's gossip over NATS. Zero fields take
// the defaults of DefaultGossipConfig.
type GossipConfig struct {
	// Region is this region; Replica tells this process from the region's
	// other replicas (default: random).
	Region, Replica string
	// Interval is how often the region's changed slots are published.
	// 250ms.
	Interval time.Duration
	// AntiEntropy is how often the region publishes its digest, for the
	// others to send what it misses. 10s.
	AntiEntropy time.Duration
	// Heartbeat is how often the replica reports its demand and the
	// leases it holds. 500ms.
	Heartbeat time.Duration
	// Prefix starts every subject. "geoquota".
	Prefix string
	// Timeout bounds each merge into the store. 2s.
	Timeout time.Duration
	// MaxEntries bounds the counters in one message, so that a message
	// stays within NATS's payload limit (1 MB by default). 20,000.
	MaxEntries int
	// Elected, if set, says whether this replica is the one its region
	// elected (Members.Elected) to trade digests for anti-entropy; the
	// others leave it to it. Unset: every replica does.
	Elected func() bool
	// Resync, if set, is fired when a region silent for longer than
	// StaleAfter is heard again (a partition healed), for the KV
	// watchers (WatchBudgets, WatchRules) to catch up at once.
	Resync *Resync
	// Clock returns the time; nil means time.Now.
	Clock  func() time.Time
	Logger *slog.Logger
}

// DefaultGossipConfig returns the defaults of SPEC §12.
func DefaultGossipConfig() GossipConfig {
	return GossipConfig{Interval: 250 * time.Millisecond, AntiEntropy: 10 * time.Second,
		Heartbeat: 500 * time.Millisecond, Prefix: "geoquota", Timeout: 2 * time.Second, MaxEntries: 20_000}
}

func (c GossipConfig) withDefaults() GossipConfig {
	d := DefaultGossipConfig()
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.AntiEntropy <= 0 {
		c.AntiEntropy = d.AntiEntropy
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.Timeout <= 0 {
		c.Timeout = d.Timeout
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = d.MaxEntries
	}
	if c.Replica == "" {
		var b [6]byte
		rand.Read(b[:])
		c.Replica = hex.EncodeToString(b[:])
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Subjects of the gossip, under the prefix: <prefix>.<kind>.<region>, the
// region that sends last.
const (
	kindDelta     = "delta"     // a region's changed slots, from any of its replicas
	kindDigest    = "digest"    // a region's digest, for anti-entropy
	kindRepair    = "repair"    // slots a region misses: <prefix>.repair.<to>.<from>
	kindHeartbeat = "heartbeat" // a replica's demand and leases, for globalsync
)

// Message headers: the sending replica and its message number, so that a
// replayed message is told from a new one. Every sender of gossip sets
// them (globalsync too, for its digest).
const (
	HeaderReplica  = "Geoquota-Replica"
	HeaderInstance = "Geoquota-Instance" // random per process: a restarted replica numbers afresh
	HeaderSeq      = "Geoquota-Seq"
)

// GossipStats counts what the gossip did and what it refused.
type GossipStats struct {
	Published, Received atomic.Int64 // messages
	// Applied slots raised this region's copy; Repaired is the part of
	// them that came by anti-entropy.
	Applied, Repaired atomic.Int64
	// Refused messages: malformed, from an unknown region, sent under
	// another region's name, or replayed.
	Malformed, UnknownRegion, Spoofed, Replayed atomic.Int64
	// Regressed slots were the sender's own and below what this region
	// holds: a region replaying old state, or one that lost its own
	// counters — or, now and then, only a repair that relayed its slot and
	// overtook its own older delta. A lasting rise is the sign to heed.
	Regressed   atomic.Int64
	StoreErrors atomic.Int64
	// Digests published, and other regions' digests answered.
	Digests, DigestsAnswered atomic.Int64
}

// Refused returns the messages and slots refused as bad.
func (s *GossipStats) Refused() int64 {
	return s.Malformed.Load() + s.UnknownRegion.Load() + s.Spoofed.Load() + s.Replayed.Load() + s.Regressed.Load()
}

// Heartbeat is what a replica tells globalsync, every GossipConfig.Heartbeat.
type Heartbeat struct {
	Region  string `json:"region"`
	Replica string `json:"replica"`
	// SentMillis is the replica's clock when it sent the heartbeat.
	SentMillis int64 `json:"sent_ms"`
	// Regions are the regions this one was told of (--regions), itself
	// included: globalsync counts them all, heard from or not, when it
	// splits the reserve into floors.
	Regions []string `json:"regions,omitempty"`
	// Rules reports each global rule.
	Rules map[string]RuleReport `json:"rules"`
}

// RuleReport is one replica's report on one global rule: demand so far
// (limits, cumulative since the replica started), the lease it may
// acknowledge, and what it used in the current window.
type RuleReport struct {
	Admitted  float64 `json:"admitted"`
	Denied    float64 `json:"denied"`
	Acked     uint64  `json:"acked,omitempty"`
	Used      float64 `json:"used"`
	UsedEpoch int64   `json:"used_epoch"`
	// WindowMillis is the rule's window, which UsedEpoch counts in, and
	// Algorithm its algorithm.
	WindowMillis int64  `json:"window_ms"`
	Algorithm    string `json:"algorithm"`
	// Limit is the rule's limit as this replica enforces it (0 for a rule
	// limited by tier): a region that has not yet heard of a lower limit
	// still allows itself its floor of the higher one.
	Limit int64 `json:"limit,omitempty"`
}

// Gossip publishes this region's global usage over NATS and merges the
// other regions', repairs lost messages by anti-entropy, and sends the
// heartbeat. Its methods are safe for concurrent use.
type Gossip struct {
	cfg      GossipConfig
	nc       *nats.Conn
	engine   *regional.Engine
	subs     []*nats.Subscription
	seq      atomic.Uint64
	instance string

	mu        sync.Mutex
	published uint64               // the usage version last published
	heard     map[string]time.Time // region → last message
	// rejoined are regions heard again after a silence whose digest has
	// not come since: when it comes, this region sends its own again.
	rejoined map[string]bool
	replicas map[string]replicaSeen

	stats  GossipStats
	kick   chan struct{} // publish the digest now: a region is heard again
	rejoin chan struct{} // and again twice, a second apart
	cancel context.CancelFunc
	done   chan struct{}
}

type replicaSeen struct {
	region string
	seq    uint64
	at     time.Time
}

// StartGossip subscribes to the other regions and starts publishing. Stop
// it with Close.
func StartGossip(nc *nats.Conn, engine *regional.Engine, cfg GossipConfig) (*Gossip, error) {
	cfg = cfg.withDefaults()
	if cfg.Region == "" || strings.ContainsAny(cfg.Region, ".*> ") {
		return nil, fmt.Errorf("transport: gossip: region %q: want a name without dots, spaces or wildcards", cfg.Region)
	}
	var inst [6]byte
	rand.Read(inst[:])
	g := &Gossip{cfg: cfg, nc: nc, engine: engine, heard: map[string]time.Time{}, rejoined: map[string]bool{}, replicas: map[string]replicaSeen{},
		kick: make(chan struct{}, 1), rejoin: make(chan struct{}, 1), done: make(chan struct{}), instance: hex.EncodeToString(inst[:])}
	for _, s := range []struct {
		subject string
		handle  func(*nats.Msg)
	}{
		{g.subject(kindDelta, "*"), g.onDelta},
		{g.subject(kindRepair, cfg.Region+".*"), g.onRepair},
		{g.subject(kindDigest, "*"), g.onDigest},
		{g.subject(kindHeartbeat, "*"), g.onHeartbeat},
	} {
		sub, err := nc.Subscribe(s.subject, s.handle)
		if err != nil {
			g.unsubscribe()
			return nil, fmt.Errorf("transport: gossip: subscribe %s: %w", s.subject, err)
		}
		g.subs = append(g.subs, sub)
	}
	if err := nc.FlushTimeout(cfg.Timeout); err != nil {
		// The server has not confirmed the subscriptions; they stand
		// and will be confirmed on reconnection.
		cfg.Logger.Warn("gossip: subscriptions not confirmed", "err", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	go g.run(ctx)
	return g, nil
}

func (g *Gossip) subject(kind, region string) string {
	return g.cfg.Prefix + "." + kind + "." + region
}

// Stats returns the gossip's counters.
func (g *Gossip) Stats() *GossipStats { return &g.stats }

// LastHeard returns when a message from a region last arrived.
func (g *Gossip) LastHeard(region string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.heard[region]
	return t, ok
}

// StaleAfter is how long a region may be silent before its part of global
// usage counts as stale: three heartbeats.
func (g *Gossip) StaleAfter() time.Duration { return 3 * g.cfg.Heartbeat }

// Close stops the gossip and waits for it.
func (g *Gossip) Close() {
	g.cancel()
	<-g.done
	g.unsubscribe()
}

func (g *Gossip) unsubscribe() {
	for _, s := range g.subs {
		s.Unsubscribe()
	}
}

func (g *Gossip) run(ctx context.Context) {
	defer close(g.done)
	pub := time.NewTicker(g.cfg.Interval)
	ae := time.NewTicker(g.cfg.AntiEntropy)
	hb := time.NewTicker(g.cfg.Heartbeat)
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	again := 0 // digests still to send again for a region that came back
	defer pub.Stop()
	defer ae.Stop()
	defer hb.Stop()
	if g.elected() {
		// A replica that starts may have lost what its region counted
		// (a new process, or a flushed Redis): ask at once.
		g.PublishDigest()
	}
	for {
		select {
		case <-ctx.Done():
			g.PublishDelta() // what changed since the last tick
			return
		case <-pub.C:
			g.PublishDelta()
		case <-ae.C:
			g.engine.ExpireGlobal(g.cfg.Clock())
			g.forgetQuiet()
			if g.elected() {
				g.PublishDigest()
			}
		case <-g.rejoin:
			// A region is back: its gateway's way here is up, the way
			// there may come a second later; a digest sent now may be
			// lost, so it goes again a second and two seconds on.
			again = rejoinRepeats
			retry.Reset(rejoinRetry)
		case <-retry.C:
			if again > 0 {
				if again--; again > 0 {
					retry.Reset(rejoinRetry)
				}
				if g.elected() {
					g.PublishDigest()
				}
			}
		case <-g.kick:
			if !g.elected() {
				continue
			}
			// A region silent for a while is back (a partition healed),
			// or sent its first digest since: trade digests now rather
			// than at the next anti-entropy round, so that both sides
			// agree within a heartbeat or two of the way being up.
			g.PublishDigest()
		case <-hb.C:
			g.PublishHeartbeat()
		}
	}
}

// forgetQuiet drops the replay records of senders silent for ten minutes.
func (g *Gossip) forgetQuiet() {
	now := g.cfg.Clock()
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, r := range g.replicas {
		if now.Sub(r.at) > 10*time.Minute {
			delete(g.replicas, k)
		}
	}
}

func (g *Gossip) elected() bool { return g.cfg.Elected == nil || g.cfg.Elected() }

// PublishDelta publishes the region's slots changed since the last call.
func (g *Gossip) PublishDelta() {
	var d crdt.Delta
	g.engine.GlobalUsage().With(func(c *crdt.Counters) {
		g.mu.Lock()
		from := g.published
		g.mu.Unlock()
		d = c.OwnDeltaSince(from)
	})
	if len(d.Entries) == 0 {
		return
	}
	if err := g.publishDelta(g.subject(kindDelta, g.cfg.Region), d); err != nil {
		g.cfg.Logger.Warn("gossip: publish", "err", err)
		return // published stays: the next tick sends these changes again
	}
	g.mu.Lock()
	g.published = max(g.published, d.To)
	g.mu.Unlock()
}

// publishDelta sends d in messages of at most MaxEntries counters.
func (g *Gossip) publishDelta(subject string, d crdt.Delta) error {
	for start := 0; start < len(d.Entries); start += g.cfg.MaxEntries {
		part := d
		part.Entries = d.Entries[start:min(len(d.Entries), start+g.cfg.MaxEntries)]
		b, err := crdt.AppendDelta(nil, part)
		if err != nil {
			return err
		}
		if err := g.publish(subject, b); err != nil {
			return err
		}
	}
	return nil
}

func (g *Gossip) publish(subject string, data []byte) error {
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(HeaderReplica, g.cfg.Replica)
	m.Header.Set(HeaderInstance, g.instance)
	m.Header.Set(HeaderSeq, strconv.FormatUint(g.seq.Add(1), 10))
	if err := g.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("transport: gossip: publish %s: %w", subject, err)
	}
	g.stats.Published.Add(1)
	return nil
}

// PublishDigest publishes the region's digest: every other region answers
// with the counters it holds that the digest shows this region lacks.
func (g *Gossip) PublishDigest() {
	var dg crdt.Digest
	var err error
	g.engine.GlobalUsage().With(func(c *crdt.Counters) { dg, err = c.Digest(crdt.DefaultDigestBuckets) })
	if err == nil {
		var b []byte
		if b, err = crdt.AppendDigest(nil, dg); err == nil {
			err = g.publish(g.subject(kindDigest, g.cfg.Region), b)
		}
		if err == nil {
			g.stats.Digests.Add(1)
		}
	}
	if err != nil {
		g.cfg.Logger.Warn("gossip: digest", "err", err)
	}
}

// PublishHeartbeat reports this replica's demand and leases.
func (g *Gossip) PublishHeartbeat() {
	hb := Heartbeat{Region: g.cfg.Region, Replica: g.cfg.Replica, SentMillis: g.cfg.Clock().UnixMilli(), Rules: map[string]RuleReport{}}
	g.engine.GlobalUsage().With(func(c *crdt.Counters) { hb.Regions = c.Regions() })
	for _, r := range g.engine.GlobalRules() {
		d := g.engine.Demand(r.ID)
		rep := RuleReport{Admitted: d.Admitted, Denied: d.Denied, Used: d.Used, UsedEpoch: d.UsedEpoch,
			WindowMillis: r.Base.Window / 1000, Algorithm: r.Base.Algorithm.String(), Limit: r.Base.Limit}
		if _, acked, ok := g.engine.Lease(r.ID); ok {
			rep.Acked = acked
		}
		hb.Rules[r.ID] = rep
	}
	b, _ := json.Marshal(hb)
	if err := g.publish(g.subject(kindHeartbeat, g.cfg.Region), b); err != nil {
		g.cfg.Logger.Warn("gossip: heartbeat", "err", err)
	}
}

// accept checks a message's sender: the region its subject names, known,
// not this replica, and not a replay. It returns the region.
func (g *Gossip) accept(m *nats.Msg) (string, bool) {
	region, ok, _ := g.acceptBack(m)
	return region, ok
}

// acceptBack is accept, and also reports whether this message is the
// first from its region after a silence.
func (g *Gossip) acceptBack(m *nats.Msg) (string, bool, bool) {
	region := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	kind, _, _ := strings.Cut(m.Subject[len(g.cfg.Prefix)+1:], ".")
	replica := m.Header.Get(HeaderReplica)
	if replica == g.cfg.Replica {
		return "", false, false // our own
	}
	g.stats.Received.Add(1)
	seq, err := strconv.ParseUint(m.Header.Get(HeaderSeq), 10, 64)
	if err != nil || replica == "" {
		g.stats.Malformed.Add(1)
		return "", false, false
	}
	now := g.cfg.Clock()
	back := false
	g.mu.Lock()
	defer g.mu.Unlock()
	// A replica numbers all its messages in one sequence, but each kind
	// arrives on its own subscription: order holds within a kind only. A
	// restarted replica (a new instance) numbers from 1 again.
	stream := replica + " " + m.Header.Get(HeaderInstance) + " " + kind
	if seen, ok := g.replicas[stream]; ok && (seen.region != region || seq <= seen.seq) {
		if seen.region != region {
			g.stats.Spoofed.Add(1)
		} else {
			g.stats.Replayed.Add(1)
		}
		return "", false, false
	}
	g.replicas[stream] = replicaSeen{region: region, seq: seq, at: now}
	if last, ok := g.heard[region]; ok && region != g.cfg.Region && now.Sub(last) > g.StaleAfter() {
		if g.isRegion(region) { // not globalsync, which speaks only every anti-entropy round
			g.kickDigest()
			select {
			case g.rejoin <- struct{}{}:
			default:
			}
			g.rejoined[region] = true
			g.cfg.Resync.Fire()
			back = true
		}
	}
	g.heard[region] = now
	g.engine.HeardFrom(region, now)
	return region, true, back
}

func (g *Gossip) onDelta(m *nats.Msg)  { g.merge(m, false) }
func (g *Gossip) onRepair(m *nats.Msg) { g.merge(m, true) }

func (g *Gossip) merge(m *nats.Msg, repair bool) {
	region, ok := g.accept(m)
	if !ok {
		return
	}
	d, err := crdt.DecodeDelta(m.Data)
	if err != nil {
		g.stats.Malformed.Add(1)
		return
	}
	if !repair && d.Origin != region {
		g.stats.Spoofed.Add(1)
		return
	}
	if !repair && !onlyOwnSlots(d) {
		// A delta carries its sender's own slots; others' come only in
		// answer to a digest.
		g.stats.Spoofed.Add(1)
		return
	}
	if region == g.cfg.Region {
		// A sibling replica's view of our own slots: the store has them
		// already; our copy takes them for anti-entropy.
		g.engine.GlobalUsage().With(func(c *crdt.Counters) {
			for _, e := range d.Entries {
				for _, s := range e.Slots {
					if s.Region == region {
						c.Observe(e.ID, s.P, s.N)
					}
				}
			}
		})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
	defer cancel()
	rep, err := g.engine.MergeRemote(ctx, d)
	g.stats.Applied.Add(int64(rep.Applied))
	if repair {
		g.stats.Repaired.Add(int64(rep.Applied))
	}
	g.stats.UnknownRegion.Add(int64(rep.UnknownRegion))
	if rep.UnknownRegion > 0 && rep.Applied == 0 && rep.Duplicate == 0 && rep.Stale == 0 {
		return
	}
	g.stats.Regressed.Add(int64(rep.Regressed))
	if err != nil {
		g.stats.StoreErrors.Add(1)
		g.cfg.Logger.Warn("gossip: merge into the store", "from", region, "err", err)
	}
}

// rejoinRepeats and rejoinRetry: a region heard again after a silence
// is sent this region's digest again this many times, this far apart (a
// NATS gateway redials once a second).
const (
	rejoinRepeats = 2
	rejoinRetry   = time.Second
)

// isRegion reports whether name is one of the regions whose usage this
// region counts (globalsync, which also gossips, is not).
func (g *Gossip) isRegion(name string) bool {
	var regions []string
	g.engine.GlobalUsage().With(func(c *crdt.Counters) { regions = c.Regions() })
	return slices.Contains(regions, name)
}

// kickDigest has the digest published at once.
func (g *Gossip) kickDigest() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// onHeartbeat notes that a region is alive; globalsync reads the rest.
func (g *Gossip) onHeartbeat(m *nats.Msg) { g.accept(m) }

func (g *Gossip) onDigest(m *nats.Msg) {
	region, ok, justBack := g.acceptBack(m)
	if !ok || region == g.cfg.Region {
		return // a sibling replica's digest: the same store
	}
	dg, err := crdt.DecodeDigest(m.Data)
	if err != nil || dg.Origin != region {
		g.stats.Malformed.Add(1)
		return
	}
	g.mu.Lock()
	back := g.rejoined[region] && !justBack // this digest itself brought it back: it proves nothing of the way there
	if back {
		delete(g.rejoined, region)
	}
	g.mu.Unlock()
	if back {
		// The first digest from a region heard again after a silence: the
		// way from it is up, and likely the way back (it sends a digest
		// when it hears this region again). The digest this region sent
		// when it heard it may have been lost (a NATS gateway redials
		// each way on its own, a second or so apart): it goes again; and
		// the KV watchers, which may have asked JetStream over a way still
		// cut, ask again.
		g.cfg.Resync.Fire()
		if g.elected() {
			g.kickDigest()
		}
	}
	if !g.elected() {
		return // not ours to answer
	}
	g.stats.DigestsAnswered.Add(1)
	var d crdt.Delta
	g.engine.GlobalUsage().With(func(c *crdt.Counters) { d, err = c.Diff(dg) })
	if err != nil {
		g.stats.Malformed.Add(1)
		return
	}
	if len(d.Entries) == 0 {
		return
	}
	if err := g.publishDelta(g.subject(kindRepair, region+"."+g.cfg.Region), d); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		g.cfg.Logger.Warn("gossip: repair", "to", region, "err", err)
	}
}

// onlyOwnSlots reports whether every slot of d is its origin's.
func onlyOwnSlots(d crdt.Delta) bool {
	for _, e := range d.Entries {
		for _, sl := range e.Slots {
			if sl.Region != d.Origin {
				return false
			}
		}
	}
	return true
}
