package budget

import (
	"errors"
	"fmt"
	"testing"
)

// TestShardOf: one slice when not sharded; a key's slice the same from a
// string or its bytes, and stable (the regions and every globalsync
// instance must agree); keys spread evenly over the slices.
func TestShardOf(t *testing.T) {
	if got := ShardOf("any", 1); got != 0 {
		t.Errorf("ShardOf(any, 1) = %d, want 0", got)
	}
	if got := ShardOf("any", 0); got != 0 {
		t.Errorf("ShardOf(any, 0) = %d, want 0", got)
	}
	// FNV-1a of "a" is 0xe40c292c.
	if got, want := ShardOf("a", 7), int(uint32(0xe40c292c)%7); got != want {
		t.Errorf("ShardOf(a, 7) = %d, want %d", got, want)
	}
	const n, keys = 8, 80_000
	var per [n]int
	for i := range keys {
		k := fmt.Sprintf("\x00g\x00tenant-%d\x01", i)
		s := ShardOf(k, n)
		if b := ShardOf([]byte(k), n); b != s {
			t.Fatalf("%q: slice %d as a string, %d as bytes", k, s, b)
		}
		per[s]++
	}
	for s, c := range per {
		if c < keys/n*9/10 || c > keys/n*11/10 {
			t.Errorf("slice %d holds %d of %d keys, want about %d", s, c, keys, keys/n)
		}
	}
}

// TestDecodeDocumentRefusesImpossibleSlices: a document of a slice the
// slicing does not have, or of more slices than MaxShards, is refused.
func TestDecodeDocumentRefusesImpossibleSlices(t *testing.T) {
	for _, c := range []struct {
		shard, shards int
		ok            bool
	}{{0, 0, true}, {1, 2, true}, {3, 4, true}, {2, 2, false}, {1, 0, false}, {-1, 2, false}, {0, MaxShards + 1, false}} {
		b := fmt.Sprintf(`{"rule":"g","seq":1,"leases":{},"shard":%d,"shards":%d}`, c.shard, c.shards)
		_, err := DecodeDocument([]byte(b))
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidDocument)) {
			t.Errorf("slice %d of %d: %v, want ok %v", c.shard, c.shards, err, c.ok)
		}
	}
}
