package gossip

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/transport/namespace"
)

// Message headers: the sending replica and its message number, so that a
// replayed message is told from a new one. Every sender of gossip sets
// them.
const (
	HeaderReplica  = "Geoquota-Replica"
	HeaderInstance = "Geoquota-Instance" // random per process: a restarted replica numbers afresh
	HeaderSeq      = "Geoquota-Seq"
	// HeaderRevision is the KV revision a pushed value was written at.
	HeaderRevision = "Geoquota-Revision"
)

// Header is who sent a message, and its number in the sender's sequence.
type Header struct {
	Replica, Instance string
	Seq               uint64
}

// Message is one gossip message. A node makes messages with their Body
// decoded (a crdt.Delta for deltas and repairs, an Ask, or a Heartbeat); Encode gives the bytes that travel. A message that comes off
// the wire has Data alone, and Step decodes it, refusing what does not
// decode. An in-memory transport may hand a node's messages to the others
// as they are.
type Message struct {
	Subject string
	Header  Header
	Data    []byte
	Body    any
	// since is, for a delta, the version it runs from (see Node.Unsent).
	since uint64
	delta bool
}

// Encode returns the message's body as it travels, encoding it once.
func (m *Message) Encode() ([]byte, error) {
	if m.Data != nil {
		return m.Data, nil
	}
	var err error
	switch b := m.Body.(type) {
	case crdt.Delta:
		m.Data, err = encodeDelta(b)
	case Ask:
		m.Data, err = json.Marshal(b)
	case Heartbeat:
		m.Data, err = encodeHeartbeat(b)
	default:
		err = fmt.Errorf("gossip: %s: nothing to encode", m.Subject)
	}
	return m.Data, err
}

// Heartbeat is what a replica tells globalsync, every Config.Heartbeat.
type Heartbeat struct {
	Region  string `json:"region"`
	Replica string `json:"replica"`
	// SentMillis is the replica's clock when it sent the heartbeat.
	SentMillis int64 `json:"sent_ms"`
	// Regions are the regions this one was told of (--regions), itself
	// included: globalsync counts them all, heard from or not, when it
	// splits the reserve into floors.
	Regions []string `json:"regions,omitempty"`
	// Rules reports each global rule, by id.
	Rules map[string]RuleReport `json:"rules"`
}

// RuleReport is one replica's report on one global rule: demand so far
// (in limits, cumulative since the replica started), the lease it may
// acknowledge, and what it used in the current window.
type RuleReport struct {
	Admitted float64 `json:"admitted"`
	Denied   float64 `json:"denied"`
	Acked    uint64  `json:"acked,omitempty"`
	// Acks are, when globalsync is sharded, the Seq the replica may
	// acknowledge of each shard's lease of the rule, by shard (Acked is
	// shard 0's): at most budget.MaxShards.
	Acks      []uint64 `json:"acks,omitempty"`
	Used      float64  `json:"used"`
	UsedEpoch int64    `json:"used_epoch"`
	// CountedMillis is how long the replica has counted Admitted and
	// Denied, by its own clock: a first report gives a rate.
	CountedMillis int64 `json:"counted_ms,omitempty"`
	// WindowMillis is the rule's window, which UsedEpoch counts in, and
	// Algorithm its algorithm.
	WindowMillis int64  `json:"window_ms"`
	Algorithm    string `json:"algorithm"`
	// Limit is the rule's limit as this replica enforces it (0 for a rule
	// limited by tier): a region that has not yet heard of a lower limit
	// still allows itself its floor of the higher one.
	Limit int64 `json:"limit,omitempty"`
	// PrevUsed is, if the replica knows it, what it used in the window
	// before UsedEpoch (a sliding window's estimate carries it).
	PrevUsed *float64 `json:"prev_used,omitempty"`
	// Counters reports counters on their own, by key within the rule:
	// those with budgets of their own, and those denied under the rule's
	// lease (at most budget.MaxCounters).
	Counters map[string]CounterReport `json:"counters,omitempty"`
}

// CounterReport is one replica's report on one counter on its own: its
// demand so far (in limits, cumulative), the counter's lease it may
// acknowledge, and what it used of the counter in the current window.
type CounterReport struct {
	Admitted      float64  `json:"admitted"`
	Denied        float64  `json:"denied"`
	Acked         uint64   `json:"acked,omitempty"`
	Used          float64  `json:"used"`
	UsedEpoch     int64    `json:"used_epoch"`
	PrevUsed      *float64 `json:"prev_used,omitempty"`
	CountedMillis int64    `json:"counted_ms,omitempty"` // as RuleReport's
}

// Ask is what a node asks of a region's replicas, for anti-entropy. Every
// replica numbers the versions of its copy of the counters, and each of
// its deltas says which range of them it covers (crdt.Delta's From and
// To): a receiver that finds a range missing, or a replica's versions
// further on than it holds, asks that replica for its own slots changed
// since the last version it holds without a gap.
type Ask struct {
	// Streams asks the replicas named for their own slots changed since a
	// version; each replica answers its own.
	Streams []StreamAsk `json:"streams,omitempty"`
	// Others asks every replica not named in Streams for its own slots
	// since version 0: the asker holds none of its versions.
	Others bool `json:"others,omitempty"`
	// Own asks the replica its region elected for the asker's own region's
	// slots, as its copy holds them: the asker may have lost them (a new
	// process, a flushed store).
	Own bool `json:"own,omitempty"`
}

// StreamAsk asks one replica (one run of it) for its own slots changed
// after version Since: it answers with crdt.Counters.OwnDeltas, which says
// how far its versions run even when nothing changed.
type StreamAsk struct {
	Replica  string `json:"replica"`
	Instance string `json:"instance,omitempty"`
	Since    uint64 `json:"since"`
}

// MaxAskStreams bounds the replicas one ask names.
const MaxAskStreams = 64

func decodeAsk(b []byte) (Ask, error) {
	var a Ask
	if err := json.Unmarshal(b, &a); err != nil {
		return Ask{}, err
	}
	if len(a.Streams) > MaxAskStreams {
		return Ask{}, fmt.Errorf("%w: ask names %d replicas, at most %d", errMalformed, len(a.Streams), MaxAskStreams)
	}
	for _, s := range a.Streams {
		if s.Replica == "" {
			return Ask{}, fmt.Errorf("%w: ask names a replica without a name", errMalformed)
		}
	}
	return a, nil
}

// errMalformed is a body that does not decode as its subject says.
var errMalformed = errors.New("gossip: malformed message")

// decode returns a message's body, decoding Data if it has none.
func (m *Message) decode(k namespace.Kind) (any, error) {
	if m.Body != nil {
		switch m.Body.(type) {
		case crdt.Delta:
			if k == namespace.Delta || k == namespace.Repair {
				return m.Body, nil
			}
		case Ask:
			if k == namespace.Ask {
				return m.Body, nil
			}
		case Heartbeat:
			if k == namespace.Heartbeat {
				return m.Body, nil
			}
		}
		return nil, errMalformed
	}
	switch k {
	case namespace.Delta, namespace.Repair:
		d, err := decodeDelta(m.Data)
		if err != nil {
			return nil, err
		}
		return d, nil
	case namespace.Ask:
		return decodeAsk(m.Data)
	default:
		hb, err := decodeHeartbeat(m.Data)
		if err != nil {
			return nil, err
		}
		return hb, nil
	}
}

// A delta travels as crdt encodes it, or, when that takes more than
// compressAbove bytes, compressed: the magic "gz" (where crdt's is "gq"),
// the uvarint length of crdt's encoding, then that encoding as a raw
// DEFLATE stream (RFC 1951) at its fastest level. Keys are sorted and
// share prefixes already; what is left to gain is mostly the entropy of
// their characters: 24 random base-62 characters of an API key are 18
// bytes of information in 24 (docs/benchmarks.md, Gossip).
const (
	compressAbove = 512
	// maxInflated bounds what a compressed delta may hold: NATS's default
	// payload limit, what an uncompressed one can be, so that compression
	// lets no message make a receiver hold more than before (crdt bounds
	// what a delta of that size can expand to). A larger delta goes as it
	// is (and fails if NATS will not carry it, as before). A ratio is no
	// bound: sorted keys that share prefixes, or one key's many windows,
	// compress a hundred times and more.
	maxInflated = 1 << 20
)

var (
	deflaters = sync.Pool{New: func() any {
		w, _ := flate.NewWriter(nil, flate.BestSpeed)
		return w
	}}
	inflaters sync.Pool
)

// encodeDelta returns the encoding of d as it travels.
func encodeDelta(d crdt.Delta) ([]byte, error) {
	raw, err := crdt.AppendDelta(nil, d)
	if err != nil || len(raw) <= compressAbove || len(raw) > maxInflated {
		return raw, err
	}
	return deflate(raw)
}

// decodeDelta decodes a delta as it travels (see encodeDelta).
func decodeDelta(b []byte) (crdt.Delta, error) {
	if !deflated(b) {
		return crdt.DecodeDelta(b)
	}
	raw, err := inflate(b, "delta", compressAbove, maxInflated)
	if err != nil {
		return crdt.Delta{}, err
	}
	return crdt.DecodeDelta(raw)
}

// A heartbeat travels as JSON, or, when that takes more than
// heartbeatCompressAbove bytes, as a delta does, compressed (the magic
// "gz", the uvarint length of the JSON, the JSON deflated): a replica
// reports every counter its region holds a budget of its own for, some
// 100 to 200 bytes of JSON each, and 12,000 of them would not fit in a
// NATS message as JSON (TestHeartbeatFitsANATSMessage: 955 KB compressed,
// random keys and figures). Below it — any heartbeat that fits in a
// message of the default size — a heartbeat travels as a globalsync of
// before reads it.
const (
	heartbeatCompressAbove = 900 << 10
	// maxHeartbeatInflated bounds what a compressed heartbeat may hold:
	// far more than budget.MaxCounters counters of a rule take as JSON.
	maxHeartbeatInflated = 16 << 20
)

func encodeHeartbeat(hb Heartbeat) ([]byte, error) {
	raw, err := json.Marshal(hb)
	if err != nil || len(raw) <= heartbeatCompressAbove || len(raw) > maxHeartbeatInflated {
		return raw, err
	}
	return deflate(raw)
}

func decodeHeartbeat(b []byte) (Heartbeat, error) {
	var hb Heartbeat
	if deflated(b) {
		raw, err := inflate(b, "heartbeat", heartbeatCompressAbove, maxHeartbeatInflated)
		if err != nil {
			return hb, err
		}
		b = raw
	}
	err := json.Unmarshal(b, &hb)
	return hb, err
}

// deflate returns raw compressed, after the magic "gz" and its length.
func deflate(raw []byte) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("gz")
	buf.Write(binary.AppendUvarint(nil, uint64(len(raw))))
	w := deflaters.Get().(*flate.Writer)
	defer deflaters.Put(w)
	w.Reset(&buf)
	if _, err := w.Write(raw); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// deflated reports whether b is compressed (deflate): crdt's encoding
// begins "gq", JSON "{".
func deflated(b []byte) bool { return len(b) >= 2 && b[0] == 'g' && b[1] == 'z' }

// inflate returns what deflate compressed into b: a message (what) that
// travels compressed only above more bytes, and inflates to at most limit.
func inflate(b []byte, what string, more, limit int) ([]byte, error) {
	n, k := binary.Uvarint(b[2:])
	if k <= 0 || n == 0 || n > uint64(limit) {
		return nil, fmt.Errorf("%w: a compressed %s claiming %d bytes, at most %d", errMalformed, what, n, limit)
	}
	// A bytes.Reader is an io.ByteReader: the inflater reads no further
	// than the stream's end, so what is left after it is known.
	body := bytes.NewReader(b[2+k:])
	r, _ := inflaters.Get().(io.ReadCloser)
	if r == nil {
		r = flate.NewReader(body)
	} else if err := r.(flate.Resetter).Reset(body, nil); err != nil {
		return nil, err
	}
	defer inflaters.Put(r)
	raw := make([]byte, n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, fmt.Errorf("%w: a compressed %s shorter than the %d bytes it claims: %v", errMalformed, what, n, err)
	}
	if k, err := r.Read(make([]byte, 1)); k != 0 || err != io.EOF {
		return nil, fmt.Errorf("%w: a compressed %s longer than the %d bytes it claims", errMalformed, what, n)
	}
	if body.Len() != 0 {
		return nil, fmt.Errorf("%w: %d bytes after a compressed %s's end", errMalformed, body.Len(), what)
	}
	if len(raw) <= more {
		return nil, fmt.Errorf("%w: a compressed %s of %d bytes, which travels as it is", errMalformed, what, n)
	}
	return raw, nil
}
