package budget

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// countersDocument is a document of a rule with n counters of their own
// among five regions, each homed in one, after a few rebalances, with
// the allocator's snapshot; and the allocator.
func countersDocument(t testing.TB, n int) (Document, *Allocator) {
	cfg := DefaultConfig()
	cfg.Counters = n
	a, err := NewAllocator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{ID: "g", Window: time.Minute}
	regions := []string{"af", "ap", "eu", "sa", "us"}
	now := t0.Add(1234567 * time.Nanosecond) // times not whole µs
	var seq uint64
	var leases []Lease
	for range 4 {
		for i, r := range regions {
			a.Report(rule.ID, Report{Region: r, Demand: float64(i+1) / 5, Acked: seq})
			for k := range n {
				d := 0.05
				if k%len(regions) == i {
					d = 1.5
				}
				a.ReportCounter(rule.ID, "tenant-"+strconv.Itoa(k), Report{Region: r, Demand: d, Acked: seq, HasUsed: seq > 0,
					UsedEpoch: epochOf(now, rule.Window), Used: 0.1})
			}
		}
		if leases, err = a.Rebalance(now, rule, regions); err != nil {
			t.Fatal(err)
		}
		seq = leases[0].Seq
		now = now.Add(time.Second)
	}
	d := NewDocument("gs", leases)
	d.SetSnapshot(a.Snapshot(rule.ID))
	return d, a
}

// TestCounterBlob: a document's counters travel in counter_blob, several
// times smaller than as JSON, and come back each rounded the safe way —
// leases down, marks and floors up, by less than a millionth of the
// limit; times up, by less than a microsecond — so that a leader that
// restores from it counts no less than was used.
func TestCounterBlob(t *testing.T) {
	d, _ := countersDocument(t, 500)
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	w := documentWire{documentFields: documentFields(d), Counters: d.Counters, CounterSnapshots: d.CounterSnapshots}
	old, _ := json.Marshal(w)
	if len(b)*4 > len(old) {
		t.Errorf("%d counters: %d bytes with counter_blob, %d as JSON: want a quarter at most", len(d.Counters), len(b), len(old))
	}
	if raw := appendCounterBlob(nil, &d); len(raw)*4 > len(old) {
		t.Errorf("%d counters: a blob of %d bytes before it is deflated, %d as JSON: want a quarter at most", len(d.Counters), len(raw), len(old))
	}
	t.Logf("%d counters: %d bytes (%d a counter), %d as JSON", len(d.Counters), len(b), len(b)/len(d.Counters), len(old))
	got, err := DecodeDocument(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Counters) != len(d.Counters) || len(got.CounterSnapshots) != len(d.CounterSnapshots) {
		t.Fatalf("%d leases and %d snapshots back, want %d and %d", len(got.Counters), len(got.CounterSnapshots), len(d.Counters), len(d.CounterSnapshots))
	}
	down := func(what string, got, want float64) {
		if got > want || want-got > 1e-6 {
			t.Errorf("%s: %v, want %v rounded down", what, got, want)
		}
	}
	up := func(what string, got, want float64) {
		if got < want || got-want > 1e-6 {
			t.Errorf("%s: %v, want %v rounded up", what, got, want)
		}
	}
	later := func(what string, got, want time.Time) {
		if got.Before(want) || got.Sub(want) >= time.Microsecond {
			t.Errorf("%s: %v, want %v rounded up to the µs", what, got, want)
		}
	}
	for k, byRegion := range d.Counters {
		for r, l := range byRegion {
			g := got.Counters[k][r]
			down(k+" "+r+" floor", g.Floor, l.Floor)
			down(k+" "+r+" share", g.Share, l.Share)
			if !l.Released.IsZero() {
				later(k+" "+r+" released", g.Released, l.Released)
			}
		}
	}
	for k, s := range d.CounterSnapshots {
		g := got.CounterSnapshots[k]
		if g.Since != s.Since || len(g.Marks) != len(s.Marks) || len(g.Acked) != len(s.Acked) {
			t.Fatalf("%s: snapshot %+v, want %+v", k, g, s)
		}
		for e, m := range s.Marks {
			for r, f := range m {
				up(k+" mark", g.Marks[e][r], f)
			}
		}
		for r, n := range s.Acked {
			if g.Acked[r] != n {
				t.Errorf("%s %s: acked %d, want %d", k, r, g.Acked[r], n)
			}
		}
		for r, at := range s.AckedExp {
			later(k+" "+r+" acked expiry", g.AckedExp[r], at)
		}
		for r, f := range s.Floors {
			up(k+" "+r+" floor held", g.Floors[r], f)
		}
		if !s.LastDemand.IsZero() {
			later(k+" last demand", g.LastDemand, s.LastDemand)
		}
	}
	// Every counter and its lease, for a leader that restores from it.
	b2, _ := NewAllocator(DefaultConfig())
	b2.RestoreHistory([]Document{got})
	if n := len(b2.Counters("g")); n != len(d.Counters) {
		t.Errorf("a leader restored %d counters, want %d", n, len(d.Counters))
	}
	// The form before counter_blob is still read.
	prev, err := DecodeDocument(old)
	if err != nil || len(prev.Counters) != len(d.Counters) {
		t.Fatalf("the JSON form: %d counters, %v", len(prev.Counters), err)
	}
}

// TestCounterBlobRefused: a blob that runs short, names a region it did
// not list, holds a fraction above the limit, or comes with counters as
// JSON too, is an invalid document.
func TestCounterBlobRefused(t *testing.T) {
	d, _ := countersDocument(t, 3)
	blob := appendCounterBlob(nil, &d)
	if _, err := DecodeDocument(func() []byte {
		b, _ := json.Marshal(map[string]any{"rule": "g", "seq": 9, "counter_blob": deflateBlob(blob)})
		return b
	}()); err != nil {
		t.Fatalf("the blob deflated: %v", err)
	}
	doc := func(blob []byte) []byte {
		b, _ := json.Marshal(map[string]any{"rule": "g", "seq": 9, "counter_blob": blob})
		return b
	}
	if _, err := DecodeDocument(doc(blob)); err != nil {
		t.Fatalf("the blob as written: %v", err)
	}
	bad := map[string][]byte{
		"truncated":       blob[:len(blob)/2],
		"trailing bytes":  append(append([]byte{}, blob...), 0),
		"version 2":       append([]byte{2}, blob[1:]...),
		"unknown region":  {1, 1, 2, 'u', 's', 1, 1, 'k', 2, 0, 0, 0, 0},
		"fraction over 1": {1, 1, 2, 'u', 's', 1, 1, 'k', 1, 0, 0xc2, 0x84, 0x3d, 0, 0},
		"no counters":     {1, 0, 5},
		"deflated badly":  {2, 0xff, 0xff, 0xff},
	}
	for name, b := range bad {
		if _, err := DecodeDocument(doc(b)); !errors.Is(err, ErrInvalidDocument) {
			t.Errorf("%s: %v, want ErrInvalidDocument", name, err)
		}
	}
	both, _ := json.Marshal(map[string]any{"rule": "g", "seq": 9, "counter_blob": blob, "counters": map[string]any{"k": map[string]any{}}})
	if _, err := DecodeDocument(both); !errors.Is(err, ErrInvalidDocument) {
		t.Errorf("counters in both forms: %v, want ErrInvalidDocument", err)
	}
}

// TestMicroRounding: a fraction in millionths is rounded down or up as
// asked, never the other way, and one already whole in millionths stays.
func TestMicroRounding(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.Float64Range(0, 1).Draw(t, "f")
		d, u := fromMicro(toMicro(f, false)), fromMicro(toMicro(f, true))
		if d > f+1e-12 || f-d > 1e-6 || u < f-1e-12 || u-f > 1e-6 {
			t.Fatalf("%v: down %v, up %v", f, d, u)
		}
		w := math.Round(f*micro) / micro
		if fromMicro(toMicro(w, false)) != w || fromMicro(toMicro(w, true)) != w {
			t.Fatalf("%v, whole in millionths, moved", w)
		}
	})
}

// BenchmarkDocumentCounters: encoding and decoding a rule's document with
// DefaultMaxCounters counters of their own and its snapshot, as the leader
// writes it and every replica reads it, every rebalance.
func BenchmarkDocumentCounters(b *testing.B) {
	d, _ := countersDocument(b, DefaultMaxCounters)
	var n int
	for b.Loop() {
		bs, err := json.Marshal(d)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeDocument(bs); err != nil {
			b.Fatal(err)
		}
		n = len(bs)
	}
	b.ReportMetric(float64(n), "bytes/doc")
}

// TestDocumentFitsANATSMessage: a document of 6,000 counters with budgets
// of their own among five regions fits in a NATS message (1 MB by
// default), however little its contents compress: keys of 24 random
// letters, every fraction random (the simulator's compress to less than
// half). A leader fits its documents to the message (coord's Sized), so
// that such keys get some 4,300 budgets a rule (70% of a message).
func TestDocumentFitsANATSMessage(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	regions := []string{"af", "ap", "eu", "sa", "us"}
	issued := t0
	d := Document{Rule: "g", Seq: 1_000_000, Issued: issued, CounterExpires: issued.Add(10 * time.Second),
		Counters: map[string]map[string]CounterLeaseDoc{}, CounterSnapshots: map[string]CounterSnapshot{}}
	frac := func() float64 { return rng.Float64() / 5 }
	at := func() time.Time { return issued.Add(time.Duration(rng.Int64N(int64(10 * time.Second)))) }
	const counters = 6000
	for range counters {
		key := make([]byte, 24)
		for i := range key {
			key[i] = byte('a' + rng.IntN(26))
		}
		leases := map[string]CounterLeaseDoc{}
		s := CounterSnapshot{Since: 999_000 + rng.Uint64N(1000), Marks: map[int64]map[string]float64{29_999_999: {}, 30_000_000: {}},
			Acked: map[string]uint64{}, AckedExp: map[string]time.Time{}, Floors: map[string]float64{}, LastDemand: at()}
		for _, r := range regions {
			leases[r] = CounterLeaseDoc{Floor: frac() / 10, Share: frac()}
			s.Marks[29_999_999][r], s.Marks[30_000_000][r] = frac(), frac()
			s.Acked[r] = d.Seq - rng.Uint64N(3)
			s.AckedExp[r] = at()
			s.Floors[r] = frac() / 10
		}
		d.Counters[string(key)] = leases
		d.CounterSnapshots[string(key)] = s
	}
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 1<<20 {
		t.Errorf("a document of %d counters: %d bytes, over 1 MB", counters, len(b))
	}
	t.Logf("a document of %d counters, random: %d bytes (%d a counter)", counters, len(b), len(b)/counters)
	// Its counters are encoded in chunks in parallel: the same bytes as
	// on one goroutine, and every counter read back.
	on := func(procs int) []byte {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if one, many := on(1), on(4); !bytes.Equal(one, many) {
		t.Errorf("the document encoded on 4 procs differs from on 1 (%d bytes against %d)", len(many), len(one))
	}
	var back Document
	if err := json.Unmarshal(b, &back); err != nil || len(back.Counters) != counters || len(back.CounterSnapshots) != counters {
		t.Errorf("read back: %d counters, %d snapshots, %v; want %d of each", len(back.Counters), len(back.CounterSnapshots), err, counters)
	}
}
