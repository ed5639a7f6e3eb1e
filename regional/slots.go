package regional

import (
	"context"
	"crypto/rand"
	"time"
)

// Concurrency limits (Rule: algorithm concurrency) count requests in
// flight. A counter is a sliding window log whose window is the slots' TTL:
// a request that goes ahead takes a slot (an entry, at the store's time),
// and a slot leaves by itself when its TTL has passed, as a log's entry
// leaves its window. A check that takes slots answers with a reservation
// (Decision.Held) of them alone — the other limits' cost is counted as
// usual — and settling it, committed or released, frees its slots early
// (settle, limits.lua): the same id, the same settlement, made once. A
// reservation (Engine.Reserve) takes a slot as well, freed when it is
// settled. A global concurrency limit (scope: global) counts its slots in
// a global counter's windows instead, its ttl long (global.go): a slot is
// counted in the window it was taken in and the next, numbered there by
// the region's P after it, and a release takes that number out of the
// window's set of slots in flight, once.

// slotAt is when the slot a concurrency limit's allowing result took was
// logged: the newest entry, whose end is the result's ResetAt. No two
// slots of a counter share a time (a slot taken at the newest's time or
// before it goes a microsecond after it), so that a release forgets its
// own slot, once, and a Cluster's groups, each at its own clock, agree.
func slotAt(p Params, r *Result) int64 { return r.ResetAt - p.Window }

// slotRetry bounds the wait a concurrency limit's denial asks for: a slot
// may be released any moment, and the store knows only when the oldest
// would free itself.
const slotRetry = time.Second

// slotKey returns the region's reservation key for a check that may take
// slots in concurrency limits, nil for one that takes none. A store that
// cannot give it leaves the slots unreleasable: their limits deny the
// request as unavailable, whatever their fallback.
func (e *Engine) slotKey(ctx context.Context, sc *scratch) []byte {
	any := false
	for i := range sc.items {
		if it := &sc.items[i]; !it.decided && it.rule.Base.Algorithm == Concurrency {
			any = true
		}
	}
	if !any {
		return nil
	}
	key, err := e.rsv.key(ctx, e)
	if err == nil {
		return key
	}
	e.storeError(err, e.now().UnixMicro())
	for i := range sc.items {
		if it := &sc.items[i]; !it.decided && it.rule.Base.Algorithm == Concurrency {
			now := e.now().UnixMicro()
			it.decided, it.unavailable = true, true
			it.result = Result{ResetAt: it.params.resetAt(now), RetryAfter: e.breakerWait()}
		}
	}
	return nil
}

// sealSlots makes the reservation of the slots a check that went ahead
// took, sealed with the region's key: it ends when the last of them
// frees itself. Slots taken without the store (a fallback) have none: they
// free themselves. Neither has a request whose keys make an id too long
// to read (maxReservationIDLen), a handful of slots whose keys are
// kilobytes long.
func (e *Engine) sealSlots(key []byte, items []item) Reserved {
	var ops []SettleOp
	var until, ttl int64
	for i := range items {
		it := &items[i]
		if it.rule.Base.Algorithm != Concurrency || !it.decided || it.degraded || it.result.Taken == 0 {
			continue
		}
		at := slotAt(it.params, &it.result)
		op := SettleOp{Key: append([]byte(nil), it.key...), Params: it.params, Estimate: it.result.Taken, At: at}
		u := at + it.params.Window
		if it.rule.Scope == ScopeGlobal {
			// Taken in the window that starts at at, and counted in the
			// next as well (global.go); numbered there by the region's
			// P after it, which its release names (SettleOp.Estimate).
			op.Global, op.Estimate, u = true, int64(it.result.OwnP), at+2*it.params.Window
		}
		ops = append(ops, op)
		if u > until {
			until, ttl = u, u-it.storeNow
		}
	}
	if len(ops) == 0 {
		return Reserved{}
	}
	var mark [markLen]byte
	rand.Read(mark[:])
	id := sealReservation(key, e.cfg.Region, mark[:], until, ops)
	if len(id) > maxReservationIDLen {
		return Reserved{}
	}
	return Reserved{ID: id, Expires: e.now().Add(time.Duration(ttl) * time.Microsecond)}
}
