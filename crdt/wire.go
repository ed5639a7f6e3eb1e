package crdt

import (
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
	// KindDeltaKeyed is a delta whose keys may go by number (see
	// KeyNumbers).
	KindDeltaKeyed MessageKind = 3
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
	case KindDelta, KindDeltaKeyed:
		return k, nil
	default:
		return 0, fmt.Errorf("%w: unknown message kind %d", ErrMalformed, k)
	}
}

// AppendDelta appends the encoding of d to dst. d must be canonical (see
// Delta.Validate); Normalize makes it so.
func AppendDelta(dst []byte, d Delta) ([]byte, error) { return appendDelta(dst, d, nil, false) }

// AppendDeltaKeyed appends the encoding of d to dst as a keyed delta: the
// keys t numbered go by number, each key with a number it did not have
// yet is given one (while t has room) and sent with it, and the others go
// in full. With byNumber false every key goes in full, with its number if
// it has one: what a receiver that may have missed the numbers is sent.
func AppendDeltaKeyed(dst []byte, d Delta, t *KeyNumbers, byNumber bool) ([]byte, error) {
	return appendDelta(dst, d, t, byNumber)
}

func appendDelta(dst []byte, d Delta, t *KeyNumbers, byNumber bool) ([]byte, error) {
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
	kind := KindDelta
	if t != nil {
		kind = KindDeltaKeyed
		t.mu.Lock()
		defer t.mu.Unlock()
	}
	start := len(dst)
	dst = append(dst, 'g', 'q', wireVersion, byte(kind))
	dst = appendString(dst, d.Origin)
	dst = binary.AppendUvarint(dst, d.From)
	dst = binary.AppendUvarint(dst, d.To-d.From)
	dst = binary.AppendUvarint(dst, uint64(len(table)))
	for _, r := range table {
		dst = appendString(dst, r)
	}
	dst = binary.AppendUvarint(dst, uint64(len(d.Entries)))
	var prevKey string // the last key that went in full
	var prevEpoch int64
	keyBytes := 0
	for _, e := range d.Entries {
		full := true
		if t != nil {
			n, known := t.numbers[e.Key]
			if !known && len(t.numbers) < t.max {
				n, known = uint32(len(t.numbers)), true
				t.numbers[e.Key] = n
				t.sent = append(t.sent, false)
			}
			switch {
			case !known:
				dst = binary.AppendUvarint(dst, keyInFull)
			case byNumber && t.sent[n]:
				dst = binary.AppendUvarint(dst, uint64(n)<<2|keyNumbered)
				full = false
			default:
				dst = binary.AppendUvarint(dst, uint64(n)<<2|keyNumbered|keyInFull)
				t.sent[n] = true
			}
		}
		if full {
			shared := commonPrefix(prevKey, e.Key)
			dst = binary.AppendUvarint(dst, uint64(shared))
			dst = appendString(dst, e.Key[shared:])
			keyBytes += len(e.Key)
			prevKey = e.Key
		}
		dst = binary.AppendVarint(dst, int64(uint64(e.Epoch)-uint64(prevEpoch)))
		prevEpoch = e.Epoch
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
	}
	if keyBytes > maxKeyBytes(len(dst)-start) {
		return dst[:start], fmt.Errorf("%w: %d key bytes in a %d-byte message, more than %d times its size", ErrInvalidDelta, keyBytes, len(dst)-start, maxKeyExpansion)
	}
	return dst, nil
}

// A keyed delta's entry starts with a tag: its key's number << 2, and
// these flags.
const (
	keyInFull   = 1 // the key follows, prefix-compressed against the last key in full
	keyNumbered = 2 // the entry's key has the number in the tag
)

// DecodeDelta decodes a delta message. It returns an error wrapping
// ErrMalformed for anything AppendDelta would not have written.
func DecodeDelta(b []byte) (Delta, error) {
	if err := expectKind(b, KindDelta); err != nil {
		return Delta{}, err
	}
	d, _, err := decodeDelta(b, nil)
	if err != nil {
		return Delta{}, err
	}
	return d, nil
}

// DecodeDeltaKeyed decodes a delta message of either kind: a keyed one
// with the numbers of its sender's keys that names holds, and learns the
// numbers it brings (if it decodes). An entry whose key goes by a number
// names does not hold is left out, and counted in unknown: the receiver
// missed the message that numbered it. It returns an error wrapping
// ErrMalformed for anything AppendDeltaKeyed would not have written, or
// that gives a number another key than names holds for it.
func DecodeDeltaKeyed(b []byte, names *KeyNames) (d Delta, unknown int, err error) {
	d, unknown, err = decodeDelta(b, names)
	if err != nil {
		return Delta{}, 0, err
	}
	return d, unknown, nil
}

func decodeDelta(b []byte, names *KeyNames) (Delta, int, error) {
	var d Delta
	kind, err := Kind(b)
	if err != nil {
		return d, 0, err
	}
	keyed := kind == KindDeltaKeyed
	if keyed && names == nil {
		return d, 0, fmt.Errorf("%w: a keyed delta, decoded without its sender's key numbers", ErrMalformed)
	}
	r := reader{b: b, off: headerLen}
	var span uint64
	if d.Origin, err = r.string("origin", 1, MaxRegionNameLen); err != nil {
		return d, 0, err
	}
	if d.From, err = r.uvarint("from"); err != nil {
		return d, 0, err
	}
	if span, err = r.uvarint("to"); err != nil {
		return d, 0, err
	}
	if d.To = d.From + span; d.To < d.From {
		return d, 0, r.errorf("to: %d + %d overflows", d.From, span)
	}
	nregions, err := r.count("regions", MaxRegions, 2)
	if err != nil {
		return d, 0, err
	}
	table := make([]string, nregions)
	for i := range table {
		if table[i], err = r.string("region", 1, MaxRegionNameLen); err != nil {
			return d, 0, err
		}
		if i > 0 && table[i-1] >= table[i] {
			return d, 0, r.errorf("region %d: %q not after %q", i, table[i], table[i-1])
		}
	}
	used := make([]bool, nregions)
	minEntry := 6 // a key's prefix and suffix, an epoch, a slot
	if keyed {
		minEntry = 5 // a number, an epoch, a slot
	}
	nentries, err := r.count("entries", len(b), minEntry)
	if err != nil {
		return d, 0, err
	}
	if nentries > 0 {
		d.Entries = make([]Entry, nentries)
	}
	// An entry's key is keys[keyStart[i]:keyEnds[i]] if it came in full,
	// or named[i] if by number; "" and -1 if by a number not known.
	keyStart, keyEnds := make([]int, nentries), make([]int, nentries)
	named := make([]string, nentries)
	var learned []numberedKey
	keys := make([]byte, 0, nentries*32)
	// Each entry has at most nregions slots, and each slot takes 2 bytes.
	slots := make([]Slot, 0, min(nentries*nregions, (len(b)-r.off)/2))
	prevStart, prevEnd := 0, 0 // the last key in full
	prevEpoch := int64(0)
	// entryKey is entry i's key as far as known: in full (bytes) or by
	// number (a string).
	entryKey := func(i int) (full []byte, byNumber string, ok bool) {
		switch {
		case keyEnds[i] < 0:
			return nil, "", false
		case named[i] != "":
			return nil, named[i], true
		}
		return keys[keyStart[i]:keyEnds[i]], "", true
	}
	unknown := 0
	for i := range d.Entries {
		e := &d.Entries[i]
		full, number, numbered := true, uint64(0), false
		if keyed {
			tag, err := r.uvarint("key tag")
			if err != nil {
				return d, 0, err
			}
			full, numbered, number = tag&keyInFull != 0, tag&keyNumbered != 0, tag>>2
			switch {
			case tag&^3 != 0 && !numbered:
				return d, 0, r.errorf("entry %d: a number without its flag", i)
			case !full && !numbered:
				return d, 0, r.errorf("entry %d: no key", i)
			case numbered && number >= maxKeyNumber:
				return d, 0, r.errorf("entry %d: key number %d, at most %d", i, number, maxKeyNumber-1)
			}
		}
		if full {
			last := keys[prevStart:prevEnd]
			shared, err := r.uvarint("shared prefix")
			if err != nil {
				return d, 0, err
			}
			if shared > uint64(len(last)) {
				return d, 0, r.errorf("entry %d: shared prefix %d longer than the previous key (%d)", i, shared, len(last))
			}
			suffix, err := r.bytes("key suffix", 0, MaxKeyLen)
			if err != nil {
				return d, 0, err
			}
			keyLen := int(shared) + len(suffix)
			switch {
			case keyLen == 0 || keyLen > MaxKeyLen:
				return d, 0, r.errorf("entry %d: key length %d not in 1..%d", i, keyLen, MaxKeyLen)
			case len(keys)+keyLen > maxKeyBytes(len(b)):
				return d, 0, r.errorf("entry %d: keys expand to more than %d times the message size", i, maxKeyExpansion)
			case len(suffix) > 0 && int(shared) < len(last) && suffix[0] == last[shared]:
				return d, 0, r.errorf("entry %d: shared prefix %d is not the longest", i, shared)
			}
			start := len(keys)
			keys = append(keys, keys[prevStart:prevStart+int(shared)]...)
			keys = append(keys, suffix...)
			keyStart[i], keyEnds[i] = start, len(keys)
			prevStart, prevEnd = start, len(keys)
			if numbered {
				learned = append(learned, numberedKey{uint32(number), i})
			}
		} else if named[i] = names.keys[uint32(number)]; named[i] == "" {
			keyEnds[i] = -1
		}
		epochDelta, err := r.varint("epoch")
		if err != nil {
			return d, 0, err
		}
		e.Epoch = int64(uint64(prevEpoch) + uint64(epochDelta))
		if i > 0 {
			pf, pn, pok := entryKey(i - 1)
			cf, cn, cok := entryKey(i)
			if pok && cok {
				var c int
				switch {
				case cn == "" && pn == "":
					c = compareKeyEpoch(cf, e.Epoch, pf, prevEpoch)
				case cn == "":
					c = compareKeyEpoch(cf, e.Epoch, pn, prevEpoch)
				case pn == "":
					c = compareKeyEpoch(cn, e.Epoch, pf, prevEpoch)
				default:
					c = compareKeyEpoch(cn, e.Epoch, pn, prevEpoch)
				}
				if c <= 0 {
					return d, 0, r.errorf("entry %d: not after the entry before", i)
				}
			}
		}
		prevEpoch = e.Epoch
		nslots, err := r.count("slots", nregions, 2)
		if err != nil {
			return d, 0, err
		}
		if nslots == 0 {
			return d, 0, r.errorf("entry %d: no slots", i)
		}
		first := len(slots)
		last := -1
		for range nslots {
			tag, err := r.uvarint("slot region")
			if err != nil {
				return d, 0, err
			}
			ri := tag >> 1
			if ri >= uint64(nregions) || int(ri) <= last {
				return d, 0, r.errorf("entry %d: slot region index %d out of order or range", i, ri)
			}
			last = int(ri)
			used[ri] = true
			s := Slot{Region: table[ri]}
			if s.P, err = r.uvarint("slot p"); err != nil {
				return d, 0, err
			}
			if tag&1 != 0 {
				if s.N, err = r.uvarint("slot n"); err != nil {
					return d, 0, err
				}
				if s.N == 0 {
					return d, 0, r.errorf("entry %d: slot %q flagged with decrements but has none", i, s.Region)
				}
			} else if s.P == 0 {
				return d, 0, r.errorf("entry %d: slot %q is zero", i, s.Region)
			}
			slots = append(slots, s)
		}
		e.Slots = slots[first:len(slots):len(slots)]
	}
	if r.off != len(b) {
		return d, 0, r.errorf("%d trailing bytes", len(b)-r.off)
	}
	if i := slices.Index(used, false); i >= 0 {
		return d, 0, r.errorf("region %q listed but unused", table[i])
	}
	// One string for all keys that came in full; each such entry's key is a
	// slice of it.
	all := string(keys)
	out := d.Entries[:0]
	for i := range d.Entries {
		e := d.Entries[i]
		switch {
		case keyEnds[i] < 0:
			unknown++
			continue
		case named[i] != "":
			e.Key = named[i]
		default:
			e.Key = all[keyStart[i]:keyEnds[i]]
		}
		out = append(out, e)
	}
	for _, l := range learned {
		key := all[keyStart[l.entry]:keyEnds[l.entry]]
		if had := names.keys[l.number]; had != "" && had != key {
			return Delta{}, 0, fmt.Errorf("%w: key number %d names %q, and %q before", ErrMalformed, l.number, key, had)
		}
	}
	for _, l := range learned {
		names.learn(l.number, all[keyStart[l.entry]:keyEnds[l.entry]])
	}
	if len(out) == 0 {
		out = nil
	}
	d.Entries = out
	return d, unknown, nil
}

type numberedKey struct {
	number uint32
	entry  int
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

func compareKeyEpoch[K, P ~string | ~[]byte](key K, epoch int64, prevKey P, prevEpoch int64) int {
	for i := range min(len(key), len(prevKey)) {
		if key[i] != prevKey[i] {
			return cmp.Compare(key[i], prevKey[i])
		}
	}
	if c := cmp.Compare(len(key), len(prevKey)); c != 0 {
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
