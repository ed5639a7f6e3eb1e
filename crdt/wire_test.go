package crdt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestDeltaRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := genDelta(true).Draw(t, "delta")
		d.Normalize()
		msg, err := AppendDelta(nil, d)
		if err != nil {
			t.Fatalf("AppendDelta(normalized): %v", err)
		}
		if k, err := Kind(msg); err != nil || k != KindDelta {
			t.Fatalf("Kind = %v, %v", k, err)
		}
		got, err := DecodeDelta(msg)
		if err != nil {
			t.Fatalf("DecodeDelta: %v", err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, d)
		}
		again, err := AppendDelta([]byte("prefix"), got)
		if err != nil || !bytes.Equal(again[len("prefix"):], msg) {
			t.Fatalf("re-encoding differs (%v)", err)
		}
	})
}

func TestAppendDeltaRefusesNonCanonical(t *testing.T) {
	slot := []Slot{{Region: "us-east", P: 1}}
	for name, d := range map[string]Delta{
		"unsorted entries": {Origin: "o", Entries: []Entry{{ID: ID{Key: "b"}, Slots: slot}, {ID: ID{Key: "a"}, Slots: slot}}},
		"duplicate entry":  {Origin: "o", Entries: []Entry{{ID: ID{Key: "a"}, Slots: slot}, {ID: ID{Key: "a"}, Slots: slot}}},
		"empty key":        {Origin: "o", Entries: []Entry{{ID: ID{Key: ""}, Slots: slot}}},
		"key too long":     {Origin: "o", Entries: []Entry{{ID: ID{Key: strings.Repeat("k", MaxKeyLen+1)}, Slots: slot}}},
		"no slots":         {Origin: "o", Entries: []Entry{{ID: ID{Key: "a"}}}},
		"zero slot":        {Origin: "o", Entries: []Entry{{ID: ID{Key: "a"}, Slots: []Slot{{Region: "us-east"}}}}},
		"unsorted slots":   {Origin: "o", Entries: []Entry{{ID: ID{Key: "a"}, Slots: []Slot{{Region: "us-east", P: 1}, {Region: "eu-west", P: 1}}}}},
		"empty region":     {Origin: "o", Entries: []Entry{{ID: ID{Key: "a"}, Slots: []Slot{{Region: "", P: 1}}}}},
		"from after to":    {Origin: "o", From: 2, To: 1},
		"no origin":        {Entries: []Entry{{ID: ID{Key: "a"}, Slots: slot}}},
		"origin too long":  {Origin: strings.Repeat("r", MaxRegionNameLen+1)},
	} {
		if _, err := AppendDelta(nil, d); !errors.Is(err, ErrInvalidDelta) {
			t.Errorf("%s: AppendDelta = %v, want ErrInvalidDelta", name, err)
		}
	}
}

func TestAppendDeltaRefusesKeyBomb(t *testing.T) {
	// Thousands of long keys that differ in their last byte would expand far
	// beyond the message; the encoder refuses what the decoder would.
	d := Delta{Origin: "o"}
	long := strings.Repeat("k", MaxKeyLen-2)
	for i := range 4000 {
		d.Entries = append(d.Entries, Entry{ID: ID{Key: long + string(rune('a'+i/26%26)) + string(rune('a'+i%26))}, Slots: []Slot{{Region: "r", P: 1}}})
	}
	d.Normalize()
	if _, err := AppendDelta(nil, d); !errors.Is(err, ErrInvalidDelta) {
		t.Fatalf("AppendDelta = %v, want ErrInvalidDelta", err)
	}
}

func validDelta(t testing.TB) []byte {
	t.Helper()
	d := Delta{Origin: "us-east", From: 3, To: 9, Entries: []Entry{
		{ID: ID{Key: "tenant/sk_1", Epoch: 60_000}, Slots: []Slot{{Region: "eu-west", P: 5}, {Region: "us-east", P: 300, N: 2}}},
		{ID: ID{Key: "tenant/sk_2", Epoch: 60_000}, Slots: []Slot{{Region: "us-east", P: 1}}},
	}}
	msg, err := AppendDelta(nil, d)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestDecodeRejectsMalformed(t *testing.T) {
	msg := validDelta(t)
	// Every truncation fails cleanly.
	for n := range len(msg) {
		if _, err := DecodeDelta(msg[:n]); !errors.Is(err, ErrMalformed) {
			t.Fatalf("DecodeDelta(first %d of %d bytes) = %v, want ErrMalformed", n, len(msg), err)
		}
	}
	// Every single-byte change is either refused or decodes to a message
	// that encodes back to exactly those bytes.
	for i := range msg {
		for _, b := range []byte{0x00, 0x01, 0x7f, 0x80, 0xff, msg[i] ^ 0x01} {
			bad := bytes.Clone(msg)
			bad[i] = b
			checkDecode(t, bad)
		}
	}

	header := []byte{'g', 'q', wireVersion, byte(KindDelta)}
	uv := func(v uint64) []byte { return binary.AppendUvarint(nil, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	str := func(s string) []byte { return cat(uv(uint64(len(s))), []byte(s)) }
	entry := func(shared uint64, suffix string, epoch int64, slots ...[]byte) []byte {
		return cat(uv(shared), str(suffix), binary.AppendVarint(nil, epoch), uv(uint64(len(slots))), cat(slots...))
	}
	slotP := func(region, p uint64) []byte { return cat(uv(region<<1), uv(p)) }
	oneRegion := cat(str("o"), uv(0), uv(0), uv(1), str("r"))
	for name, b := range map[string][]byte{
		"bad magic":           {'x', 'q', wireVersion, byte(KindDelta)},
		"future version":      {'g', 'q', wireVersion + 1, byte(KindDelta)},
		"unknown kind":        {'g', 'q', wireVersion, 9},
		"former digest kind":  {'g', 'q', wireVersion, 2},
		"overlong varint":     cat(header, str("o"), []byte{0x80, 0x00}, uv(0), uv(0), uv(0)),
		"trailing bytes":      cat(header, str("o"), uv(0), uv(0), uv(0), uv(0), []byte{0}),
		"unsorted regions":    cat(header, str("o"), uv(0), uv(0), uv(2), str("b"), str("a"), uv(0)),
		"unused region":       cat(header, oneRegion, uv(0)),
		"region out of range": cat(header, oneRegion, uv(1), entry(0, "k", 0, slotP(1, 1))),
		"zero slot":           cat(header, oneRegion, uv(1), entry(0, "k", 0, slotP(0, 0))),
		"no slots":            cat(header, oneRegion, uv(1), entry(0, "k", 0)),
		"empty first key":     cat(header, oneRegion, uv(1), entry(0, "", 0, slotP(0, 1))),
		"no origin":           cat(header, str(""), uv(0), uv(0), uv(0), uv(0)),
		"entries out of order": cat(header, oneRegion, uv(2),
			entry(0, "b", 0, slotP(0, 1)), entry(0, "a", 0, slotP(0, 1))),
		"same entry twice": cat(header, oneRegion, uv(2),
			entry(0, "a", 5, slotP(0, 1)), entry(1, "", 0, slotP(0, 1))),
		"shared prefix too long": cat(header, oneRegion, uv(2),
			entry(0, "ab", 0, slotP(0, 1)), entry(3, "c", 0, slotP(0, 1))),
		"shared prefix not longest": cat(header, oneRegion, uv(2),
			entry(0, "ab", 0, slotP(0, 1)), entry(0, "ac", 0, slotP(0, 1))),
		"huge entry count": cat(header, oneRegion, uv(1<<40)),
	} {
		if _, err := DecodeDelta(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeDelta = %v, want ErrMalformed", name, err)
		}
	}
	// The hand-built pieces do make a valid message when put together right,
	// so the cases above fail for the reason their names give.
	good := cat(header, oneRegion, uv(2), entry(0, "ab", 0, slotP(0, 1)), entry(1, "c", 0, slotP(0, 1)))
	if d, err := DecodeDelta(good); err != nil || d.Entries[1].Key != "ac" {
		t.Fatalf("control message: %+v, %v", d, err)
	}
}

// checkDecode is the decoder's contract for arbitrary bytes: no panic; an
// error wrapping ErrMalformed, or a value that encodes back to the same bytes.
func checkDecode(t testing.TB, b []byte) {
	t.Helper()
	if d, err := DecodeDelta(b); err == nil {
		again, err := AppendDelta(nil, d)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded delta %x does not re-encode to itself: %x, %v", b, again, err)
		}
	} else if !errors.Is(err, ErrMalformed) {
		t.Fatalf("DecodeDelta error %v does not wrap ErrMalformed", err)
	}
}

// FuzzDecode feeds arbitrary bytes to the decoder. go test runs the seeds;
// make fuzz runs the fuzzer.
func FuzzDecode(f *testing.F) {
	f.Add(validDelta(f))
	c := newTestCounters(f, "us-east")
	for i := range 50 {
		c.Inc(ID{Key: "tenant/sk_" + strings.Repeat("x", i%7), Epoch: int64(i % 3)}, uint64(i)+1)
	}
	c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: ID{Key: "a"}, Slots: []Slot{{Region: "eu-west", P: 1 << 40, N: 3}}}}})
	full, _ := AppendDelta(nil, c.DeltaSince(0))
	f.Add(full)
	f.Add([]byte{})
	f.Add([]byte("gq"))
	f.Add([]byte{'g', 'q', wireVersion, byte(KindDelta), 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) { checkDecode(t, b) })
}
