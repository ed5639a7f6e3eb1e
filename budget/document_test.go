package budget

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// TestDocumentRoundTrip: a rebalance's leases and the allocator's snapshot
// survive the JSON a budget document travels in, and a document with an
// impossible lease, or none of a rule, is refused.
func TestDocumentRoundTrip(t *testing.T) {
	a, err := NewAllocator(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a.Report("g", Report{Region: "eu", Demand: 2})
	leases, err := a.Rebalance(now, Rule{ID: "g", Window: time.Minute}, []string{"eu", "us"})
	if err != nil {
		t.Fatal(err)
	}
	doc := NewDocument("gs", leases)
	doc.SetSnapshot(a.Snapshot("g"))
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeDocument(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range got.All() {
		if l != leases[i] && !(l.Issued.Equal(leases[i].Issued) && l.Expires.Equal(leases[i].Expires)) {
			t.Errorf("lease %d: %+v, want %+v", i, l, leases[i])
		}
	}
	if m, want := got.Snapshot().Marks, a.Snapshot("g").Marks; len(m) == 0 || !reflect.DeepEqual(m, want) {
		t.Errorf("marks %v, want %v", m, want)
	}
	// A leader that restores from it numbers its leases after them.
	b2, _ := NewAllocator(DefaultConfig())
	b2.RestoreHistory([]Document{got})
	if b2.Seq("g") != doc.Seq {
		t.Errorf("restored seq %d, want %d", b2.Seq("g"), doc.Seq)
	}
	for _, bad := range []string{`{"seq":1}`, `{"rule":"g"}`, `{"rule":"g","seq":1,"leases":{"eu":{"floor":0.5,"share":0.6}}}`, `not json`} {
		if _, err := DecodeDocument([]byte(bad)); !errors.Is(err, ErrInvalidDocument) {
			t.Errorf("DecodeDocument(%s): %v, want ErrInvalidDocument", bad, err)
		}
	}
}

// FuzzDecodeDocument feeds arbitrary bytes to the budget document decoder
// (what a region reads from NATS): it never panics, and a document it
// accepts names a rule and a sequence number and holds leases in range.
func FuzzDecodeDocument(f *testing.F) {
	d := NewDocument("gs", []Lease{{Rule: "g", Region: "us", Floor: 0.05, Share: 0.4, Seq: 3, Expires: time.Unix(1_800_000_000, 0)}})
	b, _ := json.Marshal(d)
	f.Add(b)
	f.Add([]byte(`{"rule":"g","seq":1,"leases":{"us":{"floor":0.5,"share":0.6}}}`))
	f.Add([]byte(`{"rule":"g","seq":1,"counters":{"k":{"us":{"floor":0.1,"share":0.2}}}}`))
	f.Add([]byte(`{}`))
	cd, _ := countersDocument(f, 3)
	b, _ = json.Marshal(cd)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDocument(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidDocument) {
				t.Fatalf("error %v is not ErrInvalidDocument", err)
			}
			return
		}
		if d.Rule == "" || d.Seq == 0 {
			t.Fatalf("accepted a document without rule or seq: %+v", d)
		}
		for r, l := range d.Leases {
			if l.Floor < 0 || l.Share < 0 || l.Floor+l.Share > 1+1e-9 {
				t.Fatalf("accepted a lease of %s out of range: %+v", r, l)
			}
		}
		for k, byRegion := range d.Counters {
			sum := 0.0
			for _, l := range byRegion {
				sum += l.Floor + l.Share
			}
			if sum > 1+1e-6 {
				t.Fatalf("accepted counter %q's leases summing to %v", k, sum)
			}
		}
	})
}
