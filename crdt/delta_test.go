package crdt

import "testing"

// TestDeltaUntil leaves out the entries of later epochs, counting their
// slots, and does not change the delta it was given.
func TestDeltaUntil(t *testing.T) {
	d := Delta{Origin: "us", Entries: []Entry{
		{ID: ID{Key: "a", Epoch: 1}, Slots: []Slot{{Region: "us", P: 1}}},
		{ID: ID{Key: "b", Epoch: 9}, Slots: []Slot{{Region: "eu", P: 1}, {Region: "us", P: 2}}},
		{ID: ID{Key: "c", Epoch: 5}, Slots: []Slot{{Region: "us", P: 3}}},
	}}
	got, dropped := d.Until(5)
	if dropped != 2 || len(got.Entries) != 2 || got.Entries[0].Key != "a" || got.Entries[1].Key != "c" {
		t.Fatalf("Until(5): %+v, %d dropped; want a and c, 2 dropped", got.Entries, dropped)
	}
	if len(d.Entries) != 3 || d.Entries[1].Key != "b" {
		t.Fatalf("the delta given changed: %+v", d.Entries)
	}
	if same, n := d.Until(9); n != 0 || len(same.Entries) != 3 {
		t.Fatalf("Until(9): %d entries, %d dropped", len(same.Entries), n)
	}
	// Keep, which Until is: the first entry dropped too.
	got, dropped = d.Keep(func(e *Entry) bool { return e.Key != "a" })
	if dropped != 1 || len(got.Entries) != 2 || got.Entries[0].Key != "b" || got.Entries[1].Key != "c" || d.Entries[0].Key != "a" {
		t.Fatalf("Keep(not a): %+v, %d dropped; want b and c, 1 dropped, the delta given as it was", got.Entries, dropped)
	}
}
