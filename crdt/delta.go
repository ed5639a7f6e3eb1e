package crdt

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// ID names one counter: a counter key and a window epoch. The epoch is
// opaque to this package; by convention it is the window's start in Unix
// milliseconds, so that every region derives the same epoch for a window.
type ID struct {
	Key   string
	Epoch int64
}

// Compare orders IDs by key, then epoch: the order of a Delta's entries.
func (id ID) Compare(o ID) int {
	if c := strings.Compare(id.Key, o.Key); c != 0 {
		return c
	}
	return cmp.Compare(id.Epoch, o.Epoch)
}

// Slot is one region's part of a counter: the total it counted up (P) and
// down (N). Both only grow.
type Slot struct {
	Region string
	P, N   uint64
}

// Entry is the state of some or all slots of one counter.
type Entry struct {
	ID
	Slots []Slot
}

// Delta is a batch of counter states: what changed at Origin (the region
// that sends it; every delta names one) between its versions From
// (exclusive) and To (inclusive), or, with From 0, a full state. Merging a delta is idempotent, so one delivered twice, out of
// order, or after a later full state does no harm.
//
// A Delta is canonical when its entries are in ID order with unique IDs and
// each entry's slots are in region order with unique regions and no
// all-zero slot. Counters produces canonical deltas; Normalize makes
// any delta canonical; the wire encoding accepts only canonical deltas.
type Delta struct {
	Origin   string
	From, To uint64
	Entries  []Entry
}

// Until returns d without the entries whose epoch is after last, and the
// number of slots left out; d is not changed (its entries are copied only
// if some are left out).
func (d Delta) Until(last int64) (Delta, int) {
	return d.Keep(func(e *Entry) bool { return e.Epoch <= last })
}

// Keep returns d with only the entries keep accepts, and the number of
// slots dropped. d's entries are not changed; they are copied only if
// some are dropped.
func (d Delta) Keep(keep func(*Entry) bool) (Delta, int) {
	dropped, kept := 0, []Entry(nil)
	for i := range d.Entries {
		e := &d.Entries[i]
		if keep(e) {
			if kept != nil {
				kept = append(kept, *e)
			}
			continue
		}
		if kept == nil {
			kept = make([]Entry, i, len(d.Entries))
			copy(kept, d.Entries[:i])
		}
		dropped += len(e.Slots)
	}
	if kept != nil {
		d.Entries = kept
	}
	return d, dropped
}

// Slots returns the number of slots in d: the number of (key, epoch, region)
// changes it carries.
func (d *Delta) Slots() int {
	n := 0
	for _, e := range d.Entries {
		n += len(e.Slots)
	}
	return n
}

// Merge joins o into d: entries and slots of both, each slot at the maximum
// of the two. Both must come from the same origin and cover version ranges
// that overlap or touch, so that the result's range says truly what it
// covers; otherwise Merge returns an error wrapping ErrInvalidDelta and
// leaves d as it was. A zero Delta takes o whole. Merging the result into a
// Counters has the same effect as merging d and o one after the other.
// The result is canonical; like Normalize, Merge reorders d.Entries in place.
func (d *Delta) Merge(o Delta) error {
	if d.Origin == "" && d.From == 0 && d.To == 0 && len(d.Entries) == 0 {
		d.Origin, d.From, d.To = o.Origin, o.From, o.To
	} else {
		if d.Origin != o.Origin {
			return fmt.Errorf("%w: merging deltas from %q and %q", ErrInvalidDelta, d.Origin, o.Origin)
		}
		if o.From > d.To || d.From > o.To {
			return fmt.Errorf("%w: versions (%d, %d] and (%d, %d] leave a gap", ErrInvalidDelta, d.From, d.To, o.From, o.To)
		}
		d.From, d.To = min(d.From, o.From), max(d.To, o.To)
	}
	d.Entries = append(d.Entries, o.Entries...)
	d.Normalize()
	return nil
}

// Normalize makes d canonical: entries sorted by ID with duplicates joined,
// slots sorted by region with duplicates joined (per-field maximum), all-zero
// slots and empty entries dropped. It reorders d.Entries in place, so a copy
// of d that shares them sees the change; it does not modify the Slots slices
// of the entries it was given, and the result owns fresh ones.
func (d *Delta) Normalize() {
	slices.SortStableFunc(d.Entries, func(a, b Entry) int { return a.ID.Compare(b.ID) })
	out := d.Entries[:0]
	for i := 0; i < len(d.Entries); {
		j := i + 1
		for j < len(d.Entries) && d.Entries[j].ID == d.Entries[i].ID {
			j++
		}
		var slots []Slot
		for _, e := range d.Entries[i:j] {
			slots = append(slots, e.Slots...)
		}
		if slots = joinSlots(slots); len(slots) > 0 {
			out = append(out, Entry{ID: d.Entries[i].ID, Slots: slots})
		}
		i = j
	}
	clear(d.Entries[len(out):])
	if len(out) == 0 {
		out = nil // one form for "no entries", as the decoder gives
	}
	d.Entries = out
}

// joinSlots sorts slots by region, joins duplicates and drops zero slots, in place.
func joinSlots(slots []Slot) []Slot {
	slices.SortFunc(slots, func(a, b Slot) int { return strings.Compare(a.Region, b.Region) })
	out := slots[:0]
	for _, s := range slots {
		if s.P == 0 && s.N == 0 {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Region == s.Region {
			out[n-1].P = max(out[n-1].P, s.P)
			out[n-1].N = max(out[n-1].N, s.N)
			continue
		}
		out = append(out, s)
	}
	return out
}

// Validate reports why d is not canonical or exceeds the wire limits, or nil.
func (d *Delta) Validate() error {
	if d.Origin == "" || len(d.Origin) > MaxRegionNameLen {
		return fmt.Errorf("%w: origin %q: length must be 1..%d", ErrInvalidDelta, d.Origin, MaxRegionNameLen)
	}
	if d.From > d.To {
		return fmt.Errorf("%w: from %d after to %d", ErrInvalidDelta, d.From, d.To)
	}
	for i, e := range d.Entries {
		if len(e.Key) == 0 || len(e.Key) > MaxKeyLen {
			return fmt.Errorf("%w: entry %d: key length %d not in 1..%d", ErrInvalidDelta, i, len(e.Key), MaxKeyLen)
		}
		if i > 0 && d.Entries[i-1].ID.Compare(e.ID) >= 0 {
			return fmt.Errorf("%w: entry %d (%q, %d) not after the one before", ErrInvalidDelta, i, e.Key, e.Epoch)
		}
		if len(e.Slots) == 0 {
			return fmt.Errorf("%w: entry %d (%q, %d) has no slots", ErrInvalidDelta, i, e.Key, e.Epoch)
		}
		for j, s := range e.Slots {
			if s.Region == "" || len(s.Region) > MaxRegionNameLen {
				return fmt.Errorf("%w: entry %d slot %d: region %q: length must be 1..%d", ErrInvalidDelta, i, j, s.Region, MaxRegionNameLen)
			}
			if j > 0 && e.Slots[j-1].Region >= s.Region {
				return fmt.Errorf("%w: entry %d slot %d: region %q not after %q", ErrInvalidDelta, i, j, s.Region, e.Slots[j-1].Region)
			}
			if s.P == 0 && s.N == 0 {
				return fmt.Errorf("%w: entry %d slot %d (%q) is zero", ErrInvalidDelta, i, j, s.Region)
			}
		}
	}
	return nil
}
