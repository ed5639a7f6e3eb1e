package crdt

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

const benchEpoch = 1_767_225_600_000 // 2026-01-01T00:00:00Z in Unix ms

var fiveRegions = []string{"ap-south", "eu-central", "eu-west", "us-east", "us-west"}

// benchKeys returns n counter keys as regional would build them: rule id
// and API key. Sequential keys share long prefixes; random ones (24 random
// base-62 characters, like real API keys) share little.
func benchKeys(n int, random bool) []string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, n)
	for i := range keys {
		if !random {
			keys[i] = fmt.Sprintf("tenant-global/sk_prod_%06d", i)
			continue
		}
		b := []byte("tenant-global/sk_live_")
		for range 24 {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		keys[i] = string(b)
	}
	return keys
}

// benchDelta returns a canonical delta over keys, with the given regions'
// slots at values a busy window reaches.
func benchDelta(keys []string, regions []string, seed uint64) Delta {
	rng := rand.New(rand.NewPCG(seed, 7))
	d := Delta{Origin: regions[0], From: 1000, To: 2000}
	slots := make([]Slot, 0, len(keys)*len(regions))
	for _, k := range keys {
		start := len(slots)
		for _, r := range regions {
			slots = append(slots, Slot{Region: r, P: 1 + rng.Uint64N(20_000)})
		}
		d.Entries = append(d.Entries, Entry{ID: ID{Key: k, Epoch: benchEpoch}, Slots: slots[start:len(slots):len(slots)]})
	}
	d.Normalize()
	return d
}

// BenchmarkMergeDelta merges a 100,000-key delta from a remote region: into
// an empty collection (first contact) and into one that already holds every
// key at lower values (the steady state of gossip).
func BenchmarkMergeDelta(b *testing.B) {
	keys := benchKeys(100_000, true)
	d := benchDelta(keys, []string{"eu-west"}, 1)
	b.Run("100k-keys-new", func(b *testing.B) {
		for b.Loop() {
			c, _ := NewCounters("us-east", fiveRegions)
			if r := c.Merge(d); r.Applied != len(keys) {
				b.Fatalf("applied %d", r.Applied)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
	})
	b.Run("100k-keys-existing", func(b *testing.B) {
		c, _ := NewCounters("us-east", fiveRegions)
		c.Merge(d)
		for b.Loop() {
			b.StopTimer()
			for i := range d.Entries {
				d.Entries[i].Slots[0].P++
			}
			b.StartTimer()
			if r := c.Merge(d); r.Applied != len(keys) {
				b.Fatalf("applied %d", r.Applied)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
	})
}

// BenchmarkEncodeSize encodes 10,000-key deltas and reports the bytes per
// (key, epoch, slot) change: full state of five regions (what anti-entropy
// and globalsync send) and a region's own slots (what it gossips), for keys
// that share prefixes and for random ones.
func BenchmarkEncodeSize(b *testing.B) {
	for _, tc := range []struct {
		name    string
		random  bool
		regions []string
	}{
		{"5-regions/sequential-keys", false, fiveRegions},
		{"5-regions/random-keys", true, fiveRegions},
		{"own-slot/sequential-keys", false, fiveRegions[3:4]},
		{"own-slot/random-keys", true, fiveRegions[3:4]},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := benchDelta(benchKeys(10_000, tc.random), tc.regions, 3)
			var msg []byte
			for b.Loop() {
				var err error
				if msg, err = AppendDelta(msg[:0], d); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(msg))/float64(d.Slots()), "B/change")
			b.ReportMetric(float64(len(msg)), "B/msg")
		})
	}
}

func BenchmarkDecodeDelta(b *testing.B) {
	d := benchDelta(benchKeys(100_000, true), fiveRegions, 3)
	msg, err := AppendDelta(nil, d)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, err := DecodeDelta(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInc is the simulator's hot path: one admitted request counted.
func BenchmarkInc(b *testing.B) {
	c, _ := NewCounters("us-east", fiveRegions)
	keys := benchKeys(1000, true)
	ids := make([]ID, len(keys))
	for i, k := range keys {
		ids[i] = ID{Key: k, Epoch: benchEpoch}
		c.Inc(ids[i], 1)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.Inc(ids[i%len(ids)], 1)
		i++
	}
}

// BenchmarkOwnDeltaSince is one gossip tick: 1,000 of 100,000 counters
// changed since the last one.
func BenchmarkOwnDeltaSince(b *testing.B) {
	c, _ := NewCounters("us-east", fiveRegions)
	keys := benchKeys(100_000, true)
	ids := make([]ID, len(keys))
	for i, k := range keys {
		ids[i] = ID{Key: k, Epoch: benchEpoch}
		c.Inc(ids[i], 1)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for b.Loop() {
		b.StopTimer()
		v := c.Version()
		for range 1000 {
			c.Inc(ids[rng.IntN(len(ids))], 1)
		}
		b.StartTimer()
		if d := c.OwnDeltaSince(v); len(d.Entries) == 0 {
			b.Fatal("no changes")
		}
	}
}
