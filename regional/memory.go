package regional

import (
	"context"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/geoquota/geoquota/crdt"
)

// MemoryStore keeps counters in this process's memory, with the same
// algorithms and the same decisions as the Redis store. It serves --dev,
// the local_only fallback, hot keys' batches and the simulator.
//
// It starts no goroutines: expired counters are dropped as they are met and
// by a little sweeping on every few calls. It is safe for concurrent use.
type MemoryStore struct {
	now    func() int64 // µs since the Unix epoch
	region string       // this region's slot of global counters
	seed   maphash.Seed
	shards [memShards]memShard
	// copy, if set, is the engine's copy of the global counters, which
	// the store of an engine on its own memory keeps global counters in:
	// it decides global limits against every region's slots there and
	// counts this region's there, under the copy's lock, and its own
	// windows of global counters stay empty.
	copy *counters

	replicasMu sync.Mutex
	replicas   map[string]ReplicaState // Heartbeat's
	// expiries are the reservations to refund when they end (expiry.go).
	expiries memExpiries
	// slotsIn are the global concurrency limits' slots in flight, by
	// window (memSlots).
	slotsIn memSlots
}

// memSlots is, per window of a global concurrency limit (its GlobalKey),
// this region's slots taken in it and not released, each by its number
// (the region's P after it was taken): limits.lua's "<window key>:in"
// sets. A release leaves its set once.
type memSlots struct {
	mu   sync.Mutex
	sets map[string]*memSlotSet
	adds int
}

type memSlotSet struct {
	in      map[uint64]struct{}
	expires int64 // µs
}

// taken notes slot seq of the window of p that holds now.
func (s *memSlots) taken(key []byte, p *Params, now int64, seq uint64) {
	start, _ := globalWindows(p, float64(now))
	k := string(GlobalKey(key, int64(start)/1000))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sets == nil {
		s.sets = map[string]*memSlotSet{}
	}
	if s.adds++; s.adds%sweepEvery == 0 {
		for k, set := range s.sets {
			if set.expires <= now {
				delete(s.sets, k)
			}
		}
	}
	set := s.sets[k]
	if set == nil || set.expires <= now {
		set = &memSlotSet{in: map[uint64]struct{}{}}
		s.sets[k] = set
	}
	set.in[seq] = struct{}{}
	set.expires = now + globalTTL(p, start, float64(now))
}

// released takes slot seq out of the window that starts at taken (µs),
// and reports whether it was there.
func (s *memSlots) released(key []byte, taken float64, now int64, seq uint64) bool {
	k := string(GlobalKey(key, int64(taken)/1000))
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.sets[k]
	if set == nil || set.expires <= now {
		return false
	}
	if _, ok := set.in[seq]; !ok {
		return false
	}
	delete(set.in, seq)
	return true
}

const (
	memShards = 64
	// Every sweepEvery calls to a shard, up to sweepBatch of its counters
	// are checked for expiry: enough to keep up with any rate of new keys
	// (a shard sweeps sweepBatch/sweepEvery per call), cheap per call.
	sweepEvery = 1024
	sweepBatch = 2048
)

type memShard struct {
	mu      sync.Mutex
	entries map[string]*memEntry
	globals map[string]*memGlobal // windows of global counters, by GlobalKey
	// settled are the counters' settlements of reservations, by the
	// counter's key and the minute they end (settledKey).
	settled map[string]*settledMarks
	calls   int
	_       [24]byte // keep shards on separate cache lines
}

// memGlobal is one window of a global counter: the fields of global.go,
// this region's apart (p, n) and the others' in slots, with the sum of
// the others' P less their N kept as they change.
type memGlobal struct {
	p, n    uint64
	slots   []crdt.Slot // other regions', in region order
	others  float64
	expires int64 // µs
	// added is, per replica, what AddGlobal has counted of its
	// admissions without the store.
	added map[string]uint64
}

// view is the window as decideGlobal reads it.
func (g *memGlobal) view() globalView {
	if g == nil {
		return globalView{}
	}
	return globalView{p: float64(g.p), n: float64(g.n), total: g.others + float64(g.p) - float64(g.n)}
}

// raise raises another region's slot to s, where lower; it returns how
// many of its two fields it raised.
func (g *memGlobal) raise(s crdt.Slot) int {
	i, ok := slices.BinarySearchFunc(g.slots, s.Region, slotRegion)
	if !ok {
		if s.P == 0 && s.N == 0 {
			return 0
		}
		g.slots = slices.Insert(g.slots, i, crdt.Slot{Region: s.Region})
	}
	old := &g.slots[i]
	raised := 0
	if s.P > old.P {
		g.others += float64(s.P - old.P)
		old.P = s.P
		raised++
	}
	if s.N > old.N {
		g.others -= float64(s.N - old.N)
		old.N = s.N
		raised++
	}
	return raised
}

// all returns every region's slot, this one's (region) included, in
// region order.
func (g *memGlobal) all(region string) []crdt.Slot {
	out := make([]crdt.Slot, 0, len(g.slots)+1)
	for _, s := range g.slots {
		if s.P != 0 || s.N != 0 {
			out = append(out, s)
		}
	}
	if g.p > 0 || g.n > 0 {
		i, _ := slices.BinarySearchFunc(out, region, slotRegion)
		out = slices.Insert(out, i, crdt.Slot{Region: region, P: g.p, N: g.n})
	}
	return out
}

// slotRegion orders slots by region, for a search by region's name.
func slotRegion(s crdt.Slot, region string) int { return strings.Compare(s.Region, region) }

type memEntry struct {
	s       State
	alg     Algorithm // state written by another algorithm is no state
	expires int64     // µs
}

// NewMemoryStore returns an empty store that reads time from clock; nil
// means the system clock.
func NewMemoryStore(clock func() time.Time) *MemoryStore {
	m := &MemoryStore{seed: maphash.MakeSeed(), now: func() int64 { return time.Now().UnixMicro() }}
	if clock != nil {
		m.now = func() int64 { return clock().UnixMicro() }
	}
	for i := range m.shards {
		m.shards[i].entries = map[string]*memEntry{}
		m.shards[i].globals = map[string]*memGlobal{}
		m.shards[i].settled = map[string]*settledMarks{}
	}
	return m
}

// SetRegion names the region whose slot of global counters this store
// counts in. Call it before first use.
func (m *MemoryStore) SetRegion(region string) { m.region = region }

func (m *MemoryStore) shard(key []byte) int {
	return int(maphash.Bytes(m.seed, key) % memShards)
}

// lock locks the shards of all ops, in order so that concurrent requests
// cannot deadlock, and returns them for unlock. shards[i] is op i's shard.
func (m *MemoryStore) lock(shards, buf []int) []int {
	idx := append(buf[:0], shards...)
	if len(idx) > 1 {
		slices.Sort(idx)
		idx = slices.Compact(idx)
	}
	for _, s := range idx {
		m.shards[s].mu.Lock()
	}
	return idx
}

func (m *MemoryStore) unlock(idx []int) {
	for _, s := range idx {
		m.shards[s].mu.Unlock()
	}
}

// get returns key's entry, or nil, and its live state for algorithm alg;
// the caller holds its shard's lock.
func (m *MemoryStore) get(sh *memShard, key []byte, alg Algorithm, now int64) (*memEntry, State) {
	e := sh.entries[string(key)]
	if e != nil && e.expires > now && e.alg == alg {
		return e, e.s
	}
	return e, State{}
}

// put stores the state of key in e (a new entry if nil) until it no longer
// matters.
func (m *MemoryStore) put(sh *memShard, e *memEntry, key []byte, p *Params, s *State, now int64) {
	if e == nil {
		e = &memEntry{}
		sh.entries[string(key)] = e
	}
	e.s, e.alg, e.expires = *s, p.Algorithm, now+ttl(p, s, now)
}

func (m *MemoryStore) sweep(sh *memShard, now int64) {
	if sh.calls++; sh.calls%sweepEvery != 0 {
		return
	}
	n := 0
	for k, e := range sh.entries {
		if e.expires <= now {
			delete(sh.entries, k)
		}
		if n++; n == sweepBatch {
			return
		}
	}
	for k, g := range sh.globals {
		if g.expires <= now {
			delete(sh.globals, k)
		}
		if n++; n == sweepBatch {
			return
		}
	}
	for k, mk := range sh.settled {
		if mk.until <= now {
			delete(sh.settled, k)
		}
		if n++; n == sweepBatch {
			return
		}
	}
}

// globalWindow finds one window of a global counter, or nil; it returns
// the window's key, built in buf. The caller holds the shard's lock.
func (m *MemoryStore) globalWindow(sh *memShard, key []byte, start float64, now int64, buf []byte) (*memGlobal, []byte) {
	k := appendGlobalKey(buf[:0], key, int64(start)/1000)
	g := sh.globals[string(k)]
	if g == nil || g.expires <= now {
		return nil, k
	}
	return g, k
}

// decideGlobal decides a global op (see global.go), and returns the window
// it counts in (nil if there is none yet); the caller holds the shard's
// lock.
func (m *MemoryStore) decideGlobal(sh *memShard, op *Op, now int64, r *Result) *memGlobal {
	start, prevStart := globalWindows(&op.Params, float64(now))
	var buf [160]byte
	g, k := m.globalWindow(sh, op.Key, start, now, buf[:])
	if (op.KnownP > 0 || op.KnownN > 0) && op.KnownStart*1000 == int64(start) {
		g = m.raiseGlobal(sh, g, k, op, start, now)
	}
	cur := g.view()
	var prev globalView
	if op.Params.carriesPrev() {
		pg, _ := m.globalWindow(sh, op.Key, prevStart, now, buf[:])
		prev = pg.view()
	}
	decideGlobalOp(op, &cur, &prev, now, r)
	return g
}

// decideGlobalOp decides a global op on the views of its window and the
// one before.
func decideGlobalOp(op *Op, cur, prev *globalView, now int64, r *Result) {
	*r = Result{}
	decideGlobal(&op.Params, cur, prev, float64(now), float64(op.Cost), float64(op.Allowance), float64(op.Ceiling), r)
	r.OwnP, r.OwnN = uint64(cur.p), uint64(cur.n)
	if op.Params.Algorithm == Concurrency {
		r.PrevP, r.PrevN = uint64(prev.p), uint64(prev.n)
	}
	if r.Allowed || op.Debt {
		r.Taken = op.Cost // counted whatever the decision with Debt: in the region's slot, past its share
	}
}

// tallyView is a window of the copy as decideGlobal reads it.
func tallyView(t crdt.Tally) globalView {
	p, n := float64(t.P), float64(t.N)
	return globalView{p: p, n: n, total: p - n + float64(t.OthersP) - float64(t.OthersN)}
}

// decideInCopy decides a global op against the copy c (see
// MemoryStore.copy); the caller holds the copy's lock.
func decideInCopy(c *crdt.Counters, op *Op, now int64, r *Result) {
	start, prevStart := globalWindows(&op.Params, float64(now))
	cur := tallyView(c.Tally(op.Key, int64(start)/1000))
	var prev globalView
	if op.Params.carriesPrev() {
		prev = tallyView(c.Tally(op.Key, int64(prevStart)/1000))
	}
	decideGlobalOp(op, &cur, &prev, now, r)
}

// countInCopy counts an admitted global op in this region's slot of the
// copy c, and returns the slot after; the caller holds the copy's lock.
func countInCopy(c *crdt.Counters, op *Op, now int64) (p, n uint64) {
	start, _ := globalWindows(&op.Params, float64(now))
	return c.IncKey(op.Key, int64(start)/1000, uint64(max(0, op.Cost)))
}

// raiseGlobal raises this region's slot of the window g (key k, nil if
// absent) to the op's known P and N (see Op.KnownP), and returns the
// window; the caller holds the shard's lock.
func (m *MemoryStore) raiseGlobal(sh *memShard, g *memGlobal, k []byte, op *Op, start float64, now int64) *memGlobal {
	if g != nil && op.KnownP <= g.p && op.KnownN <= g.n {
		return g
	}
	if g == nil {
		g = &memGlobal{}
		sh.globals[string(k)] = g
	}
	g.p, g.n = max(g.p, op.KnownP), max(g.n, op.KnownN)
	g.expires = now + globalTTL(&op.Params, start, float64(now))
	return g
}

// addGlobal counts n in this region's P (or N, if neg) of the window g
// (nil: the window holding at, made if need be); the caller holds the
// shard's lock. It returns the region's P and N after.
func (m *MemoryStore) addGlobal(sh *memShard, g *memGlobal, key []byte, p *Params, now, at int64, neg bool, n uint64) (uint64, uint64) {
	start, _ := globalWindows(p, float64(at))
	if g == nil {
		var buf [160]byte
		var k []byte
		if g, k = m.globalWindow(sh, key, start, now, buf[:]); g == nil {
			g = &memGlobal{}
			sh.globals[string(k)] = g
		}
	}
	if neg {
		g.n = satAdd(g.n, n)
	} else {
		g.p = satAdd(g.p, n)
	}
	g.expires = now + globalTTL(p, start, float64(now))
	return g.p, g.n
}

func satAdd(a, b uint64) uint64 {
	if c := a + b; c >= a {
		return c
	}
	return math.MaxUint64
}

// Apply implements Store.
func (m *MemoryStore) Apply(_ context.Context, ops []Op, results []Result) (int64, error) {
	now := m.now()
	m.apply(ops, results, now)
	return now, nil
}

// apply is Apply at a time the caller read already.
func (m *MemoryStore) apply(ops []Op, results []Result, now int64) {
	if len(ops) == 1 && !ops[0].Global { // most requests meet one limit: no buffers, no ordering
		op, sh := &ops[0], &m.shards[m.shard(ops[0].Key)]
		sh.mu.Lock()
		e, s := m.get(sh, op.Key, op.Params.Algorithm, now)
		decideOp(op, &s, now, &results[0])
		if writes(op, &results[0], true) {
			m.put(sh, e, op.Key, &op.Params, &s, now)
		}
		m.sweep(sh, now)
		sh.mu.Unlock()
		return
	}
	if len(ops) == 1 && m.copy != nil { // one global limit: the copy's lock alone
		op, r := &ops[0], &results[0]
		m.copy.mu.Lock()
		decideInCopy(m.copy.c, op, now, r)
		if writes(op, r, true) {
			r.OwnP, r.OwnN = countInCopy(m.copy.c, op, now)
			m.tookSlot(op, r, now)
		}
		m.copy.mu.Unlock()
		return
	}
	// Room for requests of up to 3 limits without allocating; more is rare.
	var shardBuf, lockBuf [3]int
	var stateBuf [3]State
	var entryBuf [3]*memEntry
	var globalBuf [3]*memGlobal
	shards, next, entries, globals := shardBuf[:0], stateBuf[:0], entryBuf[:0], globalBuf[:0]
	for i := range ops {
		shards = append(shards, m.shard(ops[i].Key))
	}
	idx := m.lock(shards, lockBuf[:])
	defer m.unlock(idx)
	inCopy := m.copy != nil && slices.ContainsFunc(ops, func(op Op) bool { return op.Global })
	if inCopy { // after the shards' locks, always
		m.copy.mu.Lock()
		defer m.copy.mu.Unlock()
	}
	for i := range ops {
		op := &ops[i]
		if op.Global {
			next, entries = append(next, State{}), append(entries, nil)
			if inCopy {
				decideInCopy(m.copy.c, op, now, &results[i])
				globals = append(globals, nil)
				continue
			}
			globals = append(globals, m.decideGlobal(&m.shards[shards[i]], op, now, &results[i]))
			continue
		}
		e, cur := m.get(&m.shards[shards[i]], op.Key, op.Params.Algorithm, now)
		next, entries, globals = append(next, cur), append(entries, e), append(globals, nil)
		decideOp(op, &next[i], now, &results[i])
	}
	commit := commits(ops, results)
	for i := range ops {
		switch op, r := &ops[i], &results[i]; {
		case !writes(op, r, commit):
		case !op.Global:
			m.put(&m.shards[shards[i]], entries[i], op.Key, &op.Params, &next[i], now)
		case inCopy:
			r.OwnP, r.OwnN = countInCopy(m.copy.c, op, now)
			m.tookSlot(op, r, now)
		default:
			r.OwnP, r.OwnN = m.addGlobal(&m.shards[shards[i]], globals[i], op.Key, &op.Params, now, now, false, uint64(op.Cost))
			m.tookSlot(op, r, now)
		}
	}
	for _, s := range idx {
		m.sweep(&m.shards[s], now)
	}
}

// tookSlot notes the slot a global concurrency limit's op took (a cost of
// 1), numbered by the region's P after it, as limits.lua does.
func (m *MemoryStore) tookSlot(op *Op, r *Result, now int64) {
	if op.Params.Algorithm == Concurrency && op.Cost > 0 {
		m.slotsIn.taken(op.Key, &op.Params, now, r.OwnP)
	}
}

// Inspect implements Store.
func (m *MemoryStore) Inspect(_ context.Context, key []byte, p Params) (Result, error) {
	sh := &m.shards[m.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := m.now()
	_, cur := m.get(sh, key, p.Algorithm, now)
	return inspect(p, cur, now), nil
}

// inspect is what a request of cost 0 would see: it always allows and
// takes nothing, and writes nothing, so s may be the state stored.
func inspect(p Params, s State, now int64) Result {
	r, _ := Decide(p, s, now, 0)
	return r
}

// Reset implements Store.
func (m *MemoryStore) Reset(_ context.Context, key []byte, _ Params) error {
	sh := &m.shards[m.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.entries, string(key))
	return nil
}

// Grant implements Store.
func (m *MemoryStore) Grant(_ context.Context, key []byte, p Params, n int64) (Result, error) {
	r, _ := m.giveBack(key, p, n, -1)
	return r, nil
}

// Refund implements Store.
func (m *MemoryStore) Refund(_ context.Context, key []byte, p Params, n, at int64) (int64, error) {
	_, applied := m.giveBack(key, p, n, at)
	return applied, nil
}

// Settle implements Store.
func (m *MemoryStore) Settle(_ context.Context, ops []SettleOp, mark string, until, actual int64, out []Settlement) (int64, error) {
	var shardBuf, lockBuf [3]int
	shards := shardBuf[:0]
	for i := range ops {
		shards = append(shards, m.shard(ops[i].Key))
	}
	idx := m.lock(shards, lockBuf[:])
	defer m.unlock(idx)
	now := m.now()
	// An expiry is made until the counters' settlements of its minute are
	// no longer kept (settledMarks.until), as in limits.lua; one before
	// the end by this clock does nothing yet (ended).
	ended := now >= until && (actual != settleExpired || now >= settledBucket(until)*60e6+60e6) || actual == settleExpired && now < until
	// Each counter's settlements of that minute, read first: refused whole
	// if one keeps as many as it may (and has not this one), nothing is
	// written.
	keys, mks := make([]string, len(ops)), make([]*settledMarks, len(ops))
	refused := false
	for i := range ops {
		sh := &m.shards[shards[i]]
		keys[i] = settledKey(string(ops[i].Key), until)
		mk := sh.settled[keys[i]]
		if mk != nil && mk.until <= now {
			delete(sh.settled, keys[i])
			mk = nil
		}
		if ops[i].Params.Algorithm == Concurrency {
			continue // a slot keeps no settlement: it is freed once
		}
		if mks[i] = mk; !ended && mk != nil {
			_, settled := mk.charged[mark]
			refused = refused || !settled && len(mk.charged) >= settledCap(ops[i].Params)
		}
	}
	// made decides counter i's part from its settlements: ended, made
	// before (again, with what it charged then), refused (full), or made
	// now, its mark kept; it reports the last.
	made := func(i int, charged int64, out *Settlement) bool {
		var prev int64
		settled := false
		if mks[i] != nil {
			prev, settled = mks[i].charged[mark]
		}
		switch {
		case ended:
			out.Ended = true
		case settled:
			out.Again, out.Charged = true, prev
		case refused:
			out.Full = true
		default:
			if mks[i] == nil {
				mks[i] = &settledMarks{charged: map[string]int64{}, until: settledBucket(until)*60e6 + 60e6}
				m.shards[shards[i]].settled[keys[i]] = mks[i]
			}
			mks[i].charged[mark] = charged
			return true
		}
		return false
	}
	for i := range ops {
		op, sh := &ops[i], &m.shards[shards[i]]
		if op.Global && op.Params.Algorithm == Concurrency {
			// A slot leaves its window's set once (its Estimate is its
			// number there), freed into that window (limits.lua alike).
			out[i] = Settlement{}
			taken, counts := slotWindow(&op.Params, op.At, now)
			released := false
			switch {
			case ended:
				out[i].Ended = true
			case refused: // another counter keeps as many settlements as it may
				out[i].Full = true
			case op.Stale:
			case counts && m.slotsIn.released(op.Key, taken, now, uint64(op.Estimate)):
				released = true
			default:
				out[i].Again = true // released before, or freed by itself
			}
			m.settleGlobal(sh, op, now, actual, released, &out[i].Result)
			continue
		}
		if op.Global {
			out[i] = Settlement{Charged: max(0, actual)}
			apply := made(i, out[i].Charged, &out[i])
			m.settleGlobal(sh, op, now, actual, apply && !op.Stale, &out[i].Result)
			continue
		}
		e, cur := m.get(sh, op.Key, op.Params.Algorithm, now)
		if op.Params.Algorithm == Concurrency {
			out[i] = Settlement{Result: inspect(op.Params, cur, now)} // a slot charges nothing
			switch {
			case ended:
				out[i].Ended = true
			case op.Stale:
			case settle(op, &cur, now, actual, &out[i]):
				m.put(sh, e, op.Key, &op.Params, &cur, now)
			default:
				out[i].Again = true // freed before, or freed itself
			}
			continue
		}
		out[i] = Settlement{Charged: max(0, actual), Result: inspect(op.Params, cur, now)}
		if made(i, out[i].Charged, &out[i]) && !op.Stale && settle(op, &cur, now, actual, &out[i]) {
			m.put(sh, e, op.Key, &op.Params, &cur, now)
		}
	}
	m.sweep(&m.shards[shards[0]], now)
	return now, nil
}

// settleGlobal settles a reservation's part of a global limit, if apply
// (limits.lua's 'settle' of a global limit, alike): what comes back goes
// to the region's N in the window the estimate was taken in, while that
// window holds; what a commit charges past the estimate, to its P now.
// r is the limit as a check of cost 0 sees it after. The caller holds the
// shard's lock.
func (m *MemoryStore) settleGlobal(sh *memShard, op *SettleOp, now, actual int64, apply bool, r *Result) {
	start, _ := globalWindows(&op.Params, float64(now))
	taken, counts := slotWindow(&op.Params, op.At, now)
	var back, extra uint64
	switch {
	case !apply:
	case op.Params.Algorithm == Concurrency:
		// A slot released (apply: it was in flight): freed, into the
		// window it was taken in.
		back = 1
	case actual < 0 || actual <= op.Estimate:
		if actual < 0 {
			actual = 0
		}
		if taken == start {
			back = uint64(op.Estimate - actual)
		}
	default:
		extra = uint64(actual - op.Estimate)
	}
	gop := Op{Key: op.Key, Params: op.Params, Global: true, Allowance: op.Allowance, Ceiling: op.Ceiling}
	if m.copy != nil {
		m.copy.mu.Lock()
		defer m.copy.mu.Unlock()
		m.copy.c.Dec(crdt.ID{Key: string(op.Key), Epoch: int64(taken) / 1000}, back)
		m.copy.c.Inc(crdt.ID{Key: string(op.Key), Epoch: int64(start) / 1000}, extra)
		decideInCopy(m.copy.c, &gop, now, r)
		if op.Params.Algorithm == Concurrency {
			r.OwnP, r.OwnN, r.PrevP, r.PrevN = 0, 0, 0, 0
			if counts {
				t := m.copy.c.Tally(op.Key, int64(taken)/1000)
				r.OwnP, r.OwnN = t.P, t.N
			}
		}
		return
	}
	if back > 0 {
		m.addGlobal(sh, nil, op.Key, &op.Params, now, op.At, true, back)
	}
	if extra > 0 {
		m.addGlobal(sh, nil, op.Key, &op.Params, now, now, false, extra)
	}
	m.decideGlobal(sh, &gop, now, r)
	if op.Params.Algorithm == Concurrency {
		// The region's slot of the window the slot was taken in, which a
		// release changes (limits.lua alike).
		var v globalView
		if counts {
			var buf [160]byte
			g, _ := m.globalWindow(sh, op.Key, taken, now, buf[:])
			v = g.view()
		}
		r.OwnP, r.OwnN, r.PrevP, r.PrevN = uint64(v.p), uint64(v.n), 0, 0
	}
}

// settledKey is where a counter keeps its settlements of reservations that
// end at until: beside the counter, in its Cluster slot (the key's hash
// tag), one place a minute (settledBucket).
func settledKey(key string, until int64) string {
	return key + ":settled:" + strconv.FormatInt(settledBucket(until), 10)
}

func (m *MemoryStore) giveBack(key []byte, p Params, n, at int64) (Result, int64) {
	sh := &m.shards[m.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := m.now()
	e, cur := m.get(sh, key, p.Algorithm, now)
	s, applied := giveBack(p, cur, now, n, at)
	if applied > 0 {
		m.put(sh, e, key, &p, &s, now)
	}
	return inspect(p, s, now), applied
}

// giveBack returns a counter's state after n is given back to it, and how
// much was: a grant (at < 0), to the counter as it stands, or a refund of
// n taken at time at, which only counts in the window at was in — given to
// a later window it would admit more than the limit. A token bucket or GCRA
// fills by n, at most to full; a window's count goes down by n, below zero
// if need be; a log forgets n units, the newest (a grant) or those logged at
// at (a refund).
func giveBack(p Params, s State, now, n, at int64) (State, int64) {
	t, c := float64(now), float64(n)
	switch p.Algorithm {
	case TokenBucket:
		return State{Exists: true, A: fmin(float64(p.Limit), tbTokens(&p, &s, t)+c), B: t}, n
	case GCRA:
		return State{Exists: true, A: fmax(0, gcraDebt(&p, &s, t)-c), B: t}, n
	case FixedWindow:
		start, count := fwCount(&p, &s, t)
		if at >= 0 && float64(at/p.Window*p.Window) != start {
			return s, 0
		}
		return State{Exists: true, A: start, B: count - c}, n
	case SlidingWindowCounter:
		start, cur, prev := swcCounts(&p, &s, t)
		switch window := float64(at / p.Window * p.Window); {
		case at < 0 || window == start:
			cur -= c
		case window == start-float64(p.Window):
			prev -= c
		default:
			return s, 0
		}
		return State{Exists: true, A: start, B: cur, C: prev}, n
	case SlidingWindowLog, Concurrency:
		sum, log := trimLog(&p, &s, t)
		log = slices.Clone(log)
		given := 0.0
		for i := len(log) - 1; i >= 0 && given < c; i-- {
			if at >= 0 && log[i].At != float64(at) {
				continue
			}
			take := fmin(c-given, log[i].Cost)
			log[i].Cost -= take
			given += take
		}
		log = slices.DeleteFunc(log, func(e LogEntry) bool { return e.Cost == 0 })
		return State{Exists: len(log) > 0, A: sum - given, B: s.B, Log: log}, int64(given)
	}
	return s, 0
}

// MergeGlobal implements GlobalStore.
func (m *MemoryStore) MergeGlobal(_ context.Context, windows []GlobalWindow) (int, error) {
	if m.copy != nil {
		return m.mergeIntoCopy(windows), nil
	}
	now := m.now()
	raised := 0
	var buf [160]byte
	for _, w := range windows {
		sh := &m.shards[m.shard(w.Key)]
		k := appendGlobalKey(buf[:0], w.Key, w.StartMillis)
		sh.mu.Lock()
		g := sh.globals[string(k)]
		stored := g != nil && g.expires > now
		if !stored {
			g = &memGlobal{expires: now + max(1, w.TTL.Microseconds())}
		}
		for _, s := range w.Slots {
			if s.Region == m.region {
				if s.P > g.p {
					g.p, raised = s.P, raised+1
				}
				if s.N > g.n {
					g.n, raised = s.N, raised+1
				}
				continue
			}
			raised += g.raise(s)
		}
		if !stored && (len(g.slots) > 0 || g.p > 0 || g.n > 0) {
			sh.globals[string(k)] = g
		}
		sh.mu.Unlock()
	}
	return raised, nil
}

// AddGlobal implements GlobalStore. A store that keeps global counters in
// the copy is the engine's own memory, which never fails: it has nothing
// to take in, and reports the copy's slots.
func (m *MemoryStore) AddGlobal(_ context.Context, adds []GlobalAdd, slots []crdt.Slot) error {
	now := m.now()
	var buf [160]byte
	for i, a := range adds {
		if m.copy != nil {
			m.copy.with(func(c *crdt.Counters) {
				t := c.Tally(a.Key, a.StartMillis)
				slots[i] = crdt.Slot{Region: m.region, P: t.P, N: t.N}
			})
			continue
		}
		sh := &m.shards[m.shard(a.Key)]
		k := appendGlobalKey(buf[:0], a.Key, a.StartMillis)
		sh.mu.Lock()
		g := sh.globals[string(k)]
		if g == nil || g.expires <= now {
			g = &memGlobal{expires: now + max(1, a.TTL.Microseconds())}
			sh.globals[string(k)] = g
		}
		g.p, g.n = max(g.p, a.KnownP), max(g.n, a.KnownN)
		if done := g.added[a.Replica]; a.Admitted > done {
			if g.added == nil {
				g.added = map[string]uint64{}
			}
			g.p = satAdd(g.p, a.Admitted-done)
			g.added[a.Replica] = a.Admitted
		}
		slots[i] = crdt.Slot{Region: m.region, P: g.p, N: g.n}
		sh.mu.Unlock()
	}
	return nil
}

// Heartbeat implements GlobalStore.
func (m *MemoryStore) Heartbeat(_ context.Context, replica string, unwritten int64, keep time.Duration) ([]ReplicaState, int64, error) {
	now := m.now()
	m.replicasMu.Lock()
	defer m.replicasMu.Unlock()
	if m.replicas == nil {
		m.replicas = map[string]ReplicaState{}
	}
	m.replicas[replica] = ReplicaState{Replica: replica, Unwritten: unwritten, At: now}
	out := make([]ReplicaState, 0, len(m.replicas))
	for name, st := range m.replicas {
		if now-st.At > keep.Microseconds() {
			delete(m.replicas, name)
			continue
		}
		out = append(out, st)
	}
	return out, now, nil
}

// mergeIntoCopy is MergeGlobal for a store that keeps global counters in
// the copy: each slot as gossip from its region would bring it.
func (m *MemoryStore) mergeIntoCopy(windows []GlobalWindow) int {
	raised := 0
	m.copy.with(func(c *crdt.Counters) {
		for _, w := range windows {
			id := crdt.ID{Key: string(w.Key), Epoch: w.StartMillis}
			for _, s := range w.Slots {
				raised += c.Merge(crdt.Delta{Origin: s.Region, Entries: []crdt.Entry{{ID: id, Slots: []crdt.Slot{s}}}}).Applied
			}
		}
	})
	return raised
}

// ReadGlobal implements GlobalStore.
func (m *MemoryStore) ReadGlobal(_ context.Context, key []byte, startMillis int64) ([]crdt.Slot, error) {
	if m.copy != nil {
		var slots []crdt.Slot
		m.copy.with(func(c *crdt.Counters) { slots = c.Slots(crdt.ID{Key: string(key), Epoch: startMillis}) })
		return slots, nil
	}
	sh := &m.shards[m.shard(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	g := sh.globals[string(GlobalKey(key, startMillis))]
	if g == nil || g.expires <= m.now() {
		return nil, nil
	}
	return g.all(m.region), nil
}
