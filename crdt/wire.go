package crdt

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
)

// The wire encoding. Every message starts with a four-byte header: the magic
// "gq", the format version and the message kind. Integers are unsigned
// LEB128 varints in their shortest form; signed ones are zigzag-encoded.
// Strings are a length and the bytes.
//
// A delta message:
//
//	origin string         at least one byte
//	from uvarint, to-from uvarint
//	regions: count uvarint, then region names as strings, strictly increasing
//	entries: count uvarint, then per entry, in ID order:
//	  shared uvarint      length of the prefix shared with the previous key
//	  suffix string       the rest of the key
//	  epoch varint        difference from the previous entry's epoch
//	  slots: count uvarint (at least 1), then per slot, regions increasing:
//	    region<<1 | hasN  uvarint, region an index into the region table
//	    p uvarint
//	    n uvarint         only if hasN
//
// Keys sorted and sharing prefixes cost a few bytes each; a region name is
// sent once per message; a slot with no decrements costs its P alone.
//
// The encoding is canonical: one value has one encoding, and the decoder
// rejects every other byte string. Decoding therefore round-trips exactly,
// and two equal messages are equal bytes.

// MessageKind says what a message holds.
type MessageKind byte

// Message kinds.
const (
	KindDelta MessageKind = 1
)

const (
	wireVersion = 1
	headerLen   = 4
	// A message's keys may expand to at most this many times its size, so a
	// small message cannot make the receiver allocate gigabytes.
	maxKeyExpansion = 64
)

// Kind returns the kind of the message in b, checking its header.
func Kind(b []byte) (MessageKind, error) {
	if len(b) < headerLen {
		return 0, fmt.Errorf("%w: %d bytes, shorter than the header", ErrMalformed, len(b))
	}
	if b[0] != 'g' || b[1] != 'q' {
		return 0, fmt.Errorf("%w: bad magic %q", ErrMalformed, b[:2])
	}
	if b[2] != wireVersion {
		return 0, fmt.Errorf("%w: format version %d, want %d", ErrMalformed, b[2], wireVersion)
	}
	switch k := MessageKind(b[3]); k {
	case KindDelta:
		return k, nil
	default:
		return 0, fmt.Errorf("%w: unknown message kind %d", ErrMalformed, k)
	}
}

// AppendDelta appends the encoding of d to dst. d must be canonical (see
// Delta.Validate); Normalize makes it so.
func AppendDelta(dst []byte, d Delta) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return dst, err
	}
	var table []string // the regions named, sorted
	for _, e := range d.Entries {
		for _, s := range e.Slots {
			if i, found := slices.BinarySearch(table, s.Region); !found {
				table = slices.Insert(table, i, s.Region)
			}
		}
	}
	if len(table) > MaxRegions {
		return dst, fmt.Errorf("%w: %d regions, at most %d", ErrInvalidDelta, len(table), MaxRegions)
	}
	start := len(dst)
	dst = append(dst, 'g', 'q', wireVersion, byte(KindDelta))
	dst = appendString(dst, d.Origin)
	dst = binary.AppendUvarint(dst, d.From)
	dst = binary.AppendUvarint(dst, d.To-d.From)
	dst = binary.AppendUvarint(dst, uint64(len(table)))
	for _, r := range table {
		dst = appendString(dst, r)
	}
	dst = binary.AppendUvarint(dst, uint64(len(d.Entries)))
	var prev ID
	keyBytes := 0
	for _, e := range d.Entries {
		shared := commonPrefix(prev.Key, e.Key)
		dst = binary.AppendUvarint(dst, uint64(shared))
		dst = appendString(dst, e.Key[shared:])
		dst = binary.AppendVarint(dst, int64(uint64(e.Epoch)-uint64(prev.Epoch)))
		dst = binary.AppendUvarint(dst, uint64(len(e.Slots)))
		for _, s := range e.Slots {
			r, _ := slices.BinarySearch(table, s.Region)
			tag := uint64(r) << 1
			if s.N != 0 {
				tag |= 1
			}
			dst = binary.AppendUvarint(dst, tag)
			dst = binary.AppendUvarint(dst, s.P)
			if s.N != 0 {
				dst = binary.AppendUvarint(dst, s.N)
			}
		}
		keyBytes += len(e.Key)
		prev = e.ID
	}
	if keyBytes > maxKeyBytes(len(dst)-start) {
		return dst[:start], fmt.Errorf("%w: %d key bytes in a %d-byte message, more than %d times its size", ErrInvalidDelta, keyBytes, len(dst)-start, maxKeyExpansion)
	}
	return dst, nil
}

// DecodeDelta decodes a delta message. It returns an error wrapping
// ErrMalformed for anything AppendDelta would not have written.
func DecodeDelta(b []byte) (Delta, error) {
	d, err := decodeDelta(b)
	if err != nil {
		return Delta{}, err
	}
	return d, nil
}

func decodeDelta(b []byte) (Delta, error) {
	var d Delta
	if err := expectKind(b, KindDelta); err != nil {
		return d, err
	}
	r := reader{b: b, off: headerLen}
	var span uint64
	var err error
	if d.Origin, err = r.string("origin", 1, MaxRegionNameLen); err != nil {
		return d, err
	}
	if d.From, err = r.uvarint("from"); err != nil {
		return d, err
	}
	if span, err = r.uvarint("to"); err != nil {
		return d, err
	}
	if d.To = d.From + span; d.To < d.From {
		return d, r.errorf("to: %d + %d overflows", d.From, span)
	}
	nregions, err := r.count("regions", MaxRegions, 2)
	if err != nil {
		return d, err
	}
	table := make([]string, nregions)
	for i := range table {
		if table[i], err = r.string("region", 1, MaxRegionNameLen); err != nil {
			return d, err
		}
		if i > 0 && table[i-1] >= table[i] {
			return d, r.errorf("region %d: %q not after %q", i, table[i], table[i-1])
		}
	}
	used := make([]bool, nregions)
	nentries, err := r.count("entries", len(b), 6)
	if err != nil {
		return d, err
	}
	if nentries > 0 {
		d.Entries = make([]Entry, nentries)
	}
	keyEnds := make([]int, nentries)
	keys := make([]byte, 0, nentries*32)
	// Each entry has at most nregions slots, and each slot takes 2 bytes.
	slots := make([]Slot, 0, min(nentries*nregions, (len(b)-r.off)/2))
	prevStart, prevEpoch := 0, int64(0)
	for i := range d.Entries {
		e := &d.Entries[i]
		prevKey := keys[prevStart:]
		shared, err := r.uvarint("shared prefix")
		if err != nil {
			return d, err
		}
		if shared > uint64(len(prevKey)) {
			return d, r.errorf("entry %d: shared prefix %d longer than the previous key (%d)", i, shared, len(prevKey))
		}
		suffix, err := r.bytes("key suffix", 0, MaxKeyLen)
		if err != nil {
			return d, err
		}
		keyLen := int(shared) + len(suffix)
		switch {
		case keyLen == 0 || keyLen > MaxKeyLen:
			return d, r.errorf("entry %d: key length %d not in 1..%d", i, keyLen, MaxKeyLen)
		case len(keys)+keyLen > maxKeyBytes(len(b)):
			return d, r.errorf("entry %d: keys expand to more than %d times the message size", i, maxKeyExpansion)
		case len(suffix) > 0 && int(shared) < len(prevKey) && suffix[0] == prevKey[shared]:
			return d, r.errorf("entry %d: shared prefix %d is not the longest", i, shared)
		}
		start := len(keys)
		keys = append(keys, keys[prevStart:prevStart+int(shared)]...)
		keys = append(keys, suffix...)
		keyEnds[i] = len(keys)
		epochDelta, err := r.varint("epoch")
		if err != nil {
			return d, err
		}
		e.Epoch = int64(uint64(prevEpoch) + uint64(epochDelta))
		if i > 0 {
			if c := compareKeyEpoch(keys[start:], e.Epoch, keys[prevStart:start], prevEpoch); c <= 0 {
				return d, r.errorf("entry %d: not after the entry before", i)
			}
		}
		prevStart, prevEpoch = start, e.Epoch
		nslots, err := r.count("slots", nregions, 2)
		if err != nil {
			return d, err
		}
		if nslots == 0 {
			return d, r.errorf("entry %d: no slots", i)
		}
		first := len(slots)
		last := -1
		for range nslots {
			tag, err := r.uvarint("slot region")
			if err != nil {
				return d, err
			}
			ri := tag >> 1
			if ri >= uint64(nregions) || int(ri) <= last {
				return d, r.errorf("entry %d: slot region index %d out of order or range", i, ri)
			}
			last = int(ri)
			used[ri] = true
			s := Slot{Region: table[ri]}
			if s.P, err = r.uvarint("slot p"); err != nil {
				return d, err
			}
			if tag&1 != 0 {
				if s.N, err = r.uvarint("slot n"); err != nil {
					return d, err
				}
				if s.N == 0 {
					return d, r.errorf("entry %d: slot %q flagged with decrements but has none", i, s.Region)
				}
			} else if s.P == 0 {
				return d, r.errorf("entry %d: slot %q is zero", i, s.Region)
			}
			slots = append(slots, s)
		}
		e.Slots = slots[first:len(slots):len(slots)]
	}
	if r.off != len(b) {
		return d, r.errorf("%d trailing bytes", len(b)-r.off)
	}
	if i := slices.Index(used, false); i >= 0 {
		return d, r.errorf("region %q listed but unused", table[i])
	}
	// One string for all keys; each entry's key is a slice of it.
	all, start := string(keys), 0
	for i := range d.Entries {
		d.Entries[i].Key = all[start:keyEnds[i]]
		start = keyEnds[i]
	}
	return d, nil
}

func expectKind(b []byte, want MessageKind) error {
	k, err := Kind(b)
	if err != nil {
		return err
	}
	if k != want {
		return fmt.Errorf("%w: message kind %d, want %d", ErrMalformed, k, want)
	}
	return nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func compareKeyEpoch(key []byte, epoch int64, prevKey []byte, prevEpoch int64) int {
	if c := bytes.Compare(key, prevKey); c != 0 {
		return c
	}
	return cmp.Compare(epoch, prevEpoch)
}

func maxKeyBytes(messageLen int) int { return maxKeyExpansion*messageLen + MaxKeyLen }

// reader decodes the fields of a message, rejecting non-canonical varints.
type reader struct {
	b   []byte
	off int
}

func (r *reader) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrMalformed, r.off, fmt.Sprintf(format, args...))
}

func (r *reader) uvarint(field string) (uint64, error) {
	v, n := binary.Uvarint(r.b[r.off:])
	switch {
	case n == 0:
		return 0, r.errorf("%s: truncated", field)
	case n < 0:
		return 0, r.errorf("%s: varint overflows 64 bits", field)
	case n > 1 && r.b[r.off+n-1] == 0:
		return 0, r.errorf("%s: varint not in shortest form", field)
	}
	r.off += n
	return v, nil
}

func (r *reader) varint(field string) (int64, error) {
	u, err := r.uvarint(field)
	return int64(u>>1) ^ -int64(u&1), err
}

// count reads a count of items that each take at least minBytes, so that a
// count larger than the rest of the message can be refused before allocating.
func (r *reader) count(field string, limit, minBytes int) (int, error) {
	n, err := r.uvarint(field)
	if err != nil {
		return 0, err
	}
	if n > uint64(limit) || n > uint64((len(r.b)-r.off)/minBytes) {
		return 0, r.errorf("%s: count %d too large", field, n)
	}
	return int(n), nil
}

func (r *reader) bytes(field string, minLen, maxLen int) ([]byte, error) {
	n, err := r.uvarint(field)
	if err != nil {
		return nil, err
	}
	if n < uint64(minLen) || n > uint64(maxLen) {
		return nil, r.errorf("%s: length %d not in %d..%d", field, n, minLen, maxLen)
	}
	if n > uint64(len(r.b)-r.off) {
		return nil, r.errorf("%s: truncated", field)
	}
	v := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return v, nil
}

func (r *reader) string(field string, minLen, maxLen int) (string, error) {
	v, err := r.bytes(field, minLen, maxLen)
	return string(v), err
}
