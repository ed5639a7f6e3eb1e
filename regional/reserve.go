package regional

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geoquota/geoquota/crdt"
)

// Reservations, as the engine serves them (reservation.go says what the
// stores do). A reservation is a check of the estimate; its id carries
// what settling it needs, sealed with the region's key (an HMAC the
// region's replicas share through its store), so that any replica of the
// region settles it with one store call, and no one else can make one.

// ErrReservationNotFound is returned by Settle for a reservation this
// region did not make, or one that has ended: unsettled, it was charged
// its estimate.
var ErrReservationNotFound = errors.New("regional: reservation not found")

// ErrStoreUnavailable wraps a store's failure to answer a call that has
// no fallback: a reservation's.
var ErrStoreUnavailable = errors.New("regional: store unavailable")

// reserveReq is what Reserve asks of Check (Request.reserve): estimates
// taken from the store, not from batches, and not counted when denied;
// Check sets what the counters that took them need to settle them.
type reserveReq struct {
	ops []SettleOp
	// now is the store's time of the check (µs): the reservation's ttl
	// runs from it (a slot's At is its own, a global one's its window's
	// start).
	now int64
}

// noteHeld notes, if the request goes ahead, the counters that took its
// estimate, when, and under which limit.
func (rq *reserveReq) noteHeld(items []item) {
	for i := range items {
		if it := &items[i]; it.decided && !it.rule.Shadow && !it.result.Allowed {
			return
		}
	}
	for i := range items {
		if it := &items[i]; it.decided && !it.degraded && it.result.Taken > 0 {
			at := it.storeNow
			if it.params.Algorithm == Concurrency {
				at = slotAt(it.params, &it.result)
			}
			op := SettleOp{Key: slices.Clone(it.key), Params: it.params, Estimate: it.result.Taken, At: at, Global: it.rule.Scope == ScopeGlobal}
			if op.Global && it.params.Algorithm == Concurrency {
				op.Estimate = int64(it.result.OwnP) // its number in its window (sealSlots)
			}
			rq.ops = append(rq.ops, op)
			rq.now = max(rq.now, it.storeNow)
		}
	}
}

// Reserved is a reservation made: its id, for Settle, and when it ends.
// A request no limit took anything of holds nothing: its ID is empty.
type Reserved struct {
	ID      string
	Expires time.Time
}

// Reserve decides req as Check does, with req.Cost the estimate, and if
// it is allowed, holds the estimate as a reservation for ttl (at most
// MaxReservationTTL): Settle commits or releases it. A denied request
// reserves nothing. A global limit's estimate is taken as a check's is,
// within what the region may admit of it, and counted in the region's
// slot. They are taken from the region's store: when it cannot answer,
// the request is denied as unavailable, whatever the rules' fallbacks. d is the
// decision, as Check's.
func (e *Engine) Reserve(ctx context.Context, req *Request, ttl time.Duration, d *Decision) (Reserved, error) {
	switch {
	case req.Cost <= 0 || req.CountNothing:
		return Reserved{}, &RequestError{Field: "cost", Msg: "required: the estimated cost, at least 1"}
	case ttl < time.Microsecond || ttl > MaxReservationTTL:
		return Reserved{}, &RequestError{Field: "ttl_seconds", Msg: fmt.Sprintf("%v: must be at least a microsecond and at most %v", ttl, MaxReservationTTL)}
	}
	if err := e.Validate(req); err != nil {
		return Reserved{}, err
	}
	key, err := e.rsv.key(ctx, e)
	if err != nil {
		return Reserved{}, fmt.Errorf("%w: the region's reservation key: %w", ErrStoreUnavailable, err)
	}
	rq := &reserveReq{}
	req.reserve = rq
	defer func() { req.reserve = nil }()
	if err := e.Check(ctx, req, d); err != nil {
		return Reserved{}, err
	}
	if !d.Allowed || len(rq.ops) == 0 {
		return Reserved{}, nil
	}
	var mark [markLen]byte
	rand.Read(mark[:])
	until := rq.now + ttl.Microseconds()
	id := sealReservation(key, e.cfg.Region, mark[:], until, rq.ops)
	if len(id) > maxReservationIDLen {
		// Too many limits, or keys too long, for an id a settlement would
		// read: the estimate goes back, and nothing is reserved.
		out := make([]Settlement, len(rq.ops))
		if _, err := e.settleStore().Settle(ctx, rq.ops, hex.EncodeToString(mark[:]), until, -1, out); err != nil {
			return Reserved{}, fmt.Errorf("%w: giving back a reservation too large to hold: %w", ErrStoreUnavailable, err)
		}
		back := "its estimate was given back"
		for _, o := range out {
			if o.Full || o.Ended {
				back = "its estimate could not be given back and stays taken"
			}
		}
		return Reserved{}, &RequestError{Field: "descriptors", Msg: fmt.Sprintf("the request meets %d limits whose keys make a reservation id of %d bytes, more than %d: nothing is reserved, and %s",
			len(rq.ops), len(id), maxReservationIDLen, back)}
	}
	if err := e.keepExpiry(ctx, rq.ops, id, until); err != nil {
		// Not kept to refund: given back now, whatever the caller does.
		back := "its estimate was given back"
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.Timeout)
		defer cancel()
		out := make([]Settlement, len(rq.ops))
		if _, rerr := e.settleStore().Settle(rctx, rq.ops, hex.EncodeToString(mark[:]), until, -1, out); rerr != nil {
			back = "its estimate could not be given back and stays taken"
		} else {
			e.observeSettled(rq.ops, out)
		}
		return Reserved{}, fmt.Errorf("%w: keeping a reservation to refund when it ends (%s): %w", ErrStoreUnavailable, back, err)
	}
	return Reserved{ID: id, Expires: d.Time.Add(ttl)}, nil
}

// keepExpiry keeps, in the store's index, a reservation that one of its
// limits' rules refunds when it ends unsettled (expiry.go).
func (e *Engine) keepExpiry(ctx context.Context, ops []SettleOp, id string, until int64) error {
	ix, ok := e.settleStore().(expiryIndex)
	if !ok {
		return nil
	}
	rs := e.rules.Load()
	for i := range ops {
		rid, _, _, _ := parseKey(string(ops[i].Key))
		if r := rs.Rule(rid); r != nil && r.RefundOnExpiry {
			return ix.addExpiry(ctx, id, until)
		}
	}
	return nil
}

// settleStore is the store reservations are settled in.
func (e *Engine) settleStore() Store {
	if e.shared {
		return e.store
	}
	return e.local
}

// Settled is what settling a reservation did.
type Settled struct {
	// Again: it was settled before, and nothing changed now; Charged is
	// what the first settlement charged (0 for a release).
	Again   bool
	Charged int64
	// Limits are the counters that held it, as they stand after, the
	// tightest first; not those whose limit has changed since (the rules
	// changed: they were left alone), unless all have: then those, with
	// the limit they had when reserved.
	Limits []SettledLimit
}

// SettledLimit is one counter of a settled reservation.
type SettledLimit struct {
	Rule             string
	Limit, Remaining int64
	// Debt is how far past its limit the counter went.
	Debt    int64
	ResetAt time.Time
}

// Settle commits a reservation at its actual cost (actual >= 0; above
// the estimate, the difference is taken, past the limit as debt; below
// it, given back into the window the estimate was taken in) or releases
// it (actual < 0). Settling it again answers alike and changes nothing.
// An id that is not one, or is another region's, is an error naming
// reservation; one this region did not make, or that has ended, is
// ErrReservationNotFound.
func (e *Engine) Settle(ctx context.Context, id string, actual int64) (Settled, error) {
	actual = max(actual, -1) // any release is one: an expiry is maintenance's (expiry.go)
	if actual > maxLimit {
		return Settled{}, &RequestError{Field: "cost", Msg: fmt.Sprintf("%d is more than a commit may charge (%d)", actual, int64(maxLimit))}
	}
	r, err := openReservation(id)
	if err != nil {
		return Settled{}, &RequestError{Field: "reservation", Msg: err.Error()}
	}
	if r.region != e.cfg.Region {
		return Settled{}, &RequestError{Field: "reservation", Msg: fmt.Sprintf("made in region %q: settle it there, not in %q", r.region, e.cfg.Region)}
	}
	ok, err := e.rsv.verify(ctx, e, r)
	if err != nil {
		return Settled{}, fmt.Errorf("%w: the region's reservation key: %w", ErrStoreUnavailable, err)
	}
	if !ok {
		return Settled{}, ErrReservationNotFound
	}
	rs := e.rules.Load()
	now := e.now()
	for i := range r.ops {
		switch op := &r.ops[i]; {
		case op.Global:
			e.settleGlobal(rs, op, now)
		case op.Params.Algorithm == Concurrency:
			op.Params, op.Stale = rs.slotParams(op.Key, op.Params)
		default:
			op.Stale = !rs.limitOf(op.Key, op.Params)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	out := make([]Settlement, len(r.ops))
	if _, err := e.settleStore().Settle(ctx, r.ops, hex.EncodeToString(r.mark), r.until, actual, out); err != nil {
		return Settled{}, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	var s Settled
	var stale []SettledLimit
	ended := true
	e.observeSettled(r.ops, out)
	for i, o := range out {
		if o.Full {
			return Settled{}, ErrTooManySettlements
		}
		if o.Ended {
			continue
		}
		ended = false
		rule, _, _, _ := parseKey(string(r.ops[i].Key))
		s.Again, s.Charged = s.Again || o.Again, max(s.Charged, o.Charged) // a slot charges nothing
		l := SettledLimit{Rule: rule, Limit: r.ops[i].Params.Limit, Remaining: max(0, o.Result.Remaining),
			Debt: max(0, -o.Result.Remaining), ResetAt: time.UnixMicro(o.Result.ResetAt)}
		if r.ops[i].Stale {
			stale = append(stale, l) // settled; its limit is no longer this one
			continue
		}
		s.Limits = append(s.Limits, l)
	}
	if ended {
		return Settled{}, ErrReservationNotFound
	}
	if len(s.Limits) == 0 {
		s.Limits = stale // as they were when reserved: the rules changed them all
	}
	slices.SortStableFunc(s.Limits, func(a, b SettledLimit) int {
		return cmp.Or(cmp.Compare(b.Debt, a.Debt), cmp.Compare(a.Remaining, b.Remaining))
	})
	return s, nil
}

// ErrTooManySettlements is returned by Settle when a counter keeps as many
// settlements of reservations ending in the same minute as it may
// (settledCap): nothing was settled, and the estimate stays taken.
var ErrTooManySettlements = errors.New("regional: too many settlements of reservations ending this minute")

// observeSettled notes, of the global limits a settlement touched, the
// region's slot as the store has it after: for the gossip. (The engine's
// own memory counts in the copy itself.)
func (e *Engine) observeSettled(ops []SettleOp, out []Settlement) {
	for i := range out {
		if op, r := &ops[i], &out[i].Result; op.Global && e.shared && !out[i].Ended && (r.OwnP != 0 || r.OwnN != 0) {
			start := r.ResetAt - op.Params.Window
			if op.Params.Algorithm == Concurrency { // the window the slot was taken in
				start = op.At / op.Params.Window * op.Params.Window
			}
			e.global.usage.with(func(c *crdt.Counters) { c.ObserveKey(op.Key, start/1000, r.OwnP, r.OwnN) })
		}
	}
}

// settleGlobal readies a global limit's part of a settlement under the
// rules rs: stale if the rule is gone, or counts in other windows now (its
// algorithm or window changed: its slots are another's; a limit changed
// alone keeps them, and what comes back comes back), and otherwise its
// allowance and ceiling as a check of its counter would have them now,
// for the answer.
func (e *Engine) settleGlobal(rs *RuleSet, op *SettleOp, now time.Time) {
	id, _, _, _ := parseKey(string(op.Key))
	r := rs.Rule(id)
	if op.Stale = r == nil || r.Scope != ScopeGlobal || r.Base.Algorithm != op.Params.Algorithm || r.Base.Window != op.Params.Window; op.Stale {
		return
	}
	it := item{rule: r, key: op.Key, params: op.Params}
	gop := Op{Key: op.Key, Params: op.Params}
	e.globalOp(&gop, r, e.heldFor(&it, now.UnixMicro()), now)
	op.Allowance, op.Ceiling = gop.Allowance, gop.Ceiling
}

// limitOf reports whether p is the limit a counter key of a regional rule
// has under the rules in force, for a tier or an override: a reservation
// made under a limit since changed leaves the counter alone when settled.
func (rs *RuleSet) limitOf(key []byte, p Params) bool {
	id, values, overflow, ok := parseKey(string(key))
	r := rs.Rule(id)
	switch {
	case !ok || r == nil || r.Scope == ScopeGlobal:
		return false
	case overflow:
		return r.overflow == p
	case r.params([]byte(values), "") == p:
		return true
	}
	for tier := range r.Tiers {
		if r.params([]byte(values), tier) == p {
			return true
		}
	}
	return false
}

// slotParams returns the numbers a slot of a concurrency limit is freed
// with: a slot is its counter's entry whatever the limit's numbers, so one
// taken before the rules changed its limit or ttl is freed all the same,
// with the ttl in force (its counter's entries leave by it). Stale: the
// rule is gone, or no longer counts slots.
func (rs *RuleSet) slotParams(key []byte, p Params) (Params, bool) {
	id, _, _, ok := parseKey(string(key))
	r := rs.Rule(id)
	if !ok || r == nil || r.Base.Algorithm != Concurrency {
		return p, true
	}
	if !rs.limitOf(key, p) {
		p.Window = r.Base.Window
	}
	return p, false
}

// reservationKeys holds the region's reservation key once known.
type reservationKeys struct {
	mu      sync.Mutex
	val     []byte
	fetched time.Time // when val was last read from the store
}

// keyStore is a store that keeps the region's reservation key, the same
// for every replica (the Redis store); an engine on its own memory makes
// one of its own.
type keyStore interface {
	reservationKey(ctx context.Context, fresh []byte) ([]byte, error)
}

// key returns the region's reservation key: its store's, made there by
// the first replica that asks, or this engine's own. No lock is held
// while the store is asked: replicas and callers that ask together all
// get the store's one key.
func (k *reservationKeys) key(ctx context.Context, e *Engine) ([]byte, error) {
	k.mu.Lock()
	val, refresh := k.val, false
	if val != nil && e.shared && e.now().Sub(k.fetched) >= keyRefresh {
		// Read again now and then: a store that lost its key made another,
		// and replicas started since seal with it.
		refresh, k.fetched = true, e.now()
	}
	k.mu.Unlock()
	if val != nil && !refresh {
		return val, nil
	}
	v, err := k.fetch(ctx, e)
	if err != nil && val != nil {
		return val, nil // the store does not answer: the key known
	}
	return v, err
}

// keyRefresh is how often a replica reads the region's key again.
const keyRefresh = 10 * time.Second

// fetch reads the key from the store (a fresh one on its own memory).
func (k *reservationKeys) fetch(ctx context.Context, e *Engine) ([]byte, error) {
	fresh := make([]byte, 32)
	rand.Read(fresh)
	ks, shared := e.store.(keyStore)
	shared = shared && e.shared
	if shared {
		ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
		defer cancel()
		v, err := ks.reservationKey(ctx, fresh)
		if err != nil {
			return nil, err
		}
		fresh = v
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.val == nil || shared { // a key of this engine's own is made once
		k.val, k.fetched = fresh, e.now()
	}
	return k.val, nil
}

// refetchEvery bounds how often an id that does not verify makes a
// replica read the region's key again: the store may have lost it and
// made another (a replica started since seals with the new one).
const refetchEvery = time.Second

// verify reports whether the region sealed r: with the key this replica
// knows, or, once a second at most, with the store's key read again.
func (k *reservationKeys) verify(ctx context.Context, e *Engine, r *reservation) (bool, error) {
	key, err := k.key(ctx, e)
	if err != nil || r.verify(key) {
		return err == nil, err
	}
	_, shared := e.store.(keyStore)
	k.mu.Lock()
	stale := shared && e.shared && e.now().Sub(k.fetched) >= refetchEvery
	if stale {
		k.fetched = e.now() // one caller reads again; the others answer now
	}
	k.mu.Unlock()
	if !stale {
		return false, nil
	}
	if key, err = k.fetch(ctx, e); err != nil {
		return false, err
	}
	return r.verify(key), nil
}

// A reservation's id: "r1.", then the base64url of what settling it needs
// — the region, a random mark naming its settlement, when it ends (µs, the
// store's time), and for each counter its key, its limit's numbers, the
// estimate and when it was taken — and of an HMAC-SHA256 of that (its
// first 16 bytes) with the region's key. It is not secret: whoever holds
// it may settle it, and no one can make or change one without the key.
const (
	reservationPrefix = "r1."
	macLen            = 16
	markLen           = 16
	// maxReservationIDLen bounds an id's length, and so what reading one
	// may allocate: a request meets a handful of limits, each key at most
	// a few hundred bytes. Reserve refuses a request whose id would be
	// longer.
	maxReservationIDLen = 32 << 10
)

// globalFlag marks a global limit's algorithm in an id.
const globalFlag = 0x80

// reservation is an id's content.
type reservation struct {
	region string
	mark   []byte
	until  int64
	ops    []SettleOp
	signed []byte // the bytes the mac is of
	mac    []byte
}

func sealReservation(key []byte, region string, mark []byte, until int64, ops []SettleOp) string {
	b := binary.AppendUvarint(nil, uint64(len(region)))
	b = append(append(b, region...), mark...)
	b = binary.AppendVarint(b, until)
	for _, op := range ops {
		p := &op.Params
		alg := byte(p.Algorithm)
		if op.Global {
			alg |= globalFlag
		}
		b = binary.AppendUvarint(b, uint64(len(op.Key)))
		b = append(append(b, op.Key...), alg)
		b = binary.AppendVarint(b, p.Limit)
		b = binary.AppendUvarint(b, math.Float64bits(p.Rate))
		b = binary.AppendVarint(b, p.Window)
		b = binary.AppendVarint(b, op.Estimate)
		b = binary.AppendVarint(b, op.At)
	}
	m := hmac.New(sha256.New, key)
	m.Write(b)
	b = m.Sum(b)[:len(b)+macLen]
	return reservationPrefix + base64.RawURLEncoding.EncodeToString(b)
}

// verify reports whether r was sealed with key.
func (r *reservation) verify(key []byte) bool {
	m := hmac.New(sha256.New, key)
	m.Write(r.signed)
	return hmac.Equal(m.Sum(nil)[:macLen], r.mac)
}

// openReservation reads an id, without verifying it (verify).
func openReservation(s string) (*reservation, error) {
	bad := func(why string) (*reservation, error) {
		return nil, errors.New("not a reservation id: " + why)
	}
	if len(s) > maxReservationIDLen {
		return bad(fmt.Sprintf("longer than %d bytes", maxReservationIDLen))
	}
	rest, ok := strings.CutPrefix(s, reservationPrefix)
	if !ok {
		return bad("no " + reservationPrefix + " prefix")
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(b) < macLen {
		return bad("not base64url")
	}
	r := &reservation{signed: b[:len(b)-macLen], mac: b[len(b)-macLen:]}
	b = r.signed
	uvarint := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	varint := func() int64 { // zig-zag, as binary.AppendVarint writes it
		u := uvarint()
		return int64(u>>1) ^ -int64(u&1)
	}
	bytes := func(n uint64) []byte {
		if n > uint64(len(b)) {
			b = nil
			return nil
		}
		v := b[:n]
		b = b[n:]
		return v
	}
	r.region = string(bytes(uvarint()))
	r.mark = bytes(markLen)
	r.until = varint()
	for len(b) > 0 {
		var op SettleOp
		op.Key = bytes(uvarint())
		if len(b) == 0 {
			return bad("truncated")
		}
		op.Params.Algorithm, op.Global, b = Algorithm(b[0]&^globalFlag), b[0]&globalFlag != 0, b[1:]
		op.Params.Limit = varint()
		op.Params.Rate = math.Float64frombits(uvarint())
		op.Params.Window = varint()
		op.Estimate = varint()
		op.At = varint()
		if b == nil {
			return bad("truncated")
		}
		r.ops = append(r.ops, op)
	}
	if r.region == "" || len(r.mark) != markLen || len(r.ops) == 0 {
		return bad("incomplete")
	}
	return r, nil
}
