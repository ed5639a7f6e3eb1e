package crdt

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

var testRegions = []string{"ap-south", "eu-west", "us-east"}

// genAmount draws mostly small amounts, sometimes huge ones so that
// saturation is exercised.
func genAmount() *rapid.Generator[uint64] {
	return rapid.OneOf(rapid.Uint64Range(0, 1000), rapid.Uint64Range(math.MaxUint64-1000, math.MaxUint64))
}

func genGCounter() *rapid.Generator[GCounter] {
	return rapid.Custom(func(t *rapid.T) GCounter {
		var c GCounter
		for range rapid.IntRange(0, 6).Draw(t, "incs") {
			c.Inc(rapid.SampledFrom(testRegions).Draw(t, "region"), genAmount().Draw(t, "n"))
		}
		return c
	})
}

func genPNCounter() *rapid.Generator[PNCounter] {
	return rapid.Custom(func(t *rapid.T) PNCounter {
		return PNCounter{P: genGCounter().Draw(t, "p"), N: genGCounter().Draw(t, "n")}
	})
}

func mergedG(a, b GCounter) GCounter {
	m := a.Clone()
	m.Merge(b)
	return m
}

func mergedPN(a, b PNCounter) PNCounter {
	m := a.Clone()
	m.Merge(b)
	return m
}

func TestGCounterMergeLaws(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := genGCounter().Draw(t, "a"), genGCounter().Draw(t, "b"), genGCounter().Draw(t, "c")
		if ab, ba := mergedG(a, b), mergedG(b, a); !ab.Equal(ba) {
			t.Fatalf("not commutative: %v vs %v", ab, ba)
		}
		if l, r := mergedG(mergedG(a, b), c), mergedG(a, mergedG(b, c)); !l.Equal(r) {
			t.Fatalf("not associative: %v vs %v", l, r)
		}
		if aa := mergedG(a, a); !aa.Equal(a) {
			t.Fatalf("not idempotent: %v vs %v", aa, a)
		}
		// The merge is the least upper bound: each slot is the larger of the two.
		ab := mergedG(a, b)
		for _, r := range testRegions {
			if got, want := ab.Get(r), max(a.Get(r), b.Get(r)); got != want {
				t.Fatalf("slot %s = %d, want max(%d, %d)", r, got, a.Get(r), b.Get(r))
			}
		}
		if ab.Value() < max(a.Value(), b.Value()) {
			t.Fatalf("merge lowered the value: %d < max(%d, %d)", ab.Value(), a.Value(), b.Value())
		}
	})
}

func TestGCounterIncIsMonotone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := genGCounter().Draw(t, "c")
		region := rapid.SampledFrom(testRegions).Draw(t, "region")
		n := genAmount().Draw(t, "n")
		before, slot := c.Value(), c.Get(region)
		c.Inc(region, n)
		if c.Value() < before || c.Get(region) < slot {
			t.Fatalf("Inc(%s, %d) lowered value %d->%d or slot %d->%d", region, n, before, c.Value(), slot, c.Get(region))
		}
		if slot <= math.MaxUint64-n && c.Get(region) != slot+n {
			t.Fatalf("Inc(%s, %d): slot %d -> %d", region, n, slot, c.Get(region))
		}
	})
}

func TestGCounterCloneIsIndependent(t *testing.T) {
	var a GCounter
	a.Inc("us-east", 1)
	b := a.Clone()
	b.Inc("us-east", 5)
	b.Inc("eu-west", 2)
	if a.Get("us-east") != 1 || a.Get("eu-west") != 0 {
		t.Fatalf("changing a clone changed the original: %v", a)
	}
}

func TestPNCounterMergeLaws(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, c := genPNCounter().Draw(t, "a"), genPNCounter().Draw(t, "b"), genPNCounter().Draw(t, "c")
		if ab, ba := mergedPN(a, b), mergedPN(b, a); !ab.Equal(ba) {
			t.Fatalf("not commutative")
		}
		if l, r := mergedPN(mergedPN(a, b), c), mergedPN(a, mergedPN(b, c)); !l.Equal(r) {
			t.Fatalf("not associative")
		}
		if aa := mergedPN(a, a); !aa.Equal(a) {
			t.Fatalf("not idempotent")
		}
		// Both halves only grow, whatever the value does.
		ab := mergedPN(a, b)
		if ab.P.Value() < a.P.Value() || ab.N.Value() < a.N.Value() {
			t.Fatalf("merge lowered a half")
		}
	})
}

func TestPNCounterValue(t *testing.T) {
	var c PNCounter
	c.Inc("us-east", 10)
	c.Dec("eu-west", 3)
	c.Inc("eu-west", 1)
	if got := c.Value(); got != 8 {
		t.Fatalf("Value() = %d, want 8", got)
	}
	var big PNCounter
	big.Dec("us-east", math.MaxUint64)
	if got := big.Value(); got != -math.MaxInt64 {
		t.Fatalf("Value() = %d, want clamped to %d", got, -math.MaxInt64)
	}
}

func TestPNCounterByRegion(t *testing.T) {
	var c PNCounter
	c.Inc("eu", 7)
	c.Dec("eu", 2)
	c.Inc("us", 3)
	c.Dec("ap", 1) // decrements alone: not a region that counted
	got := c.ByRegion()
	if len(got) != 2 || got["eu"] != 5 || got["us"] != 3 {
		t.Fatalf("ByRegion: %v, want eu 5 and us 3", got)
	}
}
