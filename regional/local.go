package regional

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// What a replica decides on its own, without the store: the denial cache
// (with progressive penalties), hot keys' batches, and caps on tracked keys.

// Denial says that a counter is over its limit until a time: what a
// replica tells its siblings so that they deny without asking the store.
type Denial struct {
	Key   string // the counter's store key
	Until time.Time
	// Cost is the smallest cost denied; cheaper requests may still fit.
	Cost    int64
	Limit   int64
	Window  time.Duration
	ResetAt time.Time
}

type denial struct {
	until   int64 // µs, engine clock
	cost    int64
	strikes int   // requests sent while told to wait
	resetAt int64 // µs, engine clock
	// retryAt is when the store said the request could go through
	// (until may be sooner, for a global limit whose room may come back
	// sooner; a denial from the cache says the same as the store).
	retryAt int64
	// What the check that left it looked up of its counter, which the
	// checks it denies would look up again: its budget of its own in the
	// region's budgets of generation heldGen (while those are in force;
	// if heldKnown), what the region counts of it on its own (while not
	// gone), and its violation of this flush (guarded by the violations'
	// lock).
	heldKnown bool
	heldGen   uint64
	held      *heldCounter
	demand    *counterDemand
	viol      violationRef
}

// fromCache denies the request from this replica's memory if it can: a
// limit recently found over, or a key over its rule's cap. It reports
// whether it did; only the limits that denied are then decided.
func (e *Engine) fromCache(sc *scratch, now int64) bool {
	denied := false
	cached := e.denialCount.Load() > 0
	for i := range sc.items {
		it := &sc.items[i]
		if it.refused {
			// A key beyond the rule's cap is refused; a shadow rule only
			// says it would have refused it.
			it.decided = true
			it.result = Result{ResetAt: it.params.resetAt(now), RetryAfter: it.params.WindowMicros()}
			denied = denied || !it.rule.Shadow
			continue
		}
		if it.rule.Shadow || it.batched || !cached || it.rule.CountOverLimit { // its hit goes to the store, denied or not
			continue
		}
		e.denials.with(it.key, func(m map[string]*denial) {
			dn := m[string(it.key)]
			if dn == nil {
				return
			}
			if dn.until <= now {
				delete(m, string(it.key))
				e.denialCount.Add(-1)
				return
			}
			p := it.rule.Penalty
			if p == nil && it.cost < dn.cost {
				return // a cheaper request may fit
			}
			if p != nil {
				// Sent while told to wait: the cooldown doubles, up to its cap.
				dn.strikes++
				cool := p.Base
				for k := 1; k < dn.strikes && cool < p.Max; k++ {
					cool *= 2
				}
				dn.until = max(dn.until, now+min(cool, p.Max).Microseconds())
				e.stats.Penalties.Add(1)
			}
			it.decided, it.cached, denied = true, true, true
			it.result = Result{Remaining: 0, ResetAt: max(dn.resetAt, dn.until), RetryAfter: max(dn.until, dn.retryAt) - now}
			it.dn = dn
			if dn.heldKnown && dn.heldGen == e.global.budgets.heldGen.Load() {
				it.heldGen, it.heldEntry, it.heldKnown = dn.heldGen, dn.held, true
				it.held = liveAt(dn.held, time.UnixMicro(now))
			}
			if d := dn.demand; d != nil && !d.gone.Load() {
				it.demand = d
			}
		})
		if it.cached {
			e.stats.DenialCacheHits.Add(1)
		}
	}
	if !denied {
		return false
	}
	for i := range sc.items { // only the limits that denied speak
		if it := &sc.items[i]; !it.cached && !it.refused {
			it.decided = false
		}
	}
	return true
}

// rememberDenial caches a limit the store found over, until the request
// could be allowed again, and tells the siblings.
func (e *Engine) rememberDenial(it *item, now int64) {
	dn := denial{until: now + it.result.RetryAfter, cost: it.cost, resetAt: now + (it.result.ResetAt - it.storeNow),
		heldKnown: it.heldKnown, heldGen: it.heldGen, held: it.heldEntry, demand: it.demand}
	dn.retryAt = dn.until
	if it.rule.Scope == ScopeGlobal {
		dn.until = min(dn.until, now+globalDenialHold)
	}
	if e.denialCount.Load() >= int64(e.cfg.MaxDenials) {
		return
	}
	e.denials.with(it.key, func(m map[string]*denial) {
		old := m[string(it.key)]
		if old != nil && old.until > now {
			dn.strikes = old.strikes
		}
		if old == nil {
			e.denialCount.Add(1)
		}
		m[string(it.key)] = &dn
		it.dn = &dn
	})
	if e.cfg.OnDenied != nil {
		e.cfg.OnDenied(Denial{Key: string(it.key), Until: time.UnixMicro(dn.until), Cost: dn.cost, Limit: it.params.Limit,
			Window: time.Duration(it.params.WindowMicros()) * time.Microsecond, ResetAt: time.UnixMicro(dn.resetAt)})
	}
}

// ErrInvalidDenial is what NoteDenial refuses a sibling's denial with.
var ErrInvalidDenial = errors.New("regional: invalid denial")

// maxDenialKey bounds the key of a sibling's denial: longer than any
// counter key of a valid request.
const maxDenialKey = 4096

// denialSkew is the difference between siblings' clocks a denial's time
// may carry beyond the longest of its rule's.
const denialSkew = int64(time.Second / time.Microsecond)

// NoteDenial takes a denial a sibling replica found: this replica denies
// the counter from memory until then too. What comes from the network is
// checked: a key of no rule in force, or too long, is refused (an error
// wrapping ErrInvalidDenial, naming the field), and a denial holds no
// longer than one of the rule's can (see denialHold; a second more for
// the siblings' clocks), so a forged one cannot keep a key out for long. A denial already over, or one more than
// the cache holds (Config.MaxDenials), is dropped without error.
func (e *Engine) NoteDenial(d Denial) error {
	if len(d.Key) > maxDenialKey {
		e.stats.DenialsTooLong.Add(1)
		return fmt.Errorf("%w: key: %d bytes, at most %d", ErrInvalidDenial, len(d.Key), maxDenialKey)
	}
	id, _, ok := ParseCounterKey(d.Key)
	r := e.rules.Load().Rule(id)
	if !ok || r == nil {
		e.stats.DenialsUnknownRule.Add(1)
		return fmt.Errorf("%w: key %.60q: of no rule in force", ErrInvalidDenial, d.Key)
	}
	if r.Base.Algorithm == Concurrency {
		return nil // never cached (recordItem): a slot may be released any moment
	}
	now := e.now().UnixMicro()
	hold := now + denialHold(r) + denialSkew
	until := d.Until.UnixMicro()
	if until > hold {
		e.stats.DenialsCapped.Add(1)
		until = hold
	}
	if until <= now || e.denialCount.Load() >= int64(e.cfg.MaxDenials) {
		return nil
	}
	key := []byte(d.Key)
	e.denials.with(key, func(m map[string]*denial) {
		old := m[d.Key]
		if old != nil && old.until >= until {
			return
		}
		if old == nil {
			e.denialCount.Add(1)
		}
		dn := &denial{until: until, cost: max(1, d.Cost), resetAt: min(d.ResetAt.UnixMicro(), hold)}
		if r.Scope == ScopeGlobal {
			// As this replica's own denial says (rememberDenial): held
			// briefly, for a new lease may come, but retry at the window's
			// end, at most a window away.
			dn.resetAt = min(d.ResetAt.UnixMicro(), now+r.Base.WindowMicros()+denialSkew)
			dn.retryAt = dn.resetAt
		}
		m[d.Key] = dn
	})
	return nil
}

// denialHold is the longest a denial of rule r can last (µs): a denial of
// a global limit is held globalDenialHold; one of a local limit until its
// counter has room again, at most a window of its largest limit (a token
// bucket's time to fill; two windows for a sliding window, whose last one
// weighs on the next), or its longest cooldown, if it has one.
func denialHold(r *Rule) int64 {
	if r.Scope == ScopeGlobal {
		return globalDenialHold
	}
	hold := r.Base.WindowMicros()
	for _, limits := range []map[string]int64{r.Tiers, r.Overrides} {
		for _, n := range limits {
			p := r.Base
			p.Limit = n
			hold = max(hold, p.WindowMicros())
		}
	}
	if r.Base.Algorithm == SlidingWindowCounter {
		hold *= 2
	}
	if r.Penalty != nil {
		hold = max(hold, r.Penalty.Max.Microseconds())
	}
	return hold
}

// batch is a batch of a limit taken from the store at once, served from
// this replica's memory.
type batch struct {
	tokens  int64
	expires int64 // µs, engine clock
	takenAt int64 // µs, store clock: where what is left goes back to
	params  Params
	left    int64 // what the store had left when the batch was taken
	resetAt int64 // µs, engine clock
}

type batchReturn struct {
	key     string
	params  Params
	n       int64
	takenAt int64
	tries   int
}

// takeBatches serves what it can of the request from batches.
func (e *Engine) takeBatches(sc *scratch, now int64) {
	for i := range sc.items {
		it := &sc.items[i]
		if it.rule.Batch == 0 {
			continue
		}
		e.batches.with(it.key, func(m map[string]*batch) {
			l := m[string(it.key)]
			if l == nil {
				return
			}
			if l.expires <= now || l.params != it.params {
				delete(m, string(it.key))
				e.endBatch(string(it.key), l)
				return
			}
			if l.tokens < it.cost {
				return
			}
			l.tokens -= it.cost
			it.decided, it.batched = true, true
			it.result = Result{Allowed: true, Remaining: l.left + l.tokens, ResetAt: l.resetAt, Taken: it.cost}
		})
		if it.batched {
			e.stats.BatchHits.Add(1)
		}
	}
}

// unconsumeBatch puts back what a request took from a batch when another
// limit denied it.
func (e *Engine) unconsumeBatch(it *item) {
	e.batches.with(it.key, func(m map[string]*batch) {
		if l := m[string(it.key)]; l != nil {
			l.tokens += it.cost
		}
	})
}

// keepBatch keeps what a limit took beyond the request's cost, to serve the
// next requests from memory. A window's batch ends with its window: its
// tokens are worth nothing after, and giving them back would over-admit.
func (e *Engine) keepBatch(it *item, now int64) {
	extra := it.result.Taken - it.cost
	e.stats.BatchTaken.Add(it.result.Taken)
	l := &batch{tokens: extra, expires: now + e.cfg.BatchTTL.Microseconds(), takenAt: it.storeNow, params: it.params,
		left: it.result.Remaining, resetAt: now + (it.result.ResetAt - it.storeNow)}
	if w := it.params.Window; w > 0 { // a window's tokens are worth nothing after it
		end := (it.storeNow/w + 1) * w
		l.expires = min(l.expires, now+(end-it.storeNow))
	}
	e.batches.with(it.key, func(m map[string]*batch) {
		old := m[string(it.key)]
		switch {
		case old != nil && old.expires > now && old.params == l.params:
			// Concurrent requests found the batch empty together and each
			// took one: they join, so no token is stranded.
			old.tokens += l.tokens
			old.expires = max(old.expires, l.expires)
			old.left, old.resetAt = l.left, l.resetAt
			return
		case old != nil:
			e.endBatch(string(it.key), old)
		}
		m[string(it.key)] = l
	})
}

// endBatch queues what is left of a batch to go back to the store, into
// the window it was taken from (if that window has passed, it lapses).
func (e *Engine) endBatch(key string, l *batch) {
	if l.tokens <= 0 {
		return
	}
	e.returnsMu.Lock()
	e.returns = append(e.returns, batchReturn{key: key, params: l.params, n: l.tokens, takenAt: l.takenAt})
	e.returnsMu.Unlock()
}

type keyAdmission int

const (
	keyAdmitted keyAdmission = iota
	keyFolded
	keyRefused
)

// keyTracker counts the keys a rule tracks in this replica, and when each
// was last seen. It holds a 64-bit hash of each key, seeded afresh in each
// process (no one can aim two keys at one hash), not the key: a check of a
// known key costs one lookup in a map of integers.
type keyTracker struct {
	n      atomic.Int64
	seed   maphash.Seed
	shards [64]struct {
		mu sync.Mutex
		m  map[uint64]keySeen // by the key's hash
		_  [48]byte           // separate cache lines
	}
}

// keySeen is when a tracked key was last seen (µs), and the generation of
// the region's count (see regionKeys) it was last counted in.
type keySeen struct{ seen, gen int64 }

func newKeyTracker() *keyTracker {
	tr := &keyTracker{seed: maphash.MakeSeed()}
	for i := range tr.shards {
		tr.shards[i].m = map[uint64]keySeen{}
	}
	return tr
}

// keySeenEvery is how stale a known key's last-seen time may grow, as a
// fraction of how long a key is tracked unseen (regionKeysGen), before a
// check writes it again: most checks of a known key only read.
const keySeenEvery = 16

// known reports whether the tracker holds key (hash h), noting it seen,
// and the generation it was last counted in.
func (tr *keyTracker) known(h uint64, us, idle int64) (found bool, gen int64) {
	sh := &tr.shards[h%uint64(len(tr.shards))]
	sh.mu.Lock()
	k, found := sh.m[h]
	if found && us-k.seen > idle/keySeenEvery {
		sh.m[h] = keySeen{us, k.gen}
	}
	sh.mu.Unlock()
	return found, k.gen
}

// add tracks key (hash h) from now on, counted in generation gen.
func (tr *keyTracker) add(h uint64, us, gen int64) {
	sh := &tr.shards[h%uint64(len(tr.shards))]
	sh.mu.Lock()
	if _, ok := sh.m[h]; !ok {
		tr.n.Add(1)
	}
	sh.m[h] = keySeen{us, gen}
	sh.mu.Unlock()
}

// remove stops tracking key (hash h).
func (tr *keyTracker) remove(h uint64) {
	sh := &tr.shards[h%uint64(len(tr.shards))]
	sh.mu.Lock()
	if _, ok := sh.m[h]; ok {
		delete(sh.m, h)
		tr.n.Add(-1)
	}
	sh.mu.Unlock()
}

// forget drops the keys not seen for longer than idle (µs).
func (tr *keyTracker) forget(us, idle int64) {
	idle += idle / keySeenEvery // a last-seen time may be that much behind
	for i := range tr.shards {
		sh := &tr.shards[i]
		sh.mu.Lock()
		for h, k := range sh.m {
			if us-k.seen > idle {
				delete(sh.m, h)
				tr.n.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// TrackedKeys calls f for each rule with a cap on its keys: the keys this
// replica tracks of it, and the cap.
func (e *Engine) TrackedKeys(f func(rule string, tracked int64, max int)) {
	for _, r := range e.rules.Load().Rules() {
		if r.MaxKeys == 0 {
			continue
		}
		var n int64
		if m := e.trackers.Load(); m != nil && (*m)[r.ID] != nil {
			n = (*m)[r.ID].n.Load()
		}
		f(r.ID, n, r.MaxKeys)
	}
}

// regionKeys is a store shared by a region's replicas that counts a rule's
// keys across them, so that max_keys holds for the region, not for each
// replica. It counts in generations of regionKeysGen(window): a key seen in
// a generation is counted in it, and a new key passes only while neither
// this generation nor the one before holds max keys, so that it holds at
// most about twice max. A replica asks it of a key new to it, and of each
// key it tracks once a generation, to count the key in it.
type regionKeys interface {
	admitKey(ctx context.Context, rule string, key []byte, max int, gen, genUs int64, deadline time.Time) (bool, error)
}

// regionKeysGen is the length (µs) of a generation of the region's count
// of a rule's keys, for a rule of the given window: at least a minute, so
// that a replica asks about each key it tracks at most once a minute. It
// is also how long a replica tracks a key unseen: a key counts while it
// was seen in the last window of the rule, and at least in the last
// minute.
func regionKeysGen(windowUs int64) int64 { return max(windowUs, int64(time.Minute/time.Microsecond)) }

// tracker returns the key tracker of a rule, made if it has none.
func (e *Engine) tracker(rule string) *keyTracker {
	if m := e.trackers.Load(); m != nil {
		if tr := (*m)[rule]; tr != nil {
			return tr
		}
	}
	e.trackersMu.Lock()
	defer e.trackersMu.Unlock()
	var cur map[string]*keyTracker
	if m := e.trackers.Load(); m != nil {
		cur = *m
	}
	if tr := cur[rule]; tr != nil {
		return tr
	}
	next := make(map[string]*keyTracker, len(cur)+1)
	maps.Copy(next, cur)
	tr := newKeyTracker()
	next[rule] = tr
	e.trackers.Store(&next)
	return tr
}

// dropTrackers forgets the key trackers of rules.
func (e *Engine) dropTrackers(rules []string) {
	e.trackersMu.Lock()
	defer e.trackersMu.Unlock()
	next := maps.Clone(*e.trackers.Load())
	for _, id := range rules {
		delete(next, id)
	}
	e.trackers.Store(&next)
}

// admitKey applies a rule's cap on tracked keys: a key this replica
// tracks passes; a new one is asked of the region (a shared store that
// counts keys across replicas), or, when the store cannot answer or keeps
// no count, held to the cap by this replica's own count.
func (e *Engine) admitKey(ctx context.Context, r *Rule, key []byte, now time.Time) keyAdmission {
	tr := e.tracker(r.ID)
	us, genUs := now.UnixMicro(), regionKeysGen(r.Base.WindowMicros())
	gen := us / genUs
	h := maphash.Bytes(tr.seed, key)
	found, counted := tr.known(h, us, genUs)
	if found && (counted == gen || e.keys == nil) {
		return keyAdmitted
	}
	admit, asked := false, false
	if e.keys != nil && e.breaker.State() == BreakerClosed {
		// Timeouts are real time, whatever clock the engine runs on; the
		// breaker is the decision's call to judge.
		ok, err := e.keys.admitKey(ctx, r.ID, key, r.MaxKeys, gen, genUs, time.Now().Add(e.cfg.Timeout))
		if err == nil {
			admit, asked = ok, true
		} else if ctx.Err() == nil {
			e.storeError(err, us)
		}
	}
	if !asked { // a key it tracks stays; a new one within its own count
		admit = found || tr.n.Load() < int64(r.MaxKeys)
	}
	if !admit {
		if found {
			// Unseen for a generation, the region no longer counts it,
			// and has no room for it again: forgotten here too, so that
			// it is asked about once, not at every check.
			tr.remove(h)
		}
		if r.FoldOverflow {
			e.stats.KeysFolded.Add(1)
			return keyFolded
		}
		e.stats.KeysRefused.Add(1)
		return keyRefused
	}
	tr.add(h, us, gen) // unasked, it is asked again next generation
	return keyAdmitted
}

// forgetDenials empties the denial cache (tests).
func (e *Engine) forgetDenials() {
	e.denials.sweep(func(string, *denial) bool {
		e.denialCount.Add(-1)
		return true
	})
}
