package crdt

import (
	"iter"
	"math"
	"slices"
	"strings"
)

// GCounter is a grow-only counter with one slot per region. A region only
// ever increments its own slot; merging two counters takes the maximum of
// each slot, so merge is commutative, associative and idempotent, and the
// value (the sum of the slots) never decreases.
//
// The zero value is an empty counter ready to use. A GCounter holds a slice:
// copying one shares its storage, so use Clone for an independent copy.
// A GCounter is not safe for concurrent use.
type GCounter struct {
	slots []regionCount // sorted by region, no zero counts
}

type regionCount struct {
	region string
	n      uint64
}

// Inc adds n to region's slot. The slot saturates at math.MaxUint64 rather
// than wrapping, so that it can never appear to go backwards.
func (c *GCounter) Inc(region string, n uint64) {
	if n == 0 {
		return
	}
	i, ok := c.find(region)
	if !ok {
		c.slots = slices.Insert(c.slots, i, regionCount{region: region, n: n})
		return
	}
	c.slots[i].n = addSat(c.slots[i].n, n)
}

// Get returns region's slot.
func (c GCounter) Get(region string) uint64 {
	if i, ok := c.find(region); ok {
		return c.slots[i].n
	}
	return 0
}

// Value returns the sum of all slots, saturating at math.MaxUint64.
func (c GCounter) Value() uint64 {
	var sum uint64
	for _, s := range c.slots {
		sum = addSat(sum, s.n)
	}
	return sum
}

// Merge raises every slot of c to at least the matching slot of o.
func (c *GCounter) Merge(o GCounter) {
	for _, s := range o.slots {
		i, ok := c.find(s.region)
		switch {
		case !ok:
			c.slots = slices.Insert(c.slots, i, s)
		case s.n > c.slots[i].n:
			c.slots[i].n = s.n
		}
	}
}

// All yields the non-zero slots in region order.
func (c GCounter) All() iter.Seq2[string, uint64] {
	return func(yield func(string, uint64) bool) {
		for _, s := range c.slots {
			if !yield(s.region, s.n) {
				return
			}
		}
	}
}

// Equal reports whether c and o hold the same slots.
func (c GCounter) Equal(o GCounter) bool { return slices.Equal(c.slots, o.slots) }

// Clone returns a copy of c that shares no storage with it.
func (c GCounter) Clone() GCounter { return GCounter{slots: slices.Clone(c.slots)} }

func (c GCounter) find(region string) (int, bool) {
	return slices.BinarySearchFunc(c.slots, region, func(s regionCount, r string) int {
		return strings.Compare(s.region, r)
	})
}

// PNCounter is a counter that can also go down: two G-counters, P for
// increments and N for decrements, with value P - N. Grants and refunds of
// quota are counted in one.
//
// The zero value is ready to use; copying shares storage (see GCounter).
type PNCounter struct {
	P, N GCounter
}

// Inc adds n to region's increments.
func (c *PNCounter) Inc(region string, n uint64) { c.P.Inc(region, n) }

// Dec adds n to region's decrements.
func (c *PNCounter) Dec(region string, n uint64) { c.N.Inc(region, n) }

// Value returns P - N, clamped to the range of int64.
func (c PNCounter) Value() int64 { return diffClamp(c.P.Value(), c.N.Value()) }

// ByRegion returns what each region that counted an increment counted in
// all: its increments less its decrements.
func (c PNCounter) ByRegion() map[string]int64 {
	out := map[string]int64{}
	for r, p := range c.P.All() {
		out[r] = int64(p) - int64(c.N.Get(r))
	}
	return out
}

// Merge merges o's increments and decrements into c.
func (c *PNCounter) Merge(o PNCounter) {
	c.P.Merge(o.P)
	c.N.Merge(o.N)
}

// Equal reports whether c and o hold the same slots.
func (c PNCounter) Equal(o PNCounter) bool { return c.P.Equal(o.P) && c.N.Equal(o.N) }

// Clone returns a copy of c that shares no storage with it.
func (c PNCounter) Clone() PNCounter { return PNCounter{P: c.P.Clone(), N: c.N.Clone()} }

func addSat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// diffClamp returns p - n as an int64, clamped to its range.
func diffClamp(p, n uint64) int64 {
	if p >= n {
		return int64(min(p-n, math.MaxInt64))
	}
	return -int64(min(n-p, math.MaxInt64))
}
