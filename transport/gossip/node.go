package gossip

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/geoquota/geoquota/crdt"
)

// Config configures a node. Zero durations and sizes take the defaults of
// DefaultConfig.
type Config struct {
	// Region is the region the node speaks for; an observer's name on the
	// gossip ("globalsync").
	Region string
	// Replica tells this replica from its region's others, and Instance
	// this run of it from earlier ones (a restarted replica numbers its
	// messages afresh): the transport picks them, at random by default.
	Replica, Instance string
	// Prefix starts every subject (see Subjects). "geoquota".
	Prefix string
	// Interval is how often the region's changed slots are sent. 250ms.
	Interval time.Duration
	// AntiEntropy is how often the digest is sent, for the others to
	// answer with what the region lacks. 10s.
	AntiEntropy time.Duration
	// Heartbeat is how often a replica reports its demand and the leases
	// it may acknowledge. 500ms.
	Heartbeat time.Duration
	// Rejoin is how long after hearing a region again, following a
	// silence, the digest goes again, twice (a NATS gateway redials each
	// way on its own, a second or so apart, so the first may be lost).
	// 1s.
	Rejoin time.Duration
	// MaxEntries bounds the counters in one message, so that a message
	// stays within NATS's payload limit (1 MB by default). 20,000.
	MaxEntries int
	// Observer makes the node listen without counting: it merges the
	// regions' deltas and the repairs it is sent into Counters, sends its
	// digest at start and every AntiEntropy, hands heartbeats to
	// Heartbeats, and neither answers digests nor sends heartbeats. That
	// is globalsync's part.
	Observer bool
	// Elected, if set, says whether this replica is the one its region
	// elected to answer digests and send its own; the others leave it to
	// it. Unset: every replica does.
	Elected func() bool
	// Phase, if set, gives the delay before each periodic task (deltas,
	// heartbeats, anti-entropy, asked in that order) first runs, from its
	// period; unset, one period, as a ticker. A simulator staggers its
	// regions with it.
	Phase func(period time.Duration) time.Duration
	// OnRejoin, if set, is called (from Step) when a region silent for
	// longer than StaleAfter is heard again, and when its first digest
	// since comes: the watches of KV buckets may have been cut with it.
	OnRejoin func(region string)

	// Counters is the copy kept in step; required.
	Counters Counters
	// Engine is the region's engine; required but for an observer.
	Engine Engine
	// Heartbeats hears the heartbeats; an observer's, optional.
	Heartbeats Heartbeats
}

// DefaultConfig returns the default timing (docs/design.md), fit for
// regions a WAN apart.
func DefaultConfig() Config {
	return Config{Prefix: DefaultPrefix, Interval: 250 * time.Millisecond, AntiEntropy: 10 * time.Second,
		Heartbeat: 500 * time.Millisecond, Rejoin: time.Second, MaxEntries: 20_000}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Prefix == "" {
		c.Prefix = d.Prefix
	}
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.AntiEntropy <= 0 {
		c.AntiEntropy = d.AntiEntropy
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.Rejoin <= 0 {
		c.Rejoin = d.Rejoin
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = d.MaxEntries
	}
	if c.Phase == nil {
		c.Phase = func(p time.Duration) time.Duration { return p }
	}
	return c
}

// ErrInvalidConfig is a configuration a node cannot run with.
var ErrInvalidConfig = errors.New("gossip: invalid configuration")

// Node is one replica's part in the gossip, or globalsync's: a state
// machine with no I/O, no clock and no goroutine of its own. Tick tells it
// the time and returns what to send; Step hands it a message that arrived
// and returns what to send in answer. Time is the node's own: only
// differences between the times it is given matter (a daemon gives it
// time.Now, whose monotonic reading ignores clock jumps; a simulator, its
// virtual time).
//
// A node's methods are safe for concurrent use. It calls its Counters,
// Engine and Heartbeats without holding its lock.
type Node struct {
	cfg      Config
	subjects Subjects
	regions  []string // the regions counted, for telling one back after a silence
	stats    Stats

	mu        sync.Mutex
	seq       uint64
	published uint64               // own slots sent up to this version
	heard     map[string]time.Time // region → last message accepted from it
	// rejoined are regions heard again after a silence whose digest has
	// not come since.
	rejoined map[string]bool
	senders  map[stream]senderSeen
	// When the next of each periodic task is due; startDigest is set until
	// the digest a node sends as it starts has gone.
	nextDelta, nextHeartbeat, nextAE time.Time
	startDigest                      bool
	start                            time.Time
	again                            []time.Time // digests to send again after a rejoin
}

// stream is one sender's messages of one kind: each kind arrives on its
// own subscription, so order holds within a kind only.
type stream struct {
	replica, instance string
	kind              kind
}

type senderSeen struct {
	region string
	seq    uint64
	at     time.Time
}

// forgetSenders is how long a sender may be silent before its replay
// record goes.
const forgetSenders = 10 * time.Minute

// New returns a node that starts at start: a replica sends its digest at
// once, if elected (it may have lost what its region counted: a new
// process, or a flushed store), an observer always.
func New(cfg Config, start time.Time) (*Node, error) {
	cfg = cfg.withDefaults()
	switch {
	case !validName(cfg.Region):
		return nil, fmt.Errorf("%w: region %q: want a name of 1 to %d characters without dots, spaces or wildcards",
			ErrInvalidConfig, cfg.Region, crdt.MaxRegionNameLen)
	case cfg.Replica == "":
		return nil, fmt.Errorf("%w: replica: required", ErrInvalidConfig)
	case cfg.Counters == nil:
		return nil, fmt.Errorf("%w: counters: required", ErrInvalidConfig)
	case cfg.Engine == nil && !cfg.Observer:
		return nil, fmt.Errorf("%w: engine: required for a replica", ErrInvalidConfig)
	}
	n := &Node{cfg: cfg, subjects: NewSubjects(cfg.Prefix), heard: map[string]time.Time{}, rejoined: map[string]bool{},
		senders: map[stream]senderSeen{}, start: start, startDigest: true}
	if !cfg.Observer {
		n.regions = cfg.Engine.GlobalRegions()
	}
	n.nextDelta = start.Add(cfg.Phase(cfg.Interval))
	n.nextHeartbeat = start.Add(cfg.Phase(cfg.Heartbeat))
	n.nextAE = start.Add(cfg.Phase(cfg.AntiEntropy))
	return n, nil
}

// Subjects returns the subjects of the node's deployment.
func (n *Node) Subjects() Subjects { return n.subjects }

// Subscriptions returns the subjects the node listens to (NATS wildcards).
func (n *Node) Subscriptions() []string {
	s, self := n.subjects, n.cfg.Region
	subs := []string{s.Delta("*"), s.Repair(self, "*"), s.Heartbeat("*")}
	if !n.cfg.Observer {
		subs = append(subs, s.Digest("*"))
	}
	return subs
}

// Stats returns the node's counters.
func (n *Node) Stats() *Stats { return &n.stats }

// StaleAfter is how long a region may be silent before its part of global
// usage counts as stale and hearing it again counts as a rejoin: three
// heartbeats.
func (n *Node) StaleAfter() time.Duration { return 3 * n.cfg.Heartbeat }

// LastHeard returns when a message from a region was last accepted.
func (n *Node) LastHeard(region string) (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	t, ok := n.heard[region]
	return t, ok
}

// Next returns when Tick next has something to do.
func (n *Node) Next() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	next := n.nextAE
	if n.startDigest {
		next = n.start
	}
	if !n.cfg.Observer {
		next = earliest(next, n.nextDelta, n.nextHeartbeat)
	}
	if len(n.again) > 0 {
		next = earliest(next, n.again[0])
	}
	return next
}

func earliest(t time.Time, ts ...time.Time) time.Time {
	for _, u := range ts {
		if u.Before(t) {
			t = u
		}
	}
	return t
}

// Tick does what is due at now: the region's changed slots, its
// heartbeat, its digest (anti-entropy, or again after a rejoin); it
// returns the messages to send, in that order.
func (n *Node) Tick(now time.Time) []Message {
	n.mu.Lock()
	delta := !n.cfg.Observer && !now.Before(n.nextDelta)
	if delta {
		n.nextDelta = after(n.nextDelta, n.cfg.Interval, now)
	}
	heartbeat := !n.cfg.Observer && !now.Before(n.nextHeartbeat)
	if heartbeat {
		n.nextHeartbeat = after(n.nextHeartbeat, n.cfg.Heartbeat, now)
	}
	digest := n.startDigest && !now.Before(n.start)
	if digest {
		n.startDigest = false
	}
	if !now.Before(n.nextAE) {
		n.nextAE = after(n.nextAE, n.cfg.AntiEntropy, now)
		n.forgetSenders(now)
		digest = true
	}
	for len(n.again) > 0 && !now.Before(n.again[0]) {
		n.again = n.again[1:]
		digest = true
	}
	n.mu.Unlock()
	var out []Message
	if delta {
		out = n.appendDelta(out)
	}
	if heartbeat {
		out = n.appendHeartbeat(out, now)
	}
	if digest && n.sendsDigests() {
		out = n.appendDigest(out)
	}
	return out
}

// after is the first time after now of a task due at due every period (a
// ticker drops the ticks it could not deliver).
func after(due time.Time, period time.Duration, now time.Time) time.Time {
	next := due.Add(period)
	if !next.After(now) {
		next = due.Add((now.Sub(due)/period + 1) * period)
	}
	return next
}

// Flush returns the region's slots changed since the last delta: what a
// replica sends as it stops.
func (n *Node) Flush() []Message {
	if n.cfg.Observer {
		return nil
	}
	return n.appendDelta(nil)
}

// Unsent tells the node that a message it returned could not be sent: the
// changes a delta carried go again with the next.
func (n *Node) Unsent(m Message) {
	if !m.delta {
		return
	}
	n.mu.Lock()
	n.published = min(n.published, m.since)
	n.mu.Unlock()
}

func (n *Node) sendsDigests() bool { return n.cfg.Observer || n.elected() }

func (n *Node) elected() bool { return n.cfg.Elected == nil || n.cfg.Elected() }

func (n *Node) header() Header {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.seq++
	return Header{Replica: n.cfg.Replica, Instance: n.cfg.Instance, Seq: n.seq}
}

func (n *Node) appendDelta(out []Message) []Message {
	n.mu.Lock()
	since := n.published
	n.mu.Unlock()
	d := n.cfg.Counters.OwnDelta(since)
	if len(d.Entries) == 0 {
		return out
	}
	n.mu.Lock()
	n.published = max(n.published, d.To)
	n.mu.Unlock()
	return n.appendParts(out, n.subjects.Delta(n.cfg.Region), d, true, since)
}

// appendParts adds d to out in messages of at most MaxEntries counters.
func (n *Node) appendParts(out []Message, subject string, d crdt.Delta, delta bool, since uint64) []Message {
	for start := 0; start < len(d.Entries); start += n.cfg.MaxEntries {
		part := d
		part.Entries = d.Entries[start:min(len(d.Entries), start+n.cfg.MaxEntries)]
		out = append(out, Message{Subject: subject, Header: n.header(), Body: part, delta: delta, since: since})
	}
	return out
}

func (n *Node) appendDigest(out []Message) []Message {
	dg, err := n.cfg.Counters.GlobalDigest()
	if err != nil {
		return out // only an impossible bucket count errs
	}
	dg.Origin = n.cfg.Region
	n.stats.Digests.Add(1)
	return append(out, Message{Subject: n.subjects.Digest(n.cfg.Region), Header: n.header(), Body: dg})
}

func (n *Node) appendHeartbeat(out []Message, now time.Time) []Message {
	e := n.cfg.Engine
	hb := Heartbeat{Region: n.cfg.Region, Replica: n.cfg.Replica, SentMillis: now.UnixMilli(), Regions: e.GlobalRegions(),
		Rules: map[string]RuleReport{}}
	for _, r := range e.GlobalReport() {
		rep := RuleReport{Admitted: r.Admitted, Denied: r.Denied, Acked: r.Acked, Used: r.Used, UsedEpoch: r.UsedEpoch,
			WindowMillis: r.Window.Milliseconds(), Algorithm: r.Algorithm.String(), Limit: r.Limit}
		if r.HasPrev {
			rep.PrevUsed = &r.PrevUsed
		}
		if len(r.Counters) > 0 {
			rep.Counters = make(map[string]CounterReport, len(r.Counters))
			for _, c := range r.Counters {
				cr := CounterReport{Admitted: c.Admitted, Denied: c.Denied, Acked: c.Acked, Used: c.Used, UsedEpoch: c.UsedEpoch}
				if c.HasPrev {
					cr.PrevUsed = &c.PrevUsed
				}
				rep.Counters[c.Key] = cr
			}
		}
		hb.Rules[r.Rule] = rep
	}
	return append(out, Message{Subject: n.subjects.Heartbeat(n.cfg.Region), Header: n.header(), Body: hb})
}

// Step takes in a message that arrived at now, and returns the messages to
// send in answer: a digest to a region heard again after a silence, a
// repair to a region whose digest shows it lacks something. A message
// that is malformed, sent under another region's name, replayed, from
// this replica itself, or on a subject the node does not listen to is
// counted (Stats) and changes nothing. ctx bounds a merge into the
// region's store.
func (n *Node) Step(ctx context.Context, now time.Time, m Message) []Message {
	k, from, to, ok := n.subjects.parse(m.Subject)
	if m.Header.Replica == n.cfg.Replica {
		return nil // our own, as NATS echoes it
	}
	n.stats.Received.Add(1)
	if !ok || (k == kindRepair && to != n.cfg.Region) || (k == kindDigest && n.cfg.Observer) {
		n.stats.Malformed.Add(1)
		return nil
	}
	back, ok := n.accept(now, k, from, m.Header)
	if !ok {
		return nil
	}
	var out []Message
	if back && n.elected() {
		out = n.appendDigest(out)
	}
	body, err := m.decode(k)
	if err != nil {
		n.stats.Malformed.Add(1)
		return out
	}
	switch b := body.(type) {
	case crdt.Delta:
		n.merge(ctx, k, from, b)
	case crdt.Digest:
		out = n.answer(out, from, back, b)
	case Heartbeat:
		if b.Region != from || b.Replica != m.Header.Replica {
			n.stats.Spoofed.Add(1)
			break
		}
		if n.cfg.Heartbeats != nil {
			n.cfg.Heartbeats.Heartbeat(now, b)
		}
	}
	return out
}

// accept checks a message's sender: a replica that numbers its messages,
// under the name of one region only, and not a replay. It notes that the
// region was heard, and reports whether it is back after a silence.
func (n *Node) accept(now time.Time, k kind, from string, h Header) (back, ok bool) {
	if h.Replica == "" || h.Seq == 0 {
		n.stats.Malformed.Add(1)
		return false, false
	}
	n.mu.Lock()
	s := stream{h.Replica, h.Instance, k}
	if seen, known := n.senders[s]; known && (seen.region != from || h.Seq <= seen.seq) {
		n.mu.Unlock()
		if seen.region != from {
			n.stats.Spoofed.Add(1)
		} else {
			n.stats.Replayed.Add(1)
		}
		return false, false
	}
	n.senders[s] = senderSeen{region: from, seq: h.Seq, at: now}
	last, heard := n.heard[from]
	n.heard[from] = now
	// A region (not globalsync, which speaks only once an anti-entropy
	// round) silent for a while is back: a partition healed. Trade
	// digests now, and again twice, rather than at the next round.
	back = heard && !n.cfg.Observer && from != n.cfg.Region && now.Sub(last) > n.StaleAfter() && slices.Contains(n.regions, from)
	if back {
		n.rejoined[from] = true
		n.again = []time.Time{now.Add(n.cfg.Rejoin), now.Add(2 * n.cfg.Rejoin)}
	}
	n.mu.Unlock()
	if back && n.cfg.OnRejoin != nil {
		n.cfg.OnRejoin(from)
	}
	if n.cfg.Engine != nil {
		n.cfg.Engine.HeardFrom(from)
	}
	return back, true
}

// merge takes in a delta or a repair. A delta carries its sender's own
// slots alone; others' come only in answer to a digest.
func (n *Node) merge(ctx context.Context, k kind, from string, d crdt.Delta) {
	if k == kindDelta && (d.Origin != from || !onlyOwnSlots(d)) {
		n.stats.Spoofed.Add(1)
		return
	}
	if from == n.cfg.Region {
		// A sibling replica's view of our own slots: the store has them
		// already; our copy takes them for anti-entropy.
		n.cfg.Counters.ObserveOwn(d)
		return
	}
	rep, err := n.cfg.Counters.MergeRemote(ctx, d)
	n.stats.Applied.Add(int64(rep.Applied))
	if k == kindRepair {
		n.stats.Repaired.Add(int64(rep.Applied))
	}
	n.stats.UnknownRegion.Add(int64(rep.UnknownRegion))
	if rep.UnknownRegion > 0 && rep.Applied == 0 && rep.Duplicate == 0 && rep.Stale == 0 {
		return
	}
	n.stats.Regressed.Add(int64(rep.Regressed))
	if err != nil {
		n.stats.StoreErrors.Add(1)
	}
}

// answer handles another region's digest: it sends what the digest shows
// the region lacks, if this replica answers for its region.
func (n *Node) answer(out []Message, from string, justBack bool, dg crdt.Digest) []Message {
	if from == n.cfg.Region {
		return out // a sibling replica's digest: the same store
	}
	if dg.Origin != from {
		n.stats.Malformed.Add(1)
		return out
	}
	n.mu.Lock()
	// The first digest from a region heard again after a silence (not
	// the one that brought it back, which proves nothing of the way
	// there): the way from it is up, and likely the way back. The digest
	// sent when it was heard may have been lost on a way still cut: it
	// goes again, and the KV watches, which may have asked over that way,
	// ask again.
	rejoined := n.rejoined[from] && !justBack
	if rejoined {
		delete(n.rejoined, from)
	}
	n.mu.Unlock()
	if rejoined {
		if n.cfg.OnRejoin != nil {
			n.cfg.OnRejoin(from)
		}
		if n.elected() {
			out = n.appendDigest(out)
		}
	}
	if !n.elected() {
		return out
	}
	n.stats.DigestsAnswered.Add(1)
	d, err := n.cfg.Counters.GlobalDiff(dg)
	if err != nil {
		n.stats.Malformed.Add(1)
		return out
	}
	if len(d.Entries) == 0 {
		return out
	}
	d.Origin = n.cfg.Region
	return n.appendParts(out, n.subjects.Repair(from, n.cfg.Region), d, false, 0)
}

// forgetSenders drops the replay records of senders silent for long. The
// caller holds n.mu.
func (n *Node) forgetSenders(now time.Time) {
	for s, seen := range n.senders {
		if now.Sub(seen.at) > forgetSenders {
			delete(n.senders, s)
		}
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
