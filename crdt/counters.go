package crdt

import (
	"cmp"
	"fmt"
	"iter"
	"reflect"
	"slices"
	"unsafe"
)

// Counters is a collection of PN-counters, one per (counter key, window
// epoch), replicated across a fixed set of regions. The local region counts
// in its own slot with Inc and Dec; the other regions' slots arrive in
// deltas through Merge. Every change gets a new version, so that DeltaSince
// can say what changed since a version in time proportional to the change,
// not to the collection.
//
// Counters does no I/O and starts no goroutines. It is not safe for
// concurrent use: callers serialize access.
type Counters struct {
	self    int               // index of the local region
	regions []string          // sorted; a slot's region is an index into it
	index   map[string]uint32 // region name to index
	// keys holds each key's newest window; its older ones follow it
	// (entry.older). Looking a key up by its bytes allocates nothing.
	keys map[string]*entry
	n    int // windows held
	// entryType is an entry followed by a slot per region, in one
	// allocation (newEntry); slotsAt is where its slots start.
	entryType reflect.Type
	slotsAt   uintptr
	// Entries whose own slot changed form a list in order of that change,
	// oldest first (own): OwnDeltas reads the own changes after a version
	// from its end, however many windows the other regions changed since.
	// The other regions' changes are in no list: a region gossips only its
	// own, and a full state is read from the keys.
	own     list
	version uint64
	// owned is OwnDeltas's working list, kept from one call to the next:
	// a region sends its own changes every gossip round, tens of
	// thousands of them under load.
	owned []ownChange
}

// ownChange is an entry whose own slot OwnDeltas sends: the slot, and
// the version of its change.
type ownChange struct {
	e   *entry
	s   *slot
	ver uint64
}

// list is a copy's list of the entries with an own change, linked through
// their links.
type list struct{ head, tail *entry }

type links struct{ prev, next *entry }

// entry is one window of a counter. Its slots, one per region by index
// (zero if it counted nothing), follow it in the same allocation, with no
// slice header: a copy holds a million of them under load (Counters.slots).
type entry struct {
	id    ID
	ver   uint64 // the version of its last change
	own   uint64 // the version of its own slot's last change, 0 if none
	links links  // its place in the list of own changes, if own > 0
	older *entry // the same key's window before this one, if held
}

type slot struct{ p, n uint64 }

// NewCounters returns an empty collection for the region self, which must be
// one of regions. Slots of regions not listed are refused by Merge.
func NewCounters(self string, regions []string) (*Counters, error) {
	sorted := slices.Clone(regions)
	slices.Sort(sorted)
	if len(sorted) == 0 || len(sorted) > MaxRegions {
		return nil, fmt.Errorf("%w: %d regions, need 1..%d", ErrInvalidRegions, len(sorted), MaxRegions)
	}
	index := make(map[string]uint32, len(sorted))
	for i, r := range sorted {
		if r == "" || len(r) > MaxRegionNameLen {
			return nil, fmt.Errorf("%w: region name %q: length must be 1..%d", ErrInvalidRegions, r, MaxRegionNameLen)
		}
		if _, dup := index[r]; dup {
			return nil, fmt.Errorf("%w: region %q listed twice", ErrInvalidRegions, r)
		}
		index[r] = uint32(i)
	}
	self32, ok := index[self]
	if !ok {
		return nil, fmt.Errorf("%w: local region %q is not among %q", ErrInvalidRegions, self, regions)
	}
	t := reflect.StructOf([]reflect.StructField{
		{Name: "E", Type: reflect.TypeFor[entry]()},
		{Name: "S", Type: reflect.ArrayOf(len(sorted), reflect.TypeFor[slot]())},
	})
	return &Counters{self: int(self32), regions: sorted, index: index, keys: make(map[string]*entry),
		entryType: t, slotsAt: t.Field(1).Offset}, nil
}

// newEntry allocates an entry with its slots, zero.
func (c *Counters) newEntry() *entry {
	return (*entry)(reflect.New(c.entryType).UnsafePointer())
}

// slots returns the slots of e, which newEntry allocated just after it.
func (c *Counters) slots(e *entry) []slot {
	return unsafe.Slice((*slot)(unsafe.Add(unsafe.Pointer(e), c.slotsAt)), len(c.regions))
}

// Self returns the local region.
func (c *Counters) Self() string { return c.regions[c.self] }

// Regions returns the known regions, sorted.
func (c *Counters) Regions() []string { return slices.Clone(c.regions) }

// Version returns the version of the latest change.
func (c *Counters) Version() uint64 { return c.version }

// Len returns the number of counters held.
func (c *Counters) Len() int { return c.n }

// lookup returns the window epoch of key, or nil.
func (c *Counters) lookup(key string, epoch int64) *entry { return c.keys[key].window(epoch) }

// lookupBytes is lookup by the key's bytes: the map finds them without
// making a string.
func (c *Counters) lookupBytes(key []byte, epoch int64) *entry {
	return c.keys[string(key)].window(epoch)
}

// window returns the window epoch among e and the older windows of its
// key, or nil.
func (e *entry) window(epoch int64) *entry {
	for e != nil && e.id.Epoch > epoch {
		e = e.older
	}
	if e != nil && e.id.Epoch == epoch {
		return e
	}
	return nil
}

// Inc adds n to the local region's increments of counter id.
func (c *Counters) Inc(id ID, n uint64) {
	if n == 0 {
		return
	}
	e, s := c.ownSlot(id)
	s.p = addSat(s.p, n)
	c.touch(e, c.self)
}

// Dec adds n to the local region's decrements of counter id.
func (c *Counters) Dec(id ID, n uint64) {
	if n == 0 {
		return
	}
	e, s := c.ownSlot(id)
	s.n = addSat(s.n, n)
	c.touch(e, c.self)
}

// Value returns the value of counter id, summed over all regions: total
// increments minus total decrements. An unknown counter is 0.
func (c *Counters) Value(id ID) int64 {
	e := c.lookup(id.Key, id.Epoch)
	if e == nil {
		return 0
	}
	var p, n uint64
	for _, s := range c.slots(e) {
		p, n = addSat(p, s.p), addSat(n, s.n)
	}
	return diffClamp(p, n)
}

// Get returns a copy of counter id, with a slot per region that counted.
func (c *Counters) Get(id ID) PNCounter {
	var pn PNCounter
	if e := c.lookup(id.Key, id.Epoch); e != nil {
		for i, s := range c.slots(e) {
			pn.P.Inc(c.regions[i], s.p)
			pn.N.Inc(c.regions[i], s.n)
		}
	}
	return pn
}

// Slots returns the slots of counter id that counted, in region order.
func (c *Counters) Slots(id ID) []Slot {
	e := c.lookup(id.Key, id.Epoch)
	if e == nil {
		return nil
	}
	var out []Slot
	for i, s := range c.slots(e) {
		if s.p != 0 || s.n != 0 {
			out = append(out, Slot{Region: c.regions[i], P: s.p, N: s.n})
		}
	}
	return out
}

// MergeReport says what Merge did with each slot of a delta. Each slot is
// counted once.
type MergeReport struct {
	// Applied slots raised at least one of our totals.
	Applied int
	// Duplicate slots equalled what we had: a repeat, harmless.
	Duplicate int
	// Regressed slots were the sender's own and below what we had in at
	// least one total; the lower totals were ignored. A region whose own
	// counters go backwards is replaying old state or has lost its own.
	Regressed int
	// Stale slots were another region's, relayed, and older than our copy:
	// the sender had not heard the latest yet. Normal, and ignored.
	Stale int
	// UnknownRegion slots named a region outside the collection's set, or
	// came from an unknown (or unnamed) origin; they were ignored.
	UnknownRegion int
	// Ahead slots were of windows that start later than the receiver's
	// clock allows; they were refused. Merge leaves it 0: a receiver that
	// knows the time drops them first (Delta.Until) and counts them.
	Ahead int
	// UnknownRule slots were of counters of no rule the receiver has in
	// force; they were refused. Merge leaves it 0: a receiver that knows
	// its rules drops them first and counts them.
	UnknownRule int
}

// Rejected returns the number of slots refused as bad: regressed, from
// unknown regions, ahead of time, or of no rule in force. Stale slots are
// not bad news and not counted.
func (r MergeReport) Rejected() int { return r.Regressed + r.UnknownRegion + r.Ahead + r.UnknownRule }

// Merge joins a delta into the collection: each slot is raised to the
// maximum of ours and the delta's. Merge accepts any delta, canonical or
// not. A delta from an origin outside the region set, or naming none, is
// ignored whole. Merge never lowers a total, so it is safe against
// replays; the report says what was ignored.
func (c *Counters) Merge(d Delta) MergeReport {
	var r MergeReport
	origin, ok := c.index[d.Origin]
	if !ok {
		r.UnknownRegion = d.Slots()
		return r
	}
	// A delta's slots are mostly its origin's: the last region looked up
	// is kept.
	lastName, lastIndex := d.Origin, origin
	for _, de := range d.Entries {
		e := c.lookup(de.ID.Key, de.ID.Epoch)
		for _, ds := range de.Slots {
			ri := lastIndex
			if ds.Region != lastName {
				var ok bool
				if ri, ok = c.index[ds.Region]; !ok {
					r.UnknownRegion++
					continue
				}
				lastName, lastIndex = ds.Region, ri
			}
			var cur slot
			if e != nil {
				cur = c.slots(e)[ri]
			}
			lower := ds.P < cur.p || ds.N < cur.n
			switch {
			case lower && ri == origin:
				r.Regressed++
			case lower:
				r.Stale++
			case ds.P == cur.p && ds.N == cur.n:
				r.Duplicate++
				continue
			default:
				r.Applied++
			}
			if ds.P <= cur.p && ds.N <= cur.n {
				continue
			}
			if e == nil {
				e = c.insert(de.ID)
			}
			s := &c.slots(e)[ri]
			s.p, s.n = max(s.p, ds.P), max(s.n, ds.N)
			c.touch(e, int(ri))
		}
	}
	return r
}

// DeltaSince returns every slot, of any region, of the counters changed
// after version v (their slots changed before it too: only a counter's own
// slot keeps its version), as a canonical delta from the local region.
// DeltaSince(0) is the full state.
func (c *Counters) DeltaSince(v uint64) Delta { return c.deltaSince(v, -1) }

// IDs yields the ID of every counter held, in no set order, without
// copying their slots: for a pass over the whole collection that reads
// few of them (Get). The collection must not change during the pass.
func (c *Counters) IDs() iter.Seq[ID] {
	return func(yield func(ID) bool) {
		for e := range c.entries() {
			if !yield(e.id) {
				return
			}
		}
	}
}

// entries yields every window held, in no set order.
func (c *Counters) entries() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for _, e := range c.keys {
			for ; e != nil; e = e.older {
				if !yield(e) {
					return
				}
			}
		}
	}
}

// OwnDeltaSince returns the local region's slots changed after version v:
// what a region gossips to the others.
func (c *Counters) OwnDeltaSince(v uint64) Delta { return c.deltaSince(v, c.self) }

// deltaSince is DeltaSince of the local region's slots (only = c.self), or
// of all (only < 0). The local region's changes are read from the list of
// own changes, in time proportional to them; every region's from the
// whole collection: what a full state (v = 0) reads anyway.
func (c *Counters) deltaSince(v uint64, only int) Delta {
	d := Delta{Origin: c.Self(), From: min(v, c.version), To: c.version}
	var changed []*entry
	nslots := 0
	add := func(e *entry) {
		changed = append(changed, e)
		for i, s := range c.slots(e) { // those appendEntries keeps
			if (only < 0 || i == only) && (s.p != 0 || s.n != 0) {
				nslots++
			}
		}
	}
	if only == c.self {
		for e := c.own.tail; e != nil && e.own > v; e = e.links.prev {
			add(e)
		}
	} else {
		for e := range c.entries() {
			if e.ver > v {
				add(e)
			}
		}
	}
	slices.SortFunc(changed, func(a, b *entry) int { return a.id.Compare(b.id) })
	return c.appendEntries(d, changed, nslots, func(region int) bool {
		return only < 0 || region == only
	})
}

// OwnDeltas returns the local region's slots changed after version v, in
// deltas of at most max entries each (max <= 0: one delta), in the order
// they are to be sent. Each covers a range of versions, From (exclusive)
// to To (inclusive), the first from v and the last to the latest version:
// a receiver that has merged every delta up to one needs only the slots
// changed after its To to hold them all, whatever became of the later
// deltas (a change in a part's range that the part lacks was overtaken by
// a later one, after its To). With nothing changed it returns one delta with no entries, which
// still says how far the versions run.
func (c *Counters) OwnDeltas(v uint64, max int) []Delta {
	from := min(v, c.version)
	changed := c.owned[:0]
	defer func() {
		clear(changed) // holds no entry once they are gone
		c.owned = changed[:0]
	}()
	for e := c.own.tail; e != nil && e.own > v; e = e.links.prev {
		if s := &c.slots(e)[c.self]; s.p != 0 || s.n != 0 {
			changed = append(changed, ownChange{e, s, e.own})
		}
	}
	if len(changed) == 0 {
		return []Delta{{Origin: c.Self(), From: from, To: c.version}}
	}
	if max <= 0 {
		max = len(changed)
	}
	// Parts are cut in the order of the slots' versions, so that each
	// holds every change in its range; within a part, in ID order.
	slices.SortFunc(changed, func(a, b ownChange) int { return cmp.Compare(a.ver, b.ver) })
	buf := make([]Slot, len(changed))
	entries := make([]Entry, len(changed))
	var out []Delta
	for start := 0; start < len(changed); start += max {
		part := changed[start:min(len(changed), start+max)]
		to := part[len(part)-1].ver
		if start+max >= len(changed) {
			to = c.version
		}
		slices.SortFunc(part, func(a, b ownChange) int { return a.e.id.Compare(b.e.id) })
		d := Delta{Origin: c.Self(), From: from, To: to, Entries: entries[start : start+len(part) : start+len(part)]}
		for i, ch := range part {
			buf[start+i] = Slot{Region: c.regions[c.self], P: ch.s.p, N: ch.s.n}
			d.Entries[i] = Entry{ID: ch.e.id, Slots: buf[start+i : start+i+1 : start+i+1]}
		}
		out = append(out, d)
		from = to
	}
	return out
}

// RegionState returns every slot of one region the collection holds, as
// a full state from the local region (versions 0 to 0: it covers no range
// of anyone's). It is what a region that lost its own counters is sent
// back from another's copy.
func (c *Counters) RegionState(region string) Delta {
	d := Delta{Origin: c.Self()}
	ri, ok := c.index[region]
	if !ok {
		return d
	}
	var held []*entry
	for e := range c.entries() {
		if s := c.slots(e)[ri]; s.p != 0 || s.n != 0 {
			held = append(held, e)
		}
	}
	slices.SortFunc(held, func(a, b *entry) int { return a.id.Compare(b.id) })
	return c.appendEntries(d, held, len(held), func(region int) bool { return region == int(ri) })
}

// appendEntries adds to d the slots of entries that keep accepts, in entry
// order, dropping entries left without slots. All slots share one
// allocation of size nslots.
func (c *Counters) appendEntries(d Delta, entries []*entry, nslots int, keep func(region int) bool) Delta {
	buf := make([]Slot, 0, nslots)
	for _, e := range entries {
		start := len(buf)
		slots := c.slots(e)
		for i := range slots {
			if s := &slots[i]; keep(i) && (s.p != 0 || s.n != 0) {
				buf = append(buf, Slot{Region: c.regions[i], P: s.p, N: s.n})
			}
		}
		if len(buf) > start {
			d.Entries = append(d.Entries, Entry{ID: e.id, Slots: buf[start:len(buf):len(buf)]})
		}
	}
	return d
}

// Expire removes every counter for which expired returns true, and returns
// how many it removed. Removal is local and is not a change: it creates no
// version and is not gossiped. A counter that a later Merge brings back is
// created anew, so callers drop deltas for epochs they have expired.
func (c *Counters) Expire(expired func(ID) bool) int {
	removed := 0
	for k, head := range c.keys {
		first, last := head, (*entry)(nil) // the key's newest window kept, and the last
		for e := head; e != nil; {
			older := e.older
			if !expired(e.id) {
				last = e
				e = older
				continue
			}
			if e.own > 0 {
				c.unlink(e)
			}
			if last == nil {
				first = older
			} else {
				last.older = older
			}
			e.older = nil
			c.n--
			removed++
			e = older
		}
		switch {
		case first == nil:
			delete(c.keys, k)
		case first != head:
			c.keys[k] = first
		}
	}
	return removed
}

func (c *Counters) ownSlot(id ID) (*entry, *slot) {
	e := c.lookup(id.Key, id.Epoch)
	if e == nil {
		e = c.insert(id)
	}
	return e, &c.slots(e)[c.self]
}

// insert adds an empty window id, which must not be held, at its place
// among its key's windows.
func (c *Counters) insert(id ID) *entry {
	e := c.newEntry()
	e.id = id
	c.n++
	at := c.keys[id.Key]
	if at != nil {
		e.id.Key = at.id.Key // one string for the key's windows
	}
	if at == nil || at.id.Epoch < id.Epoch {
		e.older = at
		c.keys[e.id.Key] = e
	} else {
		for at.older != nil && at.older.id.Epoch > id.Epoch {
			at = at.older
		}
		e.older, at.older = at.older, e
	}
	return e
}

// touch records a change of region's slot in entry e: a new version for
// both, and an own change moves e to the end of the list of own changes.
func (c *Counters) touch(e *entry, region int) {
	c.version++
	e.ver = c.version
	if region == c.self {
		if c.own.tail != e {
			if e.own > 0 {
				c.unlink(e)
			}
			c.pushBack(e)
		}
		e.own = c.version
	}
}

// pushBack puts e at the end of the list of own changes.
func (c *Counters) pushBack(e *entry) {
	l := &c.own
	e.links = links{prev: l.tail}
	if l.tail != nil {
		l.tail.links.next = e
	} else {
		l.head = e
	}
	l.tail = e
}

// unlink takes e out of the list of own changes (where it is).
func (c *Counters) unlink(e *entry) {
	l, at := &c.own, &e.links
	if at.prev != nil {
		at.prev.links.next = at.next
	} else {
		l.head = at.next
	}
	if at.next != nil {
		at.next.links.prev = at.prev
	} else {
		l.tail = at.prev
	}
	*at = links{}
}

// Observe raises the local region's slot of counter id to at least p
// increments and n decrements: what the region's store says it counted,
// when the store, not this collection, keeps the count. It reports whether
// the slot changed.
func (c *Counters) Observe(id ID, p, n uint64) bool {
	return c.observe(c.lookup(id.Key, id.Epoch), id, p, n)
}

// observe is Observe of window e (nil: not held yet, id).
func (c *Counters) observe(e *entry, id ID, p, n uint64) bool {
	if e == nil {
		if p == 0 && n == 0 {
			return false
		}
		e = c.insert(id)
	}
	s := &c.slots(e)[c.self]
	if s.p >= p && s.n >= n {
		return false
	}
	s.p, s.n = max(s.p, p), max(s.n, n)
	c.touch(e, c.self)
	return true
}

// Others returns the sums of the other regions' slots of counter id: their
// increments and their decrements.
func (c *Counters) Others(id ID) (p, n uint64) {
	if e := c.lookup(id.Key, id.Epoch); e != nil {
		p, n = c.others(e)
	}
	return p, n
}

// Own returns the local region's slot of counter id.
func (c *Counters) Own(id ID) (p, n uint64) {
	if e := c.lookup(id.Key, id.Epoch); e != nil {
		s := c.slots(e)[c.self]
		return s.p, s.n
	}
	return 0, 0
}

// others sums the slots of e of every region but the local one.
func (c *Counters) others(e *entry) (p, n uint64) {
	for i, s := range c.slots(e) {
		if i != c.self {
			p, n = addSat(p, s.p), addSat(n, s.n)
		}
	}
	return p, n
}

// Tally is one window of a counter as the local region sees it: its own
// slot, and the other regions' slots summed.
type Tally struct {
	P, N             uint64 // the local region's
	OthersP, OthersN uint64
}

// Tally returns the window epoch of the counter key (the key's bytes: the
// lookup makes no string), zero if not held.
func (c *Counters) Tally(key []byte, epoch int64) Tally {
	e := c.lookupBytes(key, epoch)
	if e == nil {
		return Tally{}
	}
	s := c.slots(e)[c.self]
	t := Tally{P: s.p, N: s.n}
	t.OthersP, t.OthersN = c.others(e)
	return t
}

// AppendCounts appends the count of every region in the window epoch of
// the counter key (its P less its N, 0 below), in the order of Regions, or
// nothing if the window is not held: a caller's buffer on its stack holds
// them without allocating.
func (c *Counters) AppendCounts(dst []int64, key []byte, epoch int64) []int64 {
	e := c.lookupBytes(key, epoch)
	if e == nil {
		return dst
	}
	for _, s := range c.slots(e) {
		dst = append(dst, max(0, diffClamp(s.p, s.n)))
	}
	return dst
}

// IncKey is Inc of the window epoch of the counter key: it makes a string
// of the key only for a window not yet held. It returns the local
// region's slot after.
func (c *Counters) IncKey(key []byte, epoch int64, n uint64) (p, m uint64) {
	e := c.lookupBytes(key, epoch)
	if e == nil {
		if n == 0 {
			return 0, 0
		}
		e = c.insert(ID{Key: string(key), Epoch: epoch})
	}
	s := &c.slots(e)[c.self]
	if n > 0 {
		s.p = addSat(s.p, n)
		c.touch(e, c.self)
	}
	return s.p, s.n
}

// ObserveKey is Observe of the window epoch of the counter key: it makes
// a string of the key only for a window not yet held.
func (c *Counters) ObserveKey(key []byte, epoch int64, p, n uint64) bool {
	e := c.lookupBytes(key, epoch)
	var id ID
	if e == nil && (p != 0 || n != 0) {
		id = ID{Key: string(key), Epoch: epoch}
	}
	return c.observe(e, id, p, n)
}
