package regional

import (
	"container/heap"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reservations whose rule refunds them when they end unsettled
// (on_expiry: refund): the store keeps their ids by when they end, in
// one index for the region, and each replica's maintenance takes the ids
// whose end has passed — each id once, whoever asks — and settles them as
// a release made past their end (settleExpired): once, and nothing after
// a commit or a release. An id taken by a replica that then fails stays
// charged; one found too late (its settlements no longer kept) stays
// charged too.

// expiryIndex is a store that keeps the reservations to refund when they
// end.
type expiryIndex interface {
	// addExpiry keeps id until its end, until (µs, the store's time).
	addExpiry(ctx context.Context, id string, until int64) error
	// dueExpiries takes, and forgets, up to n ids whose end has passed
	// by the store's time.
	dueExpiries(ctx context.Context, n int) ([]string, error)
}

// maxExpiries bounds the reservations one maintenance round refunds.
const maxExpiries = 1000

// expiryLate is how long after its end a reservation is still refunded:
// its settlements are kept a minute past the minute it ends in, and an
// expiry must see them to be made once.
const expiryLate = time.Minute

// expiryKey is the region's index in its Redis.
const expiryKey = "gq:expiries"

// dueLua takes the ids whose end has passed: head.lua's clock (ARGV[1]:
// now in µs, tests only, or ”; ARGV[2] unused), then ARGV[3]: how many
// at most.
var dueLua = headLua + `
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now), 'LIMIT', 0, tonumber(ARGV[3]))
if #ids > 0 then redis.call('ZREM', KEYS[1], unpack(ids)) end
return ids
`

var dueScript = redis.NewScript(dueLua)

func (s *RedisStore) addExpiry(ctx context.Context, id string, until int64) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if err := s.client.ZAdd(ctx, expiryKey, redis.Z{Score: float64(until), Member: id}).Err(); err != nil {
		return fmt.Errorf("regional: redis: expiries: %w", err)
	}
	return nil
}

func (s *RedisStore) dueExpiries(ctx context.Context, n int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*s.opts.Timeout)
	defer cancel()
	now := ""
	if s.testNow != nil {
		now = strconv.FormatInt(s.testNow(), 10)
	}
	ids, err := dueScript.Run(ctx, s.client, []string{expiryKey}, now, "", n).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("regional: redis: expiries: %w", err)
	}
	return ids, nil
}

// memExpiries is the memory store's index: a min-heap by end.
type memExpiries struct {
	mu  sync.Mutex
	ids memExpiryHeap
}

type memExpiry struct {
	id    string
	until int64
}

type memExpiryHeap []memExpiry

func (h memExpiryHeap) Len() int           { return len(h) }
func (h memExpiryHeap) Less(i, j int) bool { return h[i].until < h[j].until }
func (h memExpiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *memExpiryHeap) Push(x any)        { *h = append(*h, x.(memExpiry)) }
func (h *memExpiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (m *MemoryStore) addExpiry(_ context.Context, id string, until int64) error {
	m.expiries.mu.Lock()
	defer m.expiries.mu.Unlock()
	heap.Push(&m.expiries.ids, memExpiry{id: id, until: until})
	return nil
}

func (m *MemoryStore) dueExpiries(_ context.Context, n int) ([]string, error) {
	now := m.now()
	m.expiries.mu.Lock()
	defer m.expiries.mu.Unlock()
	var out []string
	for len(out) < n && len(m.expiries.ids) > 0 && m.expiries.ids[0].until <= now {
		out = append(out, heap.Pop(&m.expiries.ids).(memExpiry).id)
	}
	return out, nil
}

// refundExpired settles, as releases made past their end, the reservations
// whose rule refunds them and whose end has passed: their limits that
// refund get their estimates back (a settlement each, one at a time).
// It returns how many it refunded.
func (e *Engine) refundExpired(ctx context.Context) (int, error) {
	ix, ok := e.settleStore().(expiryIndex)
	if !ok {
		return 0, nil
	}
	// Taken when no rule refunds now too, once in a while (drainEvery):
	// what was kept before is dropped (charged), not kept for ever.
	now := e.now().UnixMicro()
	if !e.rules.Load().refunds {
		if last := e.drained.Load(); now-last < drainEvery.Microseconds() || !e.drained.CompareAndSwap(last, now) {
			return 0, nil
		}
	}
	ids, err := ix.dueExpiries(ctx, maxExpiries)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, expiryRound)
	defer cancel()
	n := 0
	var errs []error
	for i, id := range ids {
		refunded, again, err := e.refundOne(ctx, id)
		if refunded {
			n++
		}
		if err != nil && !errors.Is(err, ErrReservationNotFound) {
			// The store does not answer: this one and those after it are
			// kept for the next round.
			errs = append(errs, err, e.keepAgain(ix, ids[i:]))
			break
		}
		if again {
			errs = append(errs, e.keepAgain(ix, ids[i:i+1]))
		}
	}
	e.stats.ReservationsRefunded.Add(int64(n))
	return n, errors.Join(errs...)
}

// drainEvery is how often the index is read when no rule refunds.
const drainEvery = 10 * time.Second

// expiryRound bounds a maintenance round's refunds.
const expiryRound = 2 * time.Second

// keepAgain puts ids back in the index, each at its end, on a deadline of
// its own.
func (e *Engine) keepAgain(ix expiryIndex, ids []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.Timeout)
	defer cancel()
	var errs []error
	for _, id := range ids {
		if r, err := openReservation(id); err == nil {
			errs = append(errs, ix.addExpiry(ctx, id, r.until))
		}
	}
	return errors.Join(errs...)
}

// refundOne refunds one reservation that ended: its limits whose rule
// (in force now) refunds are released, the others left charged. It
// reports whether it gave anything back (not for one settled before),
// and whether to try again later: a counter's store, whose clock is
// behind the index's, has not seen it end.
func (e *Engine) refundOne(ctx context.Context, id string) (refunded, again bool, err error) {
	r, err := openReservation(id)
	if err != nil || r.region != e.cfg.Region {
		return false, false, ErrReservationNotFound
	}
	if ok, err := e.rsv.verify(ctx, e, r); err != nil || !ok {
		return false, false, orErr(err, ErrReservationNotFound)
	}
	now := e.now()
	if now.UnixMicro() > r.until+expiryLate.Microseconds() {
		e.stats.ReservationsExpiredLate.Add(1)
		return false, false, ErrReservationNotFound // too late to be made once: it stays charged
	}
	// Only the limits that refund are settled: the others keep no
	// settlement of it (which would count toward their cap, and a full
	// counter would refuse the refund of the rest).
	rs := e.rules.Load()
	ops := r.ops[:0]
	for i := range r.ops {
		op := r.ops[i]
		id, _, _, _ := parseKey(string(op.Key))
		rule := rs.Rule(id)
		switch {
		case rule == nil || !rule.RefundOnExpiry || op.Params.Algorithm == Concurrency:
			continue // left as it is
		case op.Global:
			e.settleGlobal(rs, &op, now)
		default:
			op.Stale = !rs.limitOf(op.Key, op.Params)
		}
		if !op.Stale {
			ops = append(ops, op)
		}
	}
	if len(ops) == 0 {
		return false, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	out := make([]Settlement, len(ops))
	if _, err := e.settleStore().Settle(ctx, ops, hex.EncodeToString(r.mark), r.until, settleExpired, out); err != nil {
		return false, false, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	e.observeSettled(ops, out)
	for i := range out {
		switch {
		case out[i].Again || out[i].Full:
		case out[i].Ended: // not yet, by that counter's store
			again = true
		default:
			refunded = true
		}
	}
	return refunded, again && !refunded, nil
}

// orErr returns err, or def if err is nil.
func orErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}
