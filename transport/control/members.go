package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/geoquota/geoquota/regional"
	"github.com/hashicorp/memberlist"
)

// MembersConfig configures replica membership inside one region.
type MembersConfig struct {
	// Name is this replica's name among its siblings: unique, and the
	// order of names decides which replica is elected (the first alive).
	Name string
	// Addr is host:port to listen on for the membership protocol (TCP and
	// UDP); port 0 picks a free one.
	Addr string
	// Peers are host:port of siblings to join; none: start alone, and
	// let the siblings join.
	Peers []string
	// SecretKey, if set (16, 24 or 32 bytes), encrypts and authenticates
	// the membership traffic (AES-GCM).
	SecretKey []byte
	// Profile is the timing profile: "lan" (the default: a data centre
	// network; a dead replica is noticed in about five seconds) or
	// "local" (one host, tests: about a second).
	Profile string
	Logger  *slog.Logger
}

// Members is a region's replicas finding each other (memberlist): the
// first alive replica, by name, is elected to answer anti-entropy for the
// region, and every replica tells its siblings of keys it found over their
// limits, for their denial caches. Safe for concurrent use.
type Members struct {
	ml     *memberlist.Memberlist
	name   string
	queue  *memberlist.TransmitLimitedQueue
	engine *regional.Engine
	log    *slog.Logger

	mu      sync.Mutex
	elected bool
}

// denialMsg is a denial told to siblings.
type denialMsg struct {
	Key     string `json:"k"`
	Until   int64  `json:"u"` // Unix ms
	Cost    int64  `json:"c"`
	ResetAt int64  `json:"r"` // Unix ms
}

// StartMembers joins (or starts) the region's membership. e hears of the
// siblings' denials. Stop with Leave or Shutdown.
func StartMembers(cfg MembersConfig, e *regional.Engine) (*Members, error) {
	if cfg.Name == "" {
		return nil, errors.New("transport: members: a name is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var mc *memberlist.Config
	switch cfg.Profile {
	case "", "lan":
		mc = memberlist.DefaultLANConfig()
	case "local":
		mc = memberlist.DefaultLocalConfig()
	default:
		return nil, fmt.Errorf("transport: members: profile %q: want lan or local", cfg.Profile)
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("transport: members: --memberlist-addr %q: %w", cfg.Addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("transport: members: --memberlist-addr %q: bad port", cfg.Addr)
	}
	m := &Members{name: cfg.Name, engine: e, log: cfg.Logger}
	mc.Name, mc.BindAddr, mc.BindPort, mc.AdvertisePort = cfg.Name, host, p, p
	mc.SecretKey = cfg.SecretKey
	mc.Logger = log.New(io.Discard, "", 0)
	mc.Delegate = m
	m.queue = &memberlist.TransmitLimitedQueue{RetransmitMult: mc.RetransmitMult, NumNodes: m.numNodes}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("transport: members: %w", err)
	}
	m.mu.Lock()
	m.ml = ml
	m.mu.Unlock()
	if len(cfg.Peers) > 0 {
		if _, err := m.ml.Join(cfg.Peers); err != nil {
			// The siblings may not be up yet: they will join us.
			cfg.Logger.Warn("members: no sibling answered yet", "peers", cfg.Peers, "err", err)
		}
	}
	return m, nil
}

func (m *Members) list() *memberlist.Memberlist {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ml
}

func (m *Members) numNodes() int {
	if ml := m.list(); ml != nil {
		return ml.NumMembers()
	}
	return 1
}

// Addr is the address the membership listens on.
func (m *Members) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Names returns the names of the replicas alive, sorted.
func (m *Members) Names() []string {
	ml := m.list()
	if ml == nil {
		return nil // still starting
	}
	var names []string
	for _, n := range ml.Members() {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names
}

// Elected reports whether this replica is the region's elected one: the
// first, by name, of the replicas alive as this one sees them.
func (m *Members) Elected() bool {
	names := m.Names()
	elected := len(names) > 0 && names[0] == m.name
	m.mu.Lock()
	changed := elected != m.elected
	m.elected = elected
	m.mu.Unlock()
	if changed {
		m.log.Info("members: election", "elected", elected, "replicas", names)
	}
	return elected
}

// maxQueuedDenials bounds the denials waiting to be told: with no sibling
// to tell (alone, or the others dead) or a flood of denials, the oldest go.
const maxQueuedDenials = 10_000

// TellDenial tells the siblings of a key over its limit (regional.Config's
// OnDenied). It does not block.
func (m *Members) TellDenial(d regional.Denial) {
	b, _ := json.Marshal(denialMsg{Key: d.Key, Until: d.Until.UnixMilli(), Cost: d.Cost, ResetAt: d.ResetAt.UnixMilli()})
	m.queue.QueueBroadcast(&broadcast{key: d.Key, msg: b})
	if m.queue.NumQueued() > maxQueuedDenials {
		m.queue.Prune(maxQueuedDenials)
	}
}

// Leave tells the siblings this replica goes, then stops.
func (m *Members) Leave(timeout time.Duration) error {
	err := m.ml.Leave(timeout)
	return errors.Join(err, m.ml.Shutdown())
}

// Shutdown stops at once, without a word to the siblings (as a crash
// would).
func (m *Members) Shutdown() error { return m.ml.Shutdown() }

// NodeMeta implements memberlist.Delegate.
func (m *Members) NodeMeta(int) []byte { return nil }

// NotifyMsg implements memberlist.Delegate: a sibling's denial.
func (m *Members) NotifyMsg(b []byte) {
	var d denialMsg
	if json.Unmarshal(b, &d) != nil || d.Key == "" {
		return
	}
	if err := m.engine.NoteDenial(regional.Denial{Key: d.Key, Until: time.UnixMilli(d.Until), Cost: d.Cost, ResetAt: time.UnixMilli(d.ResetAt)}); err != nil {
		m.log.Debug("a sibling's denial refused", "err", err)
	}
}

// GetBroadcasts implements memberlist.Delegate.
func (m *Members) GetBroadcasts(overhead, limit int) [][]byte {
	return m.queue.GetBroadcasts(overhead, limit)
}

// LocalState implements memberlist.Delegate.
func (m *Members) LocalState(bool) []byte { return nil }

// MergeRemoteState implements memberlist.Delegate.
func (m *Members) MergeRemoteState([]byte, bool) {}

// broadcast is one denial told to the siblings; a newer one for the same
// key replaces it.
type broadcast struct {
	key string
	msg []byte
}

func (b *broadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*broadcast)
	return ok && ob.key == b.key
}
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}
