package regional

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geoquota/geoquota/crdt"
)

// A global limit never fails open. When the shared store cannot answer (an
// error, a call past its timeout, the breaker open), a global rule's
// fallback is, unless it says fail_closed (or, for an elastic rule,
// fail_open), its part of what the region may still admit, counted in
// this replica's memory: a replica admits in memory, in a window, while
//
//	admitted + cost <= (allowance - (counted - written)) / replicas
//
// where admitted is what it admitted of the window without the store,
// written how much of that the store has counted, allowance the region's
// lease or floor (as the store would have applied it), counted what the
// engine's copy of the global counters holds of the region's own slot in
// the window (its store's answers, its siblings' gossip), and replicas the
// replicas of the region alive, as they last told each other through the
// store. The replicas of a region lose a shared store together and each
// keeps to its part, so that together they admit no more than the
// region's allowance, in any mode.
//
// Their parts are of the same count only once each has heard the others':
// the sibling that had the last answer before the store stopped knows the
// most, and tells the others in its next gossip (ObserveOwn). So a replica
// with siblings admits nothing of a global limit in memory during the
// first GlobalConfig.Lag of an outage (500ms by default: a gossip round
// and the time on the wire); one alone need not wait.
//
// What a replica admits so is written to the region's slot in the store
// once it answers again (Maintain: GlobalStore.AddGlobal, once per replica
// and window whatever the retries), and the store's answer goes into the
// copy, so that the gossip and globalsync's books count it. From its first
// failure until then, and until every sibling has said in the store, after
// that, that it has written its own (GlobalStore.Heartbeat, at every
// Maintain), the replica decides every global limit in memory: the store
// must not admit again what a replica already admitted. A call that timed
// out is not counted by the store when it runs late (the Redis store's
// calls carry the time past which they do nothing), so a request is
// counted once, by the store or here.
//
// What this does not cover: a replica that alone cannot reach a store its
// siblings reach (its own network) admits its part in memory while they
// admit through the store; a sibling silent in the store for
// replicaSilence is no longer waited for; a replica that dies before it
// writes loses what it admitted. Each is bounded by a replica's part, and
// what is written shows in the books.

// degradedGlobals counts, per window of a global counter, what this
// replica admitted without its store. Safe for concurrent use.
type degradedGlobals struct {
	mu      sync.Mutex
	windows map[string]*degradedWindow // by GlobalKey
	// unwritten counts the windows with admissions not yet in the store.
	unwritten atomic.Int64
	// episode is set from the store's first failure until this replica
	// and every sibling have written what they admitted without it;
	// outage is when it began (µs, the engine's clock).
	episode atomic.Bool
	outage  atomic.Int64
	// written is the store's time at which this replica, in an episode,
	// had written everything (0: not yet); the episode ends when every
	// sibling has said so since. Maintain's alone.
	written int64
	// replicas is how many replicas of the region were alive at the last
	// heartbeat, this one included.
	replicas atomic.Int64
}

type degradedWindow struct {
	key      []byte // the counter's key
	start    int64  // µs
	until    int64  // µs: when the window stops mattering (globalUntil)
	admitted uint64 // by this replica without the store
	written  uint64 // of which the store has counted
	// used is the most the region may have used of the window as this
	// replica decided in memory: what it reports to the budgets until
	// the store has every replica's admissions (usedBound).
	used uint64
}

func (w *degradedWindow) pending() bool { return w.admitted > w.written }

// storeFailed notes a call to the store that failed at now (µs).
func (d *degradedGlobals) storeFailed(now int64) {
	if !d.episode.Load() {
		d.outage.Store(now)
		d.episode.Store(true)
	}
}

// replicaSilence is how long a replica may go without a heartbeat in the
// store before its siblings count it gone: far longer than Maintain's
// interval.
const replicaSilence = 10 * time.Second

// heartbeat tells the siblings, through the store, what this replica has
// not written yet, and hears what they have not: it counts the replicas
// alive, and ends an episode once all have written.
func (e *Engine) heartbeat(ctx context.Context, gs GlobalStore) error {
	d := &e.global.degraded
	cctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout*4)
	defer cancel()
	unwritten := d.unwritten.Load()
	states, now, err := gs.Heartbeat(cctx, e.cfg.Replica, unwritten, replicaSilence)
	if err != nil {
		if ctx.Err() == nil {
			d.storeFailed(e.now().UnixMicro())
		}
		return err
	}
	e.breaker.success() // the store answers
	alive, clear := 0, true
	for _, st := range states {
		if now-st.At > replicaSilence.Microseconds() {
			continue
		}
		alive++
		if st.Replica != e.cfg.Replica && (st.Unwritten > 0 || st.At <= d.written) {
			clear = false
		}
	}
	d.replicas.Store(int64(max(1, alive)))
	switch {
	case !d.episode.Load():
	case unwritten > 0:
		d.written = 0
	case d.written == 0:
		d.written = now
	case clear:
		d.written = 0
		d.episode.Store(false)
	}
	return nil
}

// window returns the window of key that starts at start (µs), made if
// create is set (else nil if there is none); the caller holds d.mu.
func (d *degradedGlobals) window(key []byte, p *Params, start int64, create bool) *degradedWindow {
	k := string(GlobalKey(key, start/1000))
	w := d.windows[k]
	if w == nil && create {
		if d.windows == nil {
			d.windows = map[string]*degradedWindow{}
		}
		w = &degradedWindow{key: slices.Clone(key), start: start, until: int64(globalUntil(p, float64(start)))}
		d.windows[k] = w
	}
	return w
}

// degradedGlobal decides a global limit of the request without the store,
// at now (µs, the engine's clock), by its rule's fallback (see above).
func (e *Engine) degradedGlobal(it *item, allowance int64, now int64) {
	it.decided, it.degraded, it.storeNow = true, true, now
	p := &it.params
	start := now / p.Window * p.Window
	end := start + p.Window
	d := &e.global.degraded
	// A rule that counts every hit counts it in memory whatever this
	// decides: the store gives back what it took of a call given up on.
	owes := it.rule.CountOverLimit && it.cost > 0
	switch {
	case it.rule.Fallback == FailClosed:
		it.unavailable = true
		it.result = Result{ResetAt: end, RetryAfter: e.breakerWait()}
		if owes {
			e.countDegraded(it, start)
		}
		return
	case it.rule.Fallback == FailOpen: // an elastic rule's choice: counted, not bounded
		it.result = Result{Allowed: true, Remaining: p.Limit, ResetAt: end}
		d.mu.Lock()
		e.countDegradedLocked(it, start)
		w := *d.window(it.key, p, start, false)
		d.mu.Unlock()
		var t crdt.Tally
		e.global.usage.with(func(c *crdt.Counters) { t = c.Tally(it.key, start/1000) })
		it.result.OwnP = t.P + w.admitted - min(w.admitted, w.written) // for the budgets
		return
	}
	replicas := max(1, d.replicas.Load())
	if since := d.outage.Load(); replicas > 1 && now-since < e.global.lag {
		// The siblings' views of the region's count are not all here
		// yet: unavailable for that long.
		it.unavailable = true
		it.result = Result{ResetAt: end, RetryAfter: since + e.global.lag - now}
		if owes {
			e.countDegraded(it, start)
		}
		return
	}
	// What was written is read before the copy, which a write back
	// raises before it says what it wrote: the count is never short of it.
	d.mu.Lock()
	defer d.mu.Unlock()
	var curW, prevW degradedWindow
	if w := d.window(it.key, p, start, false); w != nil {
		curW = *w
	}
	if w := d.window(it.key, p, start-p.Window, false); w != nil && p.Algorithm == SlidingWindowCounter {
		prevW = *w
	}
	var cur, prev crdt.Tally
	e.global.usage.with(func(c *crdt.Counters) {
		cur = c.Tally(it.key, start/1000)
		if p.Algorithm == SlidingWindowCounter {
			prev = c.Tally(it.key, (start-p.Window)/1000)
		}
	})
	// The region's count less this replica's admissions in memory that the
	// store has counted (they are in admitted), and those admissions.
	counted := float64(cur.P) - float64(cur.N) - float64(curW.written)
	admitted := float64(curW.admitted)
	window, t := float64(p.Window), float64(now)
	if p.Algorithm == SlidingWindowCounter {
		counted = swcEstimate(window, float64(start), counted, float64(prev.P)-float64(prev.N)-float64(prevW.written), t)
		admitted = swcEstimate(window, float64(start), admitted, float64(prevW.admitted), t)
	}
	part := (float64(allowance) - counted) / float64(replicas)
	cost := float64(it.cost)
	allowed := admitted+cost <= part
	it.result = Result{Allowed: allowed, ResetAt: end}
	if allowed || owes {
		e.countDegradedLocked(it, start)
	}
	rem := part - admitted
	if allowed {
		rem -= cost
	} else {
		it.result.RetryAfter = end - now
	}
	it.result.Remaining = int64(math.Floor(max(0, rem)))
	// What the budgets hear the region used of the counter: the most it
	// may have, with every sibling's part spent. globalsync must not hand
	// room the region used in memory to another region.
	used := float64(cur.P) - float64(cur.N) - float64(curW.written) + float64(curW.admitted) + float64(replicas-1)*max(0, part)
	if allowed || owes {
		used += cost
	}
	it.result.OwnP = uint64(max(1, used))
	w := d.window(it.key, p, start, true)
	w.used = max(w.used, it.result.OwnP)
}

// usedBound is the most the region may have used of a counter's window
// (startMillis) as this replica decided it in memory, while that is not
// all in the store yet; 0 otherwise.
func (d *degradedGlobals) usedBound(key string, startMillis int64) uint64 {
	if !d.episode.Load() && d.unwritten.Load() == 0 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.windows[string(GlobalKey([]byte(key), startMillis))]
	if w == nil || (!d.episode.Load() && !w.pending()) {
		return 0
	}
	return w.used
}

// countDegradedLocked counts a global limit's cost as admitted without
// the store, in the window that starts at start (µs); the caller holds
// the lock.
func (e *Engine) countDegradedLocked(it *item, start int64) {
	d := &e.global.degraded
	w := d.window(it.key, &it.params, start, true)
	if !w.pending() {
		d.unwritten.Add(1)
	}
	w.admitted += uint64(it.cost)
	it.degradedTaken, it.result.Taken = true, it.cost
}

// countDegraded is countDegradedLocked, taking the lock.
func (e *Engine) countDegraded(it *item, start int64) {
	e.global.degraded.mu.Lock()
	defer e.global.degraded.mu.Unlock()
	e.countDegradedLocked(it, start)
}

// uncountDegraded gives back what a global limit admitted in memory for a
// request another limit denied.
func (e *Engine) uncountDegraded(it *item) {
	d := &e.global.degraded
	start := it.storeNow / it.params.Window * it.params.Window
	d.mu.Lock()
	defer d.mu.Unlock()
	it.result.Taken = 0
	w := d.windows[string(GlobalKey(it.key, start/1000))]
	if w == nil {
		return
	}
	n := min(uint64(it.cost), w.admitted-w.written)
	w.admitted -= n
	if n > 0 && !w.pending() {
		d.unwritten.Add(-1)
	}
	it.degradedTaken = false
}

// randomName names a replica that was given no name.
func randomName() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxWriteBack bounds the windows one Maintain writes back, so that each
// call fits in its timeout.
const maxWriteBack = 1000

// writeBack writes what this replica admitted of global limits without
// its store into the store (see above), and forgets the windows over and
// done with. It returns the windows still to write.
func (e *Engine) writeBack(ctx context.Context, gs GlobalStore, now time.Time) (int, error) {
	d := &e.global.degraded
	us := now.UnixMicro()
	var adds []GlobalAdd
	var ws []*degradedWindow
	d.mu.Lock()
	for k, w := range d.windows {
		switch {
		case w.until <= us:
			if w.pending() {
				d.unwritten.Add(-1)
				e.stats.GlobalDegradedLost.Add(int64(w.admitted - w.written))
			}
			delete(d.windows, k)
		case w.pending() && len(adds) < maxWriteBack:
			var t crdt.Tally
			e.global.usage.with(func(c *crdt.Counters) { t = c.Tally(w.key, w.start/1000) })
			adds = append(adds, GlobalAdd{Key: w.key, StartMillis: w.start / 1000, TTL: time.Duration(w.until-us) * time.Microsecond,
				Replica: e.cfg.Replica, Admitted: w.admitted, KnownP: t.P, KnownN: t.N})
			ws = append(ws, w)
		}
	}
	left := d.unwritten.Load()
	d.mu.Unlock()
	if len(adds) == 0 {
		return int(left), nil
	}
	// Tried at every Maintain, whatever the breaker says (one call, with
	// a timeout): the siblings keep to their parts of the region's
	// allowance in memory until every replica has written its own, and
	// the sooner each writes, the sooner all go back to the store. Its
	// success, like a check's, closes the breaker.
	cctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout*4)
	defer cancel()
	slots := make([]crdt.Slot, len(adds))
	if err := gs.AddGlobal(cctx, adds, slots); err != nil {
		if ctx.Err() == nil {
			d.storeFailed(us)
		}
		return int(left), err
	}
	e.breaker.success()
	e.global.usage.with(func(c *crdt.Counters) {
		for i, a := range adds {
			c.ObserveKey(a.Key, a.StartMillis, slots[i].P, slots[i].N)
		}
	})
	d.mu.Lock()
	for i, w := range ws {
		before, prev := w.pending(), w.written
		w.written = max(prev, adds[i].Admitted)
		if before && !w.pending() {
			d.unwritten.Add(-1)
		}
		e.stats.GlobalWrittenBack.Add(int64(w.written - prev))
	}
	left = d.unwritten.Load()
	d.mu.Unlock()
	return int(left), nil
}
