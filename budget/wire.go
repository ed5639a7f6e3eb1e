package budget

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"
)

// A Document travels as JSON, its counters with budgets of their own — as
// many as MaxCounters, where the rule's own leases are a handful — in one
// compact binary field, counter_blob, deflated (flate's fastest level): a
// document must fit in a NATS message, and every replica of every region
// receives each one, every rebalance.
//
// Fractions of the limit travel in millionths, each rounded the safe way:
// a lease's floor and share down (a region enforces no more than it was
// granted; what it was told is what a new leader restores), a high-water
// mark or a floor a region may use, in a snapshot, up (a new leader counts
// no less than was used). Times travel to the microsecond, as offsets from
// the document's Issued, rounded up.
//
// counter_blob is a byte 2 and, deflated, the blob of version 1 after its
// first byte; version 1, read too, is:
//
//	byte 1
//	uvarint regions; per region: uvarint length, name
//	uvarint counters; per counter:
//	  uvarint length, key
//	  uvarint mask of the regions with a lease (bit i: region i)
//	  per region in the mask: byte flags (1: released), uvarint floor,
//	    uvarint share, and if released varint released
//	  byte 1 if a snapshot follows, else 0; a snapshot:
//	    uvarint since
//	    uvarint windows; per window: varint epoch, uvarint mask, per
//	      region in it uvarint mark
//	    uvarint mask, per region uvarint acked
//	    uvarint mask, per region varint acked lease's expiry
//	    uvarint mask, per region uvarint floor
//	    byte flags (1: last demand, 2: released), then varint each
//
// A decoder of the form before (counters and counter_snapshots as JSON)
// still reads it: a regiond upgraded before its globalsync reads both.

const (
	blobVersion = 1
	// blobDeflated is the version of a deflated blob of version 1.
	blobDeflated = 2
	// maxBlobInflated bounds what a deflated blob may inflate to: far
	// more than MaxCounters counters take.
	maxBlobInflated = 64 << 20
	// micro is the unit of fractions on the wire.
	micro = 1e6
	// maxBlobRegions bounds the regions a blob names: masks are 64 bits.
	maxBlobRegions = 64
)

// documentWire is Document as JSON carries it.
type documentWire struct {
	documentFields
	// As leaders before counter_blob wrote them; shadow the fields of
	// the same names.
	Counters         map[string]map[string]CounterLeaseDoc `json:"counters,omitempty"`
	CounterSnapshots map[string]CounterSnapshot            `json:"counter_snapshots,omitempty"`
	CounterBlob      []byte                                `json:"counter_blob,omitempty"`
}

// documentFields is Document without its methods, for documentWire.
type documentFields Document

// MarshalJSON writes the document with its counters in counter_blob.
func (d Document) MarshalJSON() ([]byte, error) {
	w := documentWire{documentFields: documentFields(d)}
	if len(d.Counters) > 0 || len(d.CounterSnapshots) > 0 {
		w.CounterBlob = deflateBlob(appendCounterBlob(nil, &d))
	}
	return json.Marshal(w)
}

// deflateBlob deflates a blob of version 1.
func deflateBlob(raw []byte) []byte {
	var buf bytes.Buffer
	buf.WriteByte(blobDeflated)
	w, _ := flate.NewWriter(&buf, flate.BestSpeed) // a valid level: no error
	w.Write(raw[1:])                               // a bytes.Buffer takes all
	w.Close()
	return buf.Bytes()
}

// inflateBlob returns a blob of version 1 from a deflated one, refusing
// one that inflates past maxBlobInflated.
func inflateBlob(b []byte) ([]byte, error) {
	r := flate.NewReader(bytes.NewReader(b[1:]))
	defer r.Close()
	raw, err := io.ReadAll(io.LimitReader(r, maxBlobInflated+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errBlob, err)
	}
	if len(raw) > maxBlobInflated {
		return nil, fmt.Errorf("%w: inflates past %d bytes", errBlob, maxBlobInflated)
	}
	return append([]byte{blobVersion}, raw...), nil
}

// UnmarshalJSON reads a document in either form.
func (d *Document) UnmarshalJSON(b []byte) error {
	var w documentWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*d = Document(w.documentFields)
	d.Counters, d.CounterSnapshots = w.Counters, w.CounterSnapshots
	if len(w.CounterBlob) > 0 {
		if d.Counters != nil || d.CounterSnapshots != nil {
			return errors.New("counters both as JSON and in counter_blob")
		}
		return readCounterBlob(w.CounterBlob, d)
	}
	return nil
}

// toMicro is a fraction in millionths, rounded down or up.
func toMicro(f float64, up bool) uint64 {
	x := f * micro
	if up {
		x = math.Ceil(x - 1e-6) // a fraction already in millionths stays
	} else {
		x = math.Floor(x + 1e-6)
	}
	if !(x > 0) {
		return 0
	}
	return uint64(x)
}

func fromMicro(n uint64) float64 { return float64(n) / micro }

// appendCounterBlob encodes d's counters' leases and snapshots.
func appendCounterBlob(b []byte, d *Document) []byte {
	index := map[string]int{}
	var regions []string
	region := func(r string) {
		if _, ok := index[r]; !ok {
			index[r] = -1
			regions = append(regions, r)
		}
	}
	keys := make([]string, 0, max(len(d.Counters), len(d.CounterSnapshots)))
	for k, byRegion := range d.Counters {
		keys = append(keys, k)
		for r := range byRegion {
			region(r)
		}
	}
	for k, s := range d.CounterSnapshots {
		if _, ok := d.Counters[k]; !ok {
			keys = append(keys, k)
		}
		for _, m := range s.Marks {
			for r := range m {
				region(r)
			}
		}
		for _, m := range []map[string]uint64{s.Acked} {
			for r := range m {
				region(r)
			}
		}
		for r := range s.AckedExp {
			region(r)
		}
		for r := range s.Floors {
			region(r)
		}
	}
	slices.Sort(regions)
	slices.Sort(keys)
	for i, r := range regions {
		index[r] = i
	}
	issued := d.Issued.UnixMicro()
	b = append(b, blobVersion)
	b = binary.AppendUvarint(b, uint64(len(regions)))
	for _, r := range regions {
		b = appendString(b, r)
	}
	b = binary.AppendUvarint(b, uint64(len(keys)))
	// Each counter's record reads the document alone: thousands are
	// encoded in chunks in parallel (inChunks), joined in key order.
	parts := make([][]byte, chunksOf(len(keys)))
	inChunks(len(keys), func(i, lo, hi int) {
		var part []byte
		for _, k := range keys[lo:hi] {
			part = appendCounterRecord(part, d, k, regions, index, issued)
		}
		parts[i] = part
	})
	for _, part := range parts {
		b = append(b, part...)
	}
	return b
}

// appendCounterRecord appends counter k's record: its leases by region,
// and its snapshot if the document has one.
func appendCounterRecord(b []byte, d *Document, k string, regions []string, index map[string]int, issued int64) []byte {
	b = appendString(b, k)
	byRegion := d.Counters[k]
	b = binary.AppendUvarint(b, maskOf(index, byRegion))
	for _, r := range regions {
		l, ok := byRegion[r]
		if !ok {
			continue
		}
		var flags byte
		if !l.Released.IsZero() {
			flags |= 1
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, toMicro(l.Floor, false))
		b = binary.AppendUvarint(b, toMicro(l.Share, false))
		if flags&1 != 0 {
			b = binary.AppendVarint(b, microsUp(l.Released)-issued)
		}
	}
	s, ok := d.CounterSnapshots[k]
	if !ok {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendUvarint(b, s.Since)
	epochs := make([]int64, 0, len(s.Marks))
	for e := range s.Marks {
		epochs = append(epochs, e)
	}
	slices.Sort(epochs)
	b = binary.AppendUvarint(b, uint64(len(epochs)))
	for _, e := range epochs {
		b = binary.AppendVarint(b, e)
		b = binary.AppendUvarint(b, maskOf(index, s.Marks[e]))
		for _, r := range regions {
			if f, ok := s.Marks[e][r]; ok {
				b = binary.AppendUvarint(b, toMicro(f, true))
			}
		}
	}
	b = binary.AppendUvarint(b, maskOf(index, s.Acked))
	for _, r := range regions {
		if n, ok := s.Acked[r]; ok {
			b = binary.AppendUvarint(b, n)
		}
	}
	b = binary.AppendUvarint(b, maskOf(index, s.AckedExp))
	for _, r := range regions {
		if t, ok := s.AckedExp[r]; ok {
			b = binary.AppendVarint(b, microsUp(t)-issued)
		}
	}
	b = binary.AppendUvarint(b, maskOf(index, s.Floors))
	for _, r := range regions {
		if f, ok := s.Floors[r]; ok {
			b = binary.AppendUvarint(b, toMicro(f, true))
		}
	}
	var flags byte
	if !s.LastDemand.IsZero() {
		flags |= 1
	}
	if !s.Released.IsZero() {
		flags |= 2
	}
	b = append(b, flags)
	if flags&1 != 0 {
		b = binary.AppendVarint(b, microsUp(s.LastDemand)-issued)
	}
	if flags&2 != 0 {
		b = binary.AppendVarint(b, microsUp(s.Released)-issued)
	}
	return b
}

// microsUp is t in µs since the epoch, rounded up: an expiry or a time
// to go back to the rule comes no sooner on the wire.
func microsUp(t time.Time) int64 {
	us := t.UnixMicro()
	if t.Nanosecond()%1000 != 0 {
		us++
	}
	return us
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// maskOf is the mask of the regions m has, by index.
func maskOf[V any](index map[string]int, m map[string]V) uint64 {
	var mask uint64
	for r := range m {
		mask |= 1 << index[r]
	}
	return mask
}

// blobReader reads a counter_blob, refusing what runs past its end or
// past the bounds of a document.
type blobReader struct {
	b   []byte
	err error
}

var errBlob = errors.New("counter_blob")

func (r *blobReader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", errBlob, what)
	}
}

func (r *blobReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *blobReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("truncated")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *blobReader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail("truncated")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *blobReader) string(max int) string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(r.b)) {
		r.fail("a name too long")
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// count reads a count of items, each at least min bytes long, that must
// fit in what is left and in bound.
func (r *blobReader) count(bound, min int) int {
	n := r.uvarint()
	if r.err == nil && (n > uint64(bound) || n*uint64(min) > uint64(len(r.b))) {
		r.fail(fmt.Sprintf("%d items", n))
		return 0
	}
	return int(n)
}

// fraction reads a fraction in millionths, at most 1 (and a hair).
func (r *blobReader) fraction() float64 {
	n := r.uvarint()
	if n > micro+1 {
		r.fail("a fraction above 1")
	}
	return fromMicro(n)
}

// regionsOf returns the names of the regions in a mask.
func (r *blobReader) regionsOf(mask uint64, regions []string) []string {
	if mask>>len(regions) != 0 {
		r.fail("a region mask past the regions named")
		return nil
	}
	var out []string
	for i, name := range regions {
		if mask&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return out
}

// maxKey bounds a counter's key in a blob: a counter key of a valid
// request is far shorter.
const maxKey = 4096

// readCounterBlob decodes a counter_blob into d's Counters and
// CounterSnapshots.
func readCounterBlob(b []byte, d *Document) error {
	if b[0] == blobDeflated {
		var err error
		if b, err = inflateBlob(b); err != nil {
			return err
		}
	}
	r := &blobReader{b: b}
	if v := r.byte(); r.err == nil && v != blobVersion {
		return fmt.Errorf("%w: version %d", errBlob, v)
	}
	regions := make([]string, r.count(maxBlobRegions, 1))
	for i := range regions {
		regions[i] = r.string(maxKey)
		if r.err == nil && (regions[i] == "" || i > 0 && regions[i] <= regions[i-1]) {
			r.fail("regions not named once each, in order")
		}
	}
	issued := d.Issued.UnixMicro()
	at := func(off int64) time.Time { return time.UnixMicro(issued + off).UTC() }
	n := r.count(MaxCounters, 3)
	if r.err != nil {
		return r.err
	}
	d.Counters = make(map[string]map[string]CounterLeaseDoc, n)
	d.CounterSnapshots = make(map[string]CounterSnapshot, n)
	last := ""
	for i := range n {
		key := r.string(maxKey)
		if r.err == nil && i > 0 && key <= last {
			r.fail("counters not named once each, in order")
		}
		last = key
		if leased := r.regionsOf(r.uvarint(), regions); len(leased) > 0 {
			byRegion := make(map[string]CounterLeaseDoc, len(leased))
			for _, reg := range leased {
				flags := r.byte()
				l := CounterLeaseDoc{Floor: r.fraction(), Share: r.fraction()}
				if flags&1 != 0 {
					l.Released = at(r.varint())
				}
				byRegion[reg] = l
			}
			d.Counters[key] = byRegion
		}
		if r.byte() == 0 {
			if r.err != nil {
				return r.err
			}
			continue
		}
		s := CounterSnapshot{Since: r.uvarint()}
		windows := r.count(64, 2)
		s.Marks = make(map[int64]map[string]float64, windows)
		for range windows {
			e := r.varint()
			m := map[string]float64{}
			for _, reg := range r.regionsOf(r.uvarint(), regions) {
				m[reg] = r.fraction()
			}
			s.Marks[e] = m
		}
		s.Acked = map[string]uint64{}
		for _, reg := range r.regionsOf(r.uvarint(), regions) {
			s.Acked[reg] = r.uvarint()
		}
		s.AckedExp = map[string]time.Time{}
		for _, reg := range r.regionsOf(r.uvarint(), regions) {
			s.AckedExp[reg] = at(r.varint())
		}
		s.Floors = map[string]float64{}
		for _, reg := range r.regionsOf(r.uvarint(), regions) {
			s.Floors[reg] = r.fraction()
		}
		flags := r.byte()
		if flags&1 != 0 {
			s.LastDemand = at(r.varint())
		}
		if flags&2 != 0 {
			s.Released = at(r.varint())
		}
		if r.err != nil {
			return r.err
		}
		d.CounterSnapshots[key] = s
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("bytes after the counters")
	}
	return r.err
}
