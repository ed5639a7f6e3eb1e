package regional

import (
	"hash/maphash"
	"sync"
)

// shardMap is a map split over locked shards, for state that every check
// reads: denial cache, leases, tracked keys. Safe for concurrent use.
type shardMap[V any] struct {
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex
		m  map[string]V
		_  [48]byte // separate cache lines
	}
}

func newShardMap[V any]() *shardMap[V] {
	sm := &shardMap[V]{seed: maphash.MakeSeed()}
	for i := range sm.shards {
		sm.shards[i].m = map[string]V{}
	}
	return sm
}

// with runs f with the shard of key locked, and its map.
func (sm *shardMap[V]) with(key []byte, f func(m map[string]V)) {
	sh := &sm.shards[maphash.Bytes(sm.seed, key)%uint64(len(sm.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	f(sh.m)
}

// load returns the value of key, if held.
func (sm *shardMap[V]) load(key []byte) (V, bool) {
	sh := &sm.shards[maphash.Bytes(sm.seed, key)%uint64(len(sm.shards))]
	sh.mu.Lock()
	v, ok := sh.m[string(key)]
	sh.mu.Unlock()
	return v, ok
}

// sweep runs f on every entry, shard by shard, deleting those for which it
// returns true.
func (sm *shardMap[V]) sweep(f func(key string, v V) bool) {
	for i := range sm.shards {
		sh := &sm.shards[i]
		sh.mu.Lock()
		if len(sh.m) > 0 { // starting a walk of an empty map costs as much as a short one
			for k, v := range sh.m {
				if f(k, v) {
					delete(sh.m, k)
				}
			}
		}
		sh.mu.Unlock()
	}
}
