package gossip

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/transport/namespace"
)

// randomKeys are API keys of 24 random base-62 characters, as
// BenchmarkGossipTraffic's.
func randomKeys(n int) []string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, n)
	for i := range keys {
		b := []byte("sk_live_")
		for range 24 {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		keys[i] = string(b)
	}
	return keys
}

// deltaOf is a delta of one region's slots of the given keys.
func deltaOf(keys []string) crdt.Delta {
	d := crdt.Delta{Origin: "us", From: 0, To: 1}
	for i, k := range keys {
		d.Entries = append(d.Entries, crdt.Entry{ID: crdt.ID{Key: "gq:{tenant-global:" + k + "}", Epoch: 1_800_000_000_000},
			Slots: []crdt.Slot{{Region: "us", P: uint64(1 + i%50)}}})
	}
	d.Normalize()
	return d
}

// A delta of more than compressAbove bytes travels compressed, a smaller
// one as crdt encodes it; both decode to what was sent.
func TestDeltasTravelCompressed(t *testing.T) {
	for _, n := range []int{1, 1_000} {
		d := deltaOf(randomKeys(n))
		raw, err := crdt.AppendDelta(nil, d)
		if err != nil {
			t.Fatal(err)
		}
		m := Message{Subject: "geoquota.delta.us", Body: d}
		data, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		compressed := bytes.HasPrefix(data, []byte("gz"))
		if compressed != (len(raw) > compressAbove) {
			t.Fatalf("%d keys, %d bytes raw: compressed %v", n, len(raw), compressed)
		}
		if compressed && len(data) >= len(raw)*85/100 {
			t.Fatalf("%d random keys: %d bytes compressed, %d raw: want at least 15%% less", n, len(data), len(raw))
		}
		got, err := decodeDelta(data)
		if err != nil || !reflect.DeepEqual(got, d) {
			t.Fatalf("%d keys: decoded %v, %v", n, err, got.Slots())
		}
	}
}

// A compressed delta is refused, whole, when it claims more than a receiver
// will inflate (what NATS would carry uncompressed), is shorter or longer
// than it claims, has bytes after its end, or compresses what would travel
// as it is.
func TestCompressedDeltasAreBounded(t *testing.T) {
	raw, _ := crdt.AppendDelta(nil, deltaOf(randomKeys(1_000)))
	small, _ := crdt.AppendDelta(nil, deltaOf(randomKeys(1)))
	zero := make([]byte, 1<<20) // a bomb: a megabyte of zeros deflates to about a kilobyte
	wrap := func(claim int, body []byte) []byte {
		var buf bytes.Buffer
		buf.WriteString("gz")
		buf.Write(binary.AppendUvarint(nil, uint64(claim)))
		w, _ := flate.NewWriter(&buf, flate.BestCompression)
		w.Write(body)
		w.Close()
		return buf.Bytes()
	}
	for name, data := range map[string][]byte{
		"a bomb":              wrap(len(zero), zero),
		"claims beyond bound": wrap(maxInflated+1, raw),
		"padded":              append(wrap(len(raw), raw), make([]byte, 64)...),
		"shorter than claims": wrap(len(raw)+10, raw),
		"longer than claims":  wrap(len(raw)-10, raw),
		"claims nothing":      wrap(0, raw),
		"small, compressed":   wrap(len(small), small),
		"no length":           []byte("gz"),
		"not deflate":         append([]byte("gz\x10"), bytes.Repeat([]byte{0xff}, 40)...),
	} {
		if _, err := decodeDelta(data); err == nil {
			t.Errorf("%s: decoded", name)
		} else if !errors.Is(err, errMalformed) && !errors.Is(err, crdt.ErrMalformed) {
			t.Logf("%s: %v", name, err)
		}
	}
	if _, err := decodeDelta(wrap(len(raw), raw)); err != nil {
		t.Fatalf("a well-formed compressed delta: %v", err)
	}
}

// Deltas that compress a hundred times and more, as sorted keys sharing
// prefixes and one key's many windows do, are taken in.
func TestHighlyCompressibleDeltasAreTakenIn(t *testing.T) {
	one := crdt.Delta{Origin: "us", To: 1}
	seq := crdt.Delta{Origin: "us", To: 1}
	for i := range 20_000 {
		one.Entries = append(one.Entries, crdt.Entry{ID: crdt.ID{Key: "gq:{tenant-global:acme}", Epoch: 1_800_000_000_000 + int64(i)*1000},
			Slots: []crdt.Slot{{Region: "us", P: 5}}})
		seq.Entries = append(seq.Entries, crdt.Entry{ID: crdt.ID{Key: fmt.Sprintf("gq:{tenant-global:tenant-%06d}", i), Epoch: 1_800_000_000_000},
			Slots: []crdt.Slot{{Region: "us", P: 1}}})
	}
	for name, d := range map[string]crdt.Delta{"one key, 20,000 windows": one, "20,000 sequential tenants": seq} {
		d.Normalize()
		raw, _ := crdt.AppendDelta(nil, d)
		data, err := encodeDelta(d)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeDelta(data)
		if err != nil || len(got.Entries) != len(d.Entries) {
			t.Fatalf("%s (%d bytes, %d compressed): %v", name, len(raw), len(data), err)
		}
		t.Logf("%s: %d bytes, %d compressed (%.0f times)", name, len(raw), len(data), float64(len(raw))/float64(len(data)))
	}
}

// BenchmarkDeltaWire: encoding and decoding a delta of 1,000 changed
// counters as it travels, random API keys.
func BenchmarkDeltaWire(b *testing.B) {
	d := deltaOf(randomKeys(1_000))
	raw, _ := crdt.AppendDelta(nil, d)
	data, _ := encodeDelta(d)
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			encodeDelta(d)
		}
		b.ReportMetric(float64(len(data))/1000, "B/counter")
		b.ReportMetric(float64(len(raw))/1000, "raw-B/counter")
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeDelta(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			crdt.DecodeDelta(raw)
		}
	})
	b.Run("encode-raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			crdt.AppendDelta(nil, d)
		}
	})
}

// TestHeartbeatFitsANATSMessage: a replica's heartbeat naming
// budget.DefaultMaxCounters counters of a rule — keys of 24 random
// characters, every figure at full precision — travels compressed in less
// than a NATS message (1 MB by default), where its JSON takes twice that,
// and arrives as it left; a small one travels as JSON, as before.
func TestHeartbeatFitsANATSMessage(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	counters := map[string]CounterReport{}
	for _, k := range randomKeys(budget.DefaultMaxCounters) {
		prev := rng.Float64()
		counters[k] = CounterReport{Admitted: rng.Float64() * 30, Denied: rng.Float64() * 10, Acked: 1_000_000 + rng.Uint64N(100),
			Used: rng.Float64(), UsedEpoch: 29_495_123, PrevUsed: &prev, CountedMillis: 60_000 + rng.Int64N(1000)}
	}
	hb := Heartbeat{Region: "us", Replica: "us-1", SentMillis: 1_764_166_000_123, Regions: []string{"af", "ap", "eu", "sa", "us"},
		Rules: map[string]RuleReport{"free": {Admitted: 123.456, WindowMillis: 60_000, Algorithm: "fixed_window", Limit: 1000, Counters: counters}}}
	m := Message{Subject: "hb", Body: hb}
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !deflated(b) || len(b) > 1<<20 {
		t.Fatalf("a heartbeat of %d counters: %d bytes, compressed %v; want compressed, at most 1 MB", len(counters), len(b), deflated(b))
	}
	got, err := (&Message{Data: b}).decode(namespace.Heartbeat)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, hb) {
		t.Fatal("the heartbeat decoded is not the one encoded")
	}
	t.Logf("a heartbeat of %d counters, random keys: %d bytes compressed", len(counters), len(b))
	small := Message{Subject: "hb", Body: Heartbeat{Region: "us", Replica: "us-1", Rules: map[string]RuleReport{}}}
	if b, err := small.Encode(); err != nil || deflated(b) || b[0] != '{' {
		t.Fatalf("a small heartbeat: %q, %v; want JSON", b, err)
	}
	// A compressed heartbeat that claims more than it may hold, or that
	// would have travelled as it is, is refused.
	for _, bad := range [][]byte{
		append([]byte("gz"), binary.AppendUvarint(nil, maxHeartbeatInflated+1)...),
		mustDeflate(t, []byte(`{"region":"us"}`)),
	} {
		if _, err := (&Message{Data: bad}).decode(namespace.Heartbeat); !errors.Is(err, errMalformed) {
			t.Errorf("%.20q: %v, want errMalformed", bad, err)
		}
	}
}

func mustDeflate(t *testing.T, raw []byte) []byte {
	b, err := deflate(raw)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
