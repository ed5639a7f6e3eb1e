package crdt

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
)

// Digest summarizes a collection for anti-entropy. Counters are spread over
// Buckets buckets by a hash of their ID; each non-empty bucket carries the
// number of counters in it and a hash of their full state. Two replicas
// whose bucket sums match hold the same counters in that bucket (up to a
// 64-bit hash collision); for the rest, Diff sends the counters over.
type Digest struct {
	Origin  string
	Buckets uint32
	Sums    []BucketSum // in bucket order, non-empty buckets only
}

// BucketSum is the summary of one bucket.
type BucketSum struct {
	Bucket uint32
	Count  uint32
	Hash   uint64 // sum of the hashes of the bucket's counters, wrapping
}

// DefaultDigestBuckets suits collections of up to a few hundred thousand
// counters: the digest of a full collection is about 45 kB, and with
// 100,000 counters a lost delta costs the resend of a bucket of about 25.
const DefaultDigestBuckets = 4096

// Digest summarizes the collection in the given number of buckets.
func (c *Counters) Digest(buckets uint32) (Digest, error) {
	if buckets == 0 || buckets > MaxDigestBuckets {
		return Digest{}, fmt.Errorf("%w: %d buckets, need 1..%d", ErrInvalidDigest, buckets, MaxDigestBuckets)
	}
	sums := slices.SortedFunc(maps.Values(c.bucketSums(buckets)), func(a, b BucketSum) int { return cmp.Compare(a.Bucket, b.Bucket) })
	return Digest{Origin: c.Self(), Buckets: buckets, Sums: sums}, nil
}

// Diff returns, as a full-state delta, every counter of ours that sits in a
// bucket whose summary differs from the peer's digest: what the peer may be
// missing. The peer finds what we are missing by diffing our digest.
func (c *Counters) Diff(peer Digest) (Delta, error) {
	if peer.Buckets == 0 || peer.Buckets > MaxDigestBuckets {
		return Delta{}, fmt.Errorf("%w: %d buckets, need 1..%d", ErrInvalidDigest, peer.Buckets, MaxDigestBuckets)
	}
	ours := c.bucketSums(peer.Buckets)
	theirs := make(map[uint32]BucketSum, len(peer.Sums))
	for _, s := range peer.Sums {
		theirs[s.Bucket] = s
	}
	var send []*entry
	nslots := 0
	for e := c.head; e != nil; e = e.next {
		b := e.bucketIn(peer.Buckets)
		t := theirs[b]
		if o := ours[b]; o.Count != t.Count || o.Hash != t.Hash {
			send = append(send, e)
			nslots += len(e.slots)
		}
	}
	slices.SortFunc(send, func(a, b *entry) int { return a.id.Compare(b.id) })
	d := Delta{Origin: c.Self(), To: c.version}
	return c.appendEntries(d, send, nslots, func(*slot) bool { return true }), nil
}

// bucketSums sums the non-empty buckets: memory in proportion to the
// collection, whatever bucket count a peer asks for.
func (c *Counters) bucketSums(buckets uint32) map[uint32]BucketSum {
	sums := make(map[uint32]BucketSum, min(len(c.entries), int(buckets)))
	for e := c.head; e != nil; e = e.next {
		b := e.bucketIn(buckets)
		s := sums[b]
		s.Bucket = b
		s.Count++
		if e.hashVer != e.ver || e.hashVer == 0 {
			e.hash, e.hashVer = c.entryHash(e), e.ver
		}
		s.Hash += e.hash
		sums[b] = s
	}
	return sums
}

// bucketIn is the entry's bucket among buckets, computed once per bucket
// count.
func (e *entry) bucketIn(buckets uint32) uint32 {
	if e.bucketsOf != buckets {
		e.bucket, e.bucketsOf = bucketOf(e.id, buckets), buckets
	}
	return e.bucket
}

func bucketOf(id ID, buckets uint32) uint32 {
	h := fnv.New64a()
	h.Write([]byte(id.Key))
	var buf [8]byte
	h.Write(binary.LittleEndian.AppendUint64(buf[:0], uint64(id.Epoch)))
	return uint32(h.Sum64() % uint64(buckets))
}

// entryHash hashes a counter's full state, naming regions rather than
// indexes so that replicas with different region tables agree. Zero slots
// are skipped: a zero slot and a missing one are the same state.
func (c *Counters) entryHash(e *entry) uint64 {
	h := fnv.New64a()
	var buf [binary.MaxVarintLen64]byte
	h.Write(binary.AppendUvarint(buf[:0], uint64(len(e.id.Key))))
	h.Write([]byte(e.id.Key))
	h.Write(binary.AppendVarint(buf[:0], e.id.Epoch))
	for _, s := range e.slots {
		if s.p == 0 && s.n == 0 {
			continue
		}
		r := c.regions[s.region]
		h.Write(binary.AppendUvarint(buf[:0], uint64(len(r))))
		h.Write([]byte(r))
		h.Write(binary.AppendUvarint(buf[:0], s.p))
		h.Write(binary.AppendUvarint(buf[:0], s.n))
	}
	return h.Sum64()
}
