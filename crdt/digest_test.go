package crdt

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestDigestCacheHolds: digests and diffs taken as a collection changes
// (which reuse each counter's hash and bucket while the counter does not
// change) are those of a fresh copy of the same state, which computes
// everything anew.
func TestDigestCacheHolds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := newTestCounters(t, testRegions[0])
		peer := newTestCounters(t, testRegions[1])
		ids := rapid.SampledFrom([]ID{{"a", 0}, {"a", 60}, {"b", 0}, {"tenant/c", 60}, {"d", 120}})
		buckets := rapid.SampledFrom([]uint32{1, 2, 7, DefaultDigestBuckets})
		for range rapid.IntRange(1, 40).Draw(t, "steps") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				c.Inc(ids.Draw(t, "id"), rapid.Uint64Range(1, 5).Draw(t, "n"))
			case 1:
				c.Dec(ids.Draw(t, "id"), 1)
			case 2:
				peer.Inc(ids.Draw(t, "id"), rapid.Uint64Range(1, 5).Draw(t, "n"))
				c.Merge(peer.OwnDeltaSince(0))
			case 3:
				id := ids.Draw(t, "id")
				p, n := c.Own(id)
				c.Observe(id, p+rapid.Uint64Range(0, 3).Draw(t, "more"), n)
			case 4:
				epoch := rapid.SampledFrom([]int64{0, 60, 120}).Draw(t, "expire")
				c.Expire(func(id ID) bool { return id.Epoch == epoch })
			case 5:
				b := buckets.Draw(t, "buckets")
				fresh := newTestCounters(t, testRegions[0])
				fresh.Merge(c.DeltaSince(0))
				got, err := c.Digest(b)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := fresh.Digest(b)
				if !slices.Equal(got.Sums, want.Sums) {
					t.Fatalf("digest in %d buckets %v, a fresh copy's %v", b, got.Sums, want.Sums)
				}
				pd, _ := peer.Digest(b)
				d1, _ := c.Diff(pd)
				d2, _ := fresh.Diff(pd)
				if !slices.EqualFunc(d1.Entries, d2.Entries, func(x, y Entry) bool { return x.ID == y.ID && slices.Equal(x.Slots, y.Slots) }) {
					t.Fatalf("diff %v, a fresh copy's %v", d1.Entries, d2.Entries)
				}
			}
		}
	})
}
