package gossip

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/transport/namespace"
)

// Config configures a node. Zero durations and sizes take the defaults of
// DefaultConfig.
type Config struct {
	// Region is the region the node speaks for; an observer's name on the
	// gossip ("globalsync").
	Region string
	// Replica tells this replica from its region's others, and Instance
	// this run of it from earlier ones (a restarted replica numbers its
	// messages and versions afresh): the transport picks them, at random
	// by default.
	Replica, Instance string
	// Names are the subjects of the node's deployment; the zero value is
	// the unnamed deployment's.
	Names namespace.Names
	// Interval is how often the region's changed slots are sent. 250ms.
	Interval time.Duration
	// AntiEntropy is how often a replica says how far its versions run,
	// so that a receiver that lost its last deltas finds out and asks for
	// them. 10s.
	AntiEntropy time.Duration
	// Heartbeat is how often a replica reports its demand and the leases
	// it may acknowledge. 500ms.
	Heartbeat time.Duration
	// Rejoin is how long after hearing a region again, following a
	// silence, its replicas are asked again, twice, how far their versions
	// run (a NATS gateway redials each way on its own, a second or so
	// apart, so the first ask may be lost); and how long an unanswered ask
	// for a replica's slots waits before it goes again. 1s.
	Rejoin time.Duration
	// MaxEntries bounds the counters in one message, so that a message
	// stays within NATS's payload limit (1 MB by default). 20,000.
	MaxEntries int
	// Observer makes the node listen without counting: it merges the
	// regions' deltas and the repairs it asks for into Counters, hands
	// heartbeats to Heartbeats, and neither answers asks nor sends
	// heartbeats. That is globalsync's part.
	Observer bool
	// Regions, for an observer, are the regions it hears (globalsync's
	// --regions); empty: any, the least lately heard forgotten first
	// beyond maxHeard. A replica hears its engine's regions.
	Regions []string
	// Elected, if set, says whether this replica is the one its region
	// elected to ask the other regions for what it lacks, and to send a
	// region that lost its own slots its copy of them; the others leave
	// it to it. Unset: every replica does.
	Elected func() bool
	// Phase, if set, gives the delay before each periodic task (deltas,
	// heartbeats, anti-entropy, asked in that order) first runs, from its
	// period; unset, one period, as a ticker. A simulator staggers its
	// regions with it.
	Phase func(period time.Duration) time.Duration
	// OnRejoin, if set, is called when a region silent for longer than
	// StaleAfter is heard again and when its first ask or answer since
	// comes, which shows the way to it up too (from Step), and a second
	// and two seconds after it was heard again (from Tick): the watches of
	// KV buckets may have been cut with it.
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
	return Config{Interval: 250 * time.Millisecond, AntiEntropy: 10 * time.Second,
		Heartbeat: 500 * time.Millisecond, Rejoin: time.Second, MaxEntries: 20_000}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
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
	subjects namespace.Names
	regions  []string // the regions counted, for telling one back after a silence
	stats    Stats

	mu        sync.Mutex
	seq       uint64
	published uint64               // own slots sent up to this version
	heard     map[string]time.Time // region → last message accepted from it
	// rejoined are regions heard again after a silence whose first ask
	// or answer has not come since.
	rejoined map[string]bool
	senders  map[stream]senderSeen
	// streams are the other replicas' versions as far as this node holds
	// them; askers, who was answered lately.
	streams map[streamID]*streamMark
	askers  map[string]*askerSeen
	// When the next of each periodic task is due; starting is set until
	// the asks a node sends as it starts have gone.
	nextDelta, nextHeartbeat, nextAE time.Time
	starting                         bool
	start                            time.Time
	again                            []rejoinAsk // asks to send again after a rejoin, in time order
}

// stream is one sender's messages of one kind: each kind arrives on its
// own subscription, so order holds within a kind only.
type stream struct {
	replica, instance string
	kind              namespace.Kind
}

type senderSeen struct {
	region string
	seq    uint64
	at     time.Time
}

// streamID is one run of one replica, whose versions its deltas number.
type streamID struct{ replica, instance string }

// streamMark is how far a node holds a replica's own slots: every change
// up to version have, without a gap; top is the furthest version the
// replica said it reached; asked, when the node last asked for the rest.
type streamMark struct {
	region    string
	have, top uint64
	asked, at time.Time
}

// askerSeen paces the answers to one asker: a token bucket.
type askerSeen struct {
	tokens float64
	at     time.Time
}

type rejoinAsk struct {
	at     time.Time
	region string
}

const (
	// forgetSenders is how long a sender may be silent before its replay
	// record, its versions and its pace of asks go.
	forgetSenders = 10 * time.Minute
	// maxStreams bounds the replicas' versions a node keeps (the least
	// lately heard goes first), and maxAskers the askers it paces.
	maxStreams = 1024
	maxAskers  = 64
	// maxSenders bounds the replay records (one per replica, run and kind;
	// the least lately heard goes first), and maxHeard the regions an
	// observer, which has no list of them, hears of.
	maxSenders = 4096
	maxHeard   = crdt.MaxRegions
	// An asker is answered at most askBurst times at once and askRate
	// times a second after that: an answer may hold a region's every
	// counter.
	askBurst = 8
	askRate  = 4
)

// New returns a node that starts at start: a replica asks the other
// regions at once, if elected, how far their replicas' versions run and
// for its own region's slots (it may have lost what its region counted:
// a new process, or a flushed store); an observer asks each region as it
// first hears of it.
func New(cfg Config, start time.Time) (*Node, error) {
	cfg = cfg.withDefaults()
	switch {
	case !namespace.ValidName(cfg.Region):
		return nil, fmt.Errorf("%w: region %q: want a name of 1 to %d characters without dots, spaces or wildcards",
			ErrInvalidConfig, cfg.Region, crdt.MaxRegionNameLen)
	case cfg.Replica == "":
		return nil, fmt.Errorf("%w: replica: required", ErrInvalidConfig)
	case cfg.Counters == nil:
		return nil, fmt.Errorf("%w: counters: required", ErrInvalidConfig)
	case cfg.Engine == nil && !cfg.Observer:
		return nil, fmt.Errorf("%w: engine: required for a replica", ErrInvalidConfig)
	}
	n := &Node{cfg: cfg, subjects: cfg.Names, heard: map[string]time.Time{}, rejoined: map[string]bool{},
		senders: map[stream]senderSeen{},
		streams: map[streamID]*streamMark{}, askers: map[string]*askerSeen{}, start: start, starting: !cfg.Observer}
	if !cfg.Observer {
		n.regions = cfg.Engine.GlobalRegions()
	}
	n.nextDelta = start.Add(cfg.Phase(cfg.Interval))
	n.nextHeartbeat = start.Add(cfg.Phase(cfg.Heartbeat))
	n.nextAE = start.Add(cfg.Phase(cfg.AntiEntropy))
	return n, nil
}

// Names returns the subjects of the node's deployment.
func (n *Node) Names() namespace.Names { return n.subjects }

// Subscriptions returns the subjects the node listens to (NATS wildcards).
func (n *Node) Subscriptions() []string {
	s, self := n.subjects, n.cfg.Region
	subs := []string{s.Delta("*"), s.Repair(self, "*"), s.Heartbeat("*")}
	if !n.cfg.Observer {
		subs = append(subs, s.Ask(self, "*"))
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
	if n.starting {
		next = earliest(next, n.start)
	}
	if !n.cfg.Observer {
		next = earliest(next, n.nextDelta, n.nextHeartbeat)
	}
	if len(n.again) > 0 {
		next = earliest(next, n.again[0].at)
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
// heartbeat, how far its versions run (every anti-entropy round), and its
// asks (as it starts, or again after a
// rejoin); it returns the messages to send, in that order.
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
	mark := false
	if !now.Before(n.nextAE) {
		n.nextAE = after(n.nextAE, n.cfg.AntiEntropy, now)
		n.forget(now)
		mark = !n.cfg.Observer
	}
	starting := n.starting && !now.Before(n.start)
	if starting {
		n.starting = false
	}
	var rejoined []string
	for len(n.again) > 0 && !now.Before(n.again[0].at) {
		rejoined = append(rejoined, n.again[0].region)
		n.again = n.again[1:]
	}
	n.mu.Unlock()
	var out []Message
	if delta {
		out = n.appendDelta(out)
	}
	if heartbeat {
		out = n.appendHeartbeat(out, now)
	}
	if mark {
		n.mu.Lock()
		published := n.published
		n.mu.Unlock()
		if published > 0 {
			out = n.appendMark(out, published)
		}
	}
	if starting && n.asks() {
		for _, r := range n.regions {
			if r != n.cfg.Region {
				out = n.appendAsk(out, r, Ask{Others: true, Own: true})
			}
		}
	}
	for _, r := range rejoined {
		if n.cfg.OnRejoin != nil {
			n.cfg.OnRejoin(r)
		}
		if n.asks() {
			out = n.appendAsk(out, r, n.askAll(r))
		}
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

// asks reports whether this node asks others for what it lacks: an
// observer, or the replica its region elected.
func (n *Node) asks() bool { return n.cfg.Observer || n.elected() }

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
	parts := n.cfg.Counters.OwnDeltas(since, n.cfg.MaxEntries)
	if len(parts) == 0 || len(parts[0].Entries) == 0 {
		return out
	}
	n.mu.Lock()
	n.published = max(n.published, parts[len(parts)-1].To)
	n.mu.Unlock()
	for _, d := range parts {
		out = append(out, Message{Subject: n.subjects.Delta(n.cfg.Region), Header: n.header(), Body: d, delta: true, since: since})
	}
	return out
}

// appendMark adds a delta of no entries at version v: how far this
// replica's versions run.
func (n *Node) appendMark(out []Message, v uint64) []Message {
	n.stats.Marks.Add(1)
	d := crdt.Delta{Origin: n.cfg.Region, From: v, To: v}
	return append(out, Message{Subject: n.subjects.Delta(n.cfg.Region), Header: n.header(), Body: d})
}

func (n *Node) appendAsk(out []Message, to string, a Ask) []Message {
	n.stats.Asks.Add(1)
	return append(out, Message{Subject: n.subjects.Ask(to, n.cfg.Region), Header: n.header(), Body: a})
}

func (n *Node) appendHeartbeat(out []Message, now time.Time) []Message {
	e := n.cfg.Engine
	hb := Heartbeat{Region: n.cfg.Region, Replica: n.cfg.Replica, SentMillis: now.UnixMilli(), Regions: e.GlobalRegions(),
		Rules: map[string]RuleReport{}}
	for _, r := range e.GlobalReport() {
		rep := RuleReport{Admitted: r.Admitted, Denied: r.Denied, Acked: r.Acked, Acks: r.Acks, Used: r.Used, UsedEpoch: r.UsedEpoch,
			CountedMillis: r.Counted.Milliseconds(), WindowMillis: r.Window.Milliseconds(), Algorithm: r.Algorithm.String(), Limit: r.Limit}
		if r.HasPrev {
			rep.PrevUsed = &r.PrevUsed
		}
		if len(r.Counters) > 0 {
			rep.Counters = make(map[string]CounterReport, len(r.Counters))
			for i := range r.Counters {
				// PrevUsed points into the engine's fresh report, not at
				// a copy made on the heap for each counter.
				c := &r.Counters[i]
				cr := CounterReport{Admitted: c.Admitted, Denied: c.Denied, Acked: c.Acked, Used: c.Used, UsedEpoch: c.UsedEpoch,
					CountedMillis: c.Counted.Milliseconds()}
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
// send in answer: asks for what a delta shows missing, answers to asks.
// A message that is malformed, sent under another region's name,
// replayed, from this replica itself, or on a subject the node does not
// listen to is counted (Stats) and changes nothing. ctx bounds a merge
// into the region's store.
func (n *Node) Step(ctx context.Context, now time.Time, m Message) []Message {
	k, from, to, ok := n.subjects.Parse(m.Subject)
	if m.Header.Replica == n.cfg.Replica {
		return nil // our own, as NATS echoes it
	}
	n.stats.Received.Add(1)
	if !ok || ((k == namespace.Repair || k == namespace.Ask) && to != n.cfg.Region) || (k == namespace.Ask && n.cfg.Observer) {
		n.stats.Malformed.Add(1)
		return nil
	}
	known := n.knownSender(from)
	if !known && k != namespace.Ask {
		// A region outside the set is heard only asking: a region being
		// added may ask before every other lists it, and answers are
		// paced per asker (at most maxAskers of them).
		n.stats.UnknownRegion.Add(1)
		return nil
	}
	heard, ok := n.accept(now, k, from, known, m.Header)
	if !ok {
		return nil
	}
	var out []Message
	body, err := m.decode(k)
	if err != nil {
		n.stats.Malformed.Add(1)
	}
	switch b := body.(type) {
	case crdt.Delta:
		if n.merge(ctx, k, from, b) {
			out = n.follow(out, now, from, m.Header, b, heard)
		}
	case Ask:
		out = n.answer(out, now, from, m.Header, b)
	case Heartbeat:
		if b.Region != from || b.Replica != m.Header.Replica {
			n.stats.Spoofed.Add(1)
			break
		}
		if n.cfg.Heartbeats != nil {
			n.cfg.Heartbeats.Heartbeat(now, b)
		}
	}
	if heard {
		out = n.appendAsk(out, from, n.askAll(from))
	}
	return out
}

// accept checks a message's sender: a replica that numbers its messages,
// under the name of one region only, and not a replay. It notes that the
// region was heard, if listed (see knownSender), and reports whether to ask the region's replicas how
// far their versions run: a region heard again after a silence (a
// partition healed), which is asked again twice (see Config.Rejoin) and
// at its first ask or answer since, or, by an observer, one heard for the
// first time.
func (n *Node) accept(now time.Time, k namespace.Kind, from string, listed bool, h Header) (ask, ok bool) {
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
	if _, known := n.senders[s]; !known && len(n.senders) >= maxSenders {
		n.dropSender()
	}
	n.senders[s] = senderSeen{region: from, seq: h.Seq, at: now}
	if !listed {
		n.mu.Unlock()
		return false, true
	}
	last, heard := n.heard[from]
	if !heard && n.cfg.Observer && len(n.heard) >= maxHeard {
		n.dropHeard()
	}
	n.heard[from] = now
	counted := from != n.cfg.Region && (n.cfg.Observer || slices.Contains(n.regions, from))
	back := counted && heard && now.Sub(last) > n.StaleAfter()
	// The first ask or answer from a region heard again (not the message
	// that brought it back, which proves nothing of the way there): the
	// way from it is up, and likely the way back, over which our first ask
	// and the KV watches may have asked in vain.
	rejoined := !back && (k == namespace.Ask || k == namespace.Repair) && n.rejoined[from]
	if rejoined {
		delete(n.rejoined, from)
	}
	if back && !n.cfg.Observer {
		n.rejoined[from] = true
		n.again = append(n.again, rejoinAsk{now.Add(n.cfg.Rejoin), from}, rejoinAsk{now.Add(2 * n.cfg.Rejoin), from})
		slices.SortStableFunc(n.again, func(a, b rejoinAsk) int { return a.at.Compare(b.at) })
	}
	ask = (back || rejoined || (counted && !heard && n.cfg.Observer)) && n.asks()
	n.mu.Unlock()
	if (back || rejoined) && n.cfg.OnRejoin != nil {
		n.cfg.OnRejoin(from)
	}
	if n.cfg.Engine != nil {
		n.cfg.Engine.HeardFrom(from)
	}
	return ask, true
}

// merge takes in a delta or a repair, and reports whether it may advance
// its sender's versions. A delta, and a repair that runs over versions,
// carries its sender's own slots alone; others' come only as a repair to
// a region that lost its own (versions 0 to 0).
func (n *Node) merge(ctx context.Context, k namespace.Kind, from string, d crdt.Delta) (versions bool) {
	versions = k == namespace.Delta || d.To > 0
	if versions && (d.Origin != from || !onlyOwnSlots(d)) {
		n.stats.Spoofed.Add(1)
		return false
	}
	if from == n.cfg.Region {
		// A sibling replica's view of our own slots: the store has them
		// already; our copy takes them, to send on.
		n.cfg.Counters.ObserveOwn(d)
		return false
	}
	if len(d.Entries) == 0 {
		return versions
	}
	rep, err := n.cfg.Counters.MergeRemote(ctx, d)
	n.stats.Applied.Add(int64(rep.Applied))
	if k == namespace.Repair {
		n.stats.Repaired.Add(int64(rep.Applied))
	}
	n.stats.UnknownRegion.Add(int64(rep.UnknownRegion))
	if rep.UnknownRegion > 0 && rep.Applied == 0 && rep.Duplicate == 0 && rep.Stale == 0 {
		return false
	}
	n.stats.Regressed.Add(int64(rep.Regressed))
	n.stats.Ahead.Add(int64(rep.Ahead))
	n.stats.UnknownRule.Add(int64(rep.UnknownRule))
	if err != nil {
		n.stats.StoreErrors.Add(1)
	}
	return versions
}

// follow notes how far a delta takes its sender's versions, and asks the
// sender for the rest if it shows some missing: a range skipped (a delta
// lost), or versions further on than those held (a replica never heard
// from, or heard again). An ask unanswered goes again after Rejoin. With
// askingAll, the ask to the sender's whole region about to go asks for it.
func (n *Node) follow(out []Message, now time.Time, from string, h Header, d crdt.Delta, askingAll bool) []Message {
	id := streamID{h.Replica, h.Instance}
	n.mu.Lock()
	s := n.streams[id]
	if s == nil {
		if len(n.streams) >= maxStreams {
			n.dropStream()
		}
		s = &streamMark{region: from}
		n.streams[id] = s
	}
	s.at = now
	if d.From <= s.have {
		s.have = max(s.have, d.To)
	}
	s.top = max(s.top, d.To)
	ask := s.have < s.top && n.asks() && (s.asked.IsZero() || now.Sub(s.asked) >= n.cfg.Rejoin)
	switch {
	case s.have >= s.top:
		s.asked = time.Time{}
	case ask:
		s.asked = now
	}
	since := s.have
	n.mu.Unlock()
	if !ask || askingAll {
		return out
	}
	return n.appendAsk(out, from, Ask{Streams: []StreamAsk{{Replica: h.Replica, Instance: h.Instance, Since: since}}})
}

// askAll asks a region's replicas for what this node lacks of their own
// slots: each known one since the version held, the others since 0.
func (n *Node) askAll(region string) Ask {
	n.mu.Lock()
	defer n.mu.Unlock()
	type known struct {
		id streamID
		s  *streamMark
	}
	var ks []known
	for id, s := range n.streams {
		if s.region == region {
			ks = append(ks, known{id, s})
		}
	}
	// The replicas heard from last, if more than an ask may name.
	slices.SortFunc(ks, func(x, y known) int { return y.s.at.Compare(x.s.at) })
	a := Ask{Others: true}
	for _, k := range ks[:min(len(ks), MaxAskStreams)] {
		a.Streams = append(a.Streams, StreamAsk{Replica: k.id.replica, Instance: k.id.instance, Since: k.s.have})
	}
	return a
}

// knownSender reports whether a region is one the node hears: a
// replica, its regions (its own included) and globalsync; an observer, its
// configured regions, or any.
func (n *Node) knownSender(region string) bool {
	if !n.cfg.Observer {
		return region == namespace.GlobalSync || slices.Contains(n.regions, region)
	}
	return len(n.cfg.Regions) == 0 || slices.Contains(n.cfg.Regions, region)
}

// dropHeard forgets the region heard least lately. The caller holds n.mu.
func (n *Node) dropHeard() {
	oldest := leastLately(n.heard, func(t time.Time) time.Time { return t })
	delete(n.heard, oldest)
	delete(n.rejoined, oldest)
}

// dropSender forgets the replay record of the sender heard least lately.
// The caller holds n.mu.
func (n *Node) dropSender() {
	delete(n.senders, leastLately(n.senders, func(s senderSeen) time.Time { return s.at }))
}

// dropStream forgets the versions of the replica heard least lately. The
// caller holds n.mu.
func (n *Node) dropStream() {
	delete(n.streams, leastLately(n.streams, func(s *streamMark) time.Time { return s.at }))
}

// leastLately returns the key of m whose value was heard least lately.
func leastLately[K comparable, V any](m map[K]V, heard func(V) time.Time) K {
	var oldest K
	var at time.Time
	for k, v := range m {
		if t := heard(v); at.IsZero() || t.Before(at) {
			oldest, at = k, t
		}
	}
	return oldest
}

// answer handles another region's ask (or globalsync's): this replica's
// own slots since the version asked (or since 0 if the asker holds none of
// its versions), and, if its region elected it, the asker's own region's
// slots as its copy holds them. Each asker is paced (askBurst, askRate).
func (n *Node) answer(out []Message, now time.Time, from string, h Header, a Ask) []Message {
	if from == n.cfg.Region || !n.pace(now, from) {
		return out
	}
	subject := n.subjects.Repair(from, n.cfg.Region)
	answered := false
	for _, sa := range a.Streams {
		if sa.Replica != n.cfg.Replica || sa.Instance != n.cfg.Instance {
			continue // another replica's, or an earlier run of this one
		}
		for _, d := range n.cfg.Counters.OwnDeltas(sa.Since, n.cfg.MaxEntries) {
			out = append(out, Message{Subject: subject, Header: n.header(), Body: d})
		}
		answered = true
		break
	}
	if !answered && a.Others {
		for _, d := range n.cfg.Counters.OwnDeltas(0, n.cfg.MaxEntries) {
			out = append(out, Message{Subject: subject, Header: n.header(), Body: d})
		}
		answered = true
	}
	if a.Own && slices.Contains(n.regions, from) && n.elected() {
		d := n.cfg.Counters.RegionState(from)
		d.Origin = n.cfg.Region
		for start := 0; start < len(d.Entries); start += n.cfg.MaxEntries {
			part := d
			part.Entries = d.Entries[start:min(len(d.Entries), start+n.cfg.MaxEntries)]
			out = append(out, Message{Subject: subject, Header: n.header(), Body: part})
		}
		answered = true
	}
	if answered {
		n.stats.AsksAnswered.Add(1)
	}
	return out
}

// pace reports whether an ask from the asker may be answered now, and
// takes it from the asker's allowance.
func (n *Node) pace(now time.Time, asker string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	a := n.askers[asker]
	if a == nil {
		if len(n.askers) >= maxAskers {
			n.stats.Paced.Add(1)
			return false
		}
		a = &askerSeen{tokens: askBurst, at: now}
		n.askers[asker] = a
	}
	a.tokens = min(askBurst, a.tokens+now.Sub(a.at).Seconds()*askRate)
	a.at = now
	if a.tokens < 1 {
		n.stats.Paced.Add(1)
		return false
	}
	a.tokens--
	return true
}

// forget drops the replay records, versions and pace of senders silent
// for long. The caller holds n.mu.
func (n *Node) forget(now time.Time) {
	for s, seen := range n.senders {
		if now.Sub(seen.at) > forgetSenders {
			delete(n.senders, s)
		}
	}
	for id, s := range n.streams {
		if now.Sub(s.at) > forgetSenders {
			delete(n.streams, id)
		}
	}
	for name, a := range n.askers {
		if now.Sub(a.at) > forgetSenders {
			delete(n.askers, name)
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
