package budget

// Shards of globalsync: when one instance cannot keep up with every
// counter of the global rules, globalsync runs as n instances, and
// instance i leads the counters whose key hashes to i (ShardOf) — its own
// leader claim, its own budget document of each rule. Each rule's counters
// are cut in n slices that share nothing: a counter's limit is its own,
// and a rule's lease is a fraction of each counter's limit, so a slice's
// leases (its Document's, Shard i of Shards n) are a rule's leases on that
// slice alone. A region enforces on a counter the leases of its slice.

// MaxShards is the most instances globalsync's counters may be split over.
const MaxShards = 64

// ShardOf returns the shard of a global counter among n: its key (as
// regional.CounterKey writes it) hashed with 32-bit FNV-1a, modulo n; 0
// when n is 1 or less.
func ShardOf[K ~string | ~[]byte](key K, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
}
