package regional

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures an Engine. Every field has a default; see DefaultConfig.
type Config struct {
	// Region names this region, in violation events.
	Region string
	// Store holds the region's counters, shared by its replicas. nil means
	// an in-memory store of this process alone (--dev).
	Store Store
	// Clock returns the current time; nil means time.Now. Stores keep their
	// own time (Redis uses TIME); the clock serves the engine's caches,
	// batches and breaker.
	Clock func() time.Time
	// RedactKeys puts RedactKey's hash in place of API keys and counter
	// keys in the log and in the violations recorded (regiond's
	// --key-redaction hash, its default).
	RedactKeys bool
	// Timeout bounds each call to a shared store; 0 means 50ms. A call
	// that takes longer counts as a failure and the rule's fallback applies.
	Timeout time.Duration
	// Breaker configures the circuit breaker in front of a shared store.
	Breaker BreakerConfig
	// BatchTTL is how long a hot key's batch (rule option batch: N) serves from
	// memory before what is left of it goes back; 0 means one second.
	BatchTTL time.Duration
	// MaxDenials bounds the denial cache; 0 means 100,000 keys.
	MaxDenials int
	// OnDenied, if set, hears of every key the store finds over its limit,
	// so that sibling replicas can be told (see Engine.NoteDenial). It is
	// called on the checking goroutine and must not block.
	OnDenied func(Denial)
	// Violations, if set, keeps the audit trail of denials; Maintain
	// appends to it.
	Violations ViolationLog
	// Global places the region among the others for global rules.
	Global GlobalConfig
	// Replica names this replica among its region's, in a shared store:
	// the replicas say there what they admitted of global limits while it
	// could not answer (degraded.go). Empty means a name made at random.
	Replica string
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultConfig returns the defaults: an in-memory store, 50ms timeout,
// breaker opening after 5 failures for 1s, 1s batches.
func DefaultConfig() Config {
	return Config{Timeout: 50 * time.Millisecond, Breaker: BreakerConfig{Failures: 5, Cooldown: time.Second},
		BatchTTL: time.Second, MaxDenials: 100_000}
}

// Engine decides whether requests may go through, against the rules and
// the region's store. It is safe for concurrent use. It starts no
// goroutines: call Maintain now and then, or Run.
type Engine struct {
	cfg   Config
	now   func() time.Time
	log   *slog.Logger
	rules atomic.Pointer[RuleSet]
	store Store
	// drained is when the reservations' expiry index was last read while
	// no rule refunds (expiry.go), µs.
	drained atomic.Int64
	shared  bool         // the store is outside this process: timeout, breaker
	local   *MemoryStore // this replica's memory: local_only fallback
	breaker *breaker
	rsv     reservationKeys // the region's key that seals reservations

	denials     *shardMap[*denial]
	denialCount atomic.Int64 // entries in denials: none, no lookups
	batches     *shardMap[*batch]
	// trackers is by rule id, read by every check: replaced whole on a
	// change (under trackersMu), never changed in place.
	trackers   atomic.Pointer[map[string]*keyTracker]
	trackersMu sync.Mutex
	keys       regionKeys // the shared store's count of keys across replicas, if it keeps one
	blocks     atomic.Pointer[[]block]
	blockMu    sync.Mutex

	violations violationBuffer
	returnsMu  sync.Mutex
	returns    []batchReturn

	global     *globalState
	reseeded   atomic.Int64 // breaker recoveries after which the store got the global counters back
	stats      Stats
	lastErrLog atomic.Int64 // µs of the last store error logged
	errsLogged atomic.Int64 // StoreErrors when it was
	scratch    sync.Pool
}

// New returns an engine with the given rules (nil: none yet). It panics if
// cfg.Global does not validate (GlobalConfig.Validate): check it first.
func New(cfg Config, rules *RuleSet) *Engine {
	d := DefaultConfig()
	if cfg.Timeout <= 0 {
		cfg.Timeout = d.Timeout
	}
	if cfg.BatchTTL <= 0 {
		cfg.BatchTTL = d.BatchTTL
	}
	if cfg.MaxDenials <= 0 {
		cfg.MaxDenials = d.MaxDenials
	}
	if cfg.Breaker.Failures <= 0 {
		cfg.Breaker.Failures = d.Breaker.Failures
	}
	if cfg.Breaker.Cooldown <= 0 {
		cfg.Breaker.Cooldown = d.Breaker.Cooldown
	}
	e := &Engine{cfg: cfg, now: cfg.Clock, log: cfg.Logger}
	if e.now == nil {
		e.now = time.Now
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.cfg.Region == "" {
		e.cfg.Region = "local"
	}
	if e.cfg.Replica == "" {
		e.cfg.Replica = randomName()
	}
	g, err := newGlobalState(e.cfg.Region, cfg.Global)
	if err != nil {
		panic(err)
	}
	e.global = g
	g.startedUs = e.now().UnixMicro()
	e.local = NewMemoryStore(e.now)
	e.local.SetRegion(e.cfg.Region)
	e.store, e.shared = cfg.Store, cfg.Store != nil
	e.keys, _ = cfg.Store.(regionKeys)
	if e.store == nil {
		// The engine's own memory keeps global counters in the copy
		// alone: one window per counter, every region's slots.
		e.store = e.local
		e.local.copy = g.usage
	}
	e.breaker = newBreaker(cfg.Breaker, e.now)
	e.denials, e.batches = newShardMap[*denial](), newShardMap[*batch]()
	e.blocks.Store(new([]block))
	e.violations.max = 10_000
	if rules == nil {
		rules, _ = Parse("", nil)
	}
	e.SetRules(rules)
	e.scratch.New = func() any { return new(scratch) }
	return e
}

// Rules returns the rules in force.
func (e *Engine) Rules() *RuleSet { return e.rules.Load() }

// SetRules puts a compiled rule set in force, at once, for every check that
// starts after. Counters keep their usage: a bucket keeps its tokens,
// capped to a new capacity.
func (e *Engine) SetRules(rs *RuleSet) {
	e.rules.Store(rs)
	e.stats.RuleReloads.Add(1)
}

// PutRules compiles rules from YAML (source names them in errors, as in
// Parse) and puts them in force. Invalid rules change nothing, and count
// as a rejected reload.
func (e *Engine) PutRules(source string, yaml []byte) (*RuleSet, error) {
	rs, err := Parse(source, yaml)
	if err != nil {
		e.stats.RuleReloadErrors.Add(1)
		return nil, err
	}
	e.SetRules(rs)
	return rs, nil
}

// LoadRules reads a rules file and puts it in force. An invalid file
// changes nothing: the last good rules stay, and the error says why.
func (e *Engine) LoadRules(path string) error {
	rs, err := LoadFile(path)
	if err != nil {
		e.stats.RuleReloadErrors.Add(1)
		e.log.Error("rules rejected; the last good rules stay in force", "file", path, "error", err)
		return err
	}
	e.SetRules(rs)
	e.log.Info("rules loaded", "file", path, "rules", len(rs.Rules()))
	return nil
}

// Breaker returns the state of the breaker in front of the store.
func (e *Engine) Breaker() BreakerState { return e.breaker.State() }

// Code says why a request was allowed or not.
type Code uint8

// Codes, with the names the HTTP API uses.
const (
	CodeOK          Code = iota // allowed
	CodeOverLimit               // RATE_LIMIT_EXCEEDED, 429
	CodeBlocked                 // KEY_BLOCKED, 403
	CodeUnavailable             // RATE_LIMITER_UNAVAILABLE, 503 (fail_closed)
	CodeKeyLimit                // KEY_LIMIT, 429: a new key of a rule that tracks its max_keys
)

var codeNames = [...]string{"OK", "RATE_LIMIT_EXCEEDED", "KEY_BLOCKED", "RATE_LIMITER_UNAVAILABLE", "KEY_LIMIT"}

func (c Code) String() string { return codeNames[c] }

// Decision is the answer to one request.
type Decision struct {
	Allowed bool
	Code    Code
	// Degraded is set when a limit was decided without the shared store
	// (fail_open or local_only).
	Degraded bool
	// Bypassed is set for keys on the allow list: no limit was checked.
	Bypassed bool
	// Time is when the decision was made.
	Time time.Time
	// Limits are the limits that applied: first the one that speaks for
	// the decision (docs/design.md: when allowed, the one with the least left,
	// ties to the smaller limit; when denied, the denying one with the
	// longest wait), then the others tightest first, shadow limits last.
	// A request denied from the denial cache lists only the limits that
	// denied it.
	Limits []LimitStatus
	// Held is what a check that went ahead holds of concurrency limits:
	// a slot in each, released by Settle with Held.ID (the request is
	// over), or free by itself at Held.Expires. Empty when it holds none.
	Held Reserved
}

// Limit returns the limit that speaks for the decision, or nil if none applied.
func (d *Decision) Limit() *LimitStatus {
	if len(d.Limits) == 0 {
		return nil
	}
	return &d.Limits[0]
}

// LimitStatus is where one limit stands after a request.
type LimitStatus struct {
	Rule    *Rule
	Allowed bool
	Shadow  bool
	// How the limit was decided, when not by the shared store.
	Degraded, Cached, Batched bool
	// KeyRefused: the key is new and its rule already tracks its
	// max_keys keys (Code KEY_LIMIT).
	KeyRefused bool
	Limit      int64
	Remaining  int64
	Window     time.Duration
	ResetAt    time.Time
	RetryAfter time.Duration // when denied
	// Charged is what the limit counted of the request: its cost when it
	// goes ahead; when it does not, nothing, unless the rule counts every
	// hit (Rule.CountOverLimit). Debt is how far past its limit the
	// limit's counter is (Remaining is then 0).
	Charged, Debt int64
}

// Stats are the engine's counters since it started. Safe to read at any time.
type Stats struct {
	Degraded atomic.Int64 // decisions made without the shared store
	// Global limits' cost admitted without the store (degraded.go), of
	// it written to the store since, and lost: its window ended before
	// the store came back.
	GlobalDegraded, GlobalWrittenBack, GlobalDegradedLost atomic.Int64
	StoreErrors                                           atomic.Int64
	DenialCacheHits, BatchHits                            atomic.Int64
	BatchTaken, BatchReturned, BatchLapsed                atomic.Int64 // tokens
	KeysRefused, KeysFolded                               atomic.Int64
	Penalties                                             atomic.Int64
	RuleReloads, RuleReloadErrors                         atomic.Int64
	ViolationsDropped                                     atomic.Int64
	// Siblings' denials refused: a key too long, a key of no rule in
	// force; and those held for less than they asked (see NoteDenial).
	DenialsTooLong, DenialsUnknownRule, DenialsCapped atomic.Int64
	// Reservations refunded when they ended unsettled (on_expiry:
	// refund), and those found too late to be (they stayed charged).
	ReservationsRefunded, ReservationsExpiredLate atomic.Int64
}

// Stats returns the engine's counters.
func (e *Engine) Stats() *Stats { return &e.stats }

// scratch is the per-check working memory, pooled so that a check in
// memory allocates nothing.
type scratch struct {
	reserve *reserveReq // the request's, if it is a reservation
	items   []item
	keys    []byte
	ops     []Op
	opItem  []int
	results []Result
	local   []Op
	localAt []int
}

// item is one limit that applies to the request being checked.
type item struct {
	rule        *Rule
	start, end  int // the store key in scratch.keys
	key         []byte
	params      Params
	cost        int64
	result      Result
	decided     bool // result is set
	degraded    bool
	unavailable bool
	cached      bool
	batched     bool // served from a batch: given back if the request is denied
	refused     bool
	storeNow    int64
	allowance   int64 // a global limit's: what the region may admit of it
	// degradedTaken: a global limit admitted in memory, without the
	// store (degraded.go), given back if the request is denied.
	degradedTaken bool
	// held is a global limit's budget of its own at the check's time,
	// once heldKnown: looked up once a check (heldFor), in the region's
	// budgets of generation heldGen (counterBudgets), where it is
	// heldEntry (which may have gone back to the rule by now: then held
	// is nil).
	held      *heldCounter
	heldKnown bool
	heldGen   uint64
	heldEntry *heldCounter
	// demand is what the region counts of a global limit's counter on its
	// own, once looked up (trackCounter); dn, the denial the cache denied
	// it with, or the one the check left there.
	demand *counterDemand
	dn     *denial
}

// Check decides whether the request may go through and fills d (reusing
// its Limits). It returns an error, wrapping ErrInvalidRequest and naming
// the field, for a request that is malformed; nothing is counted then.
func (e *Engine) Check(ctx context.Context, req *Request, d *Decision) error {
	d.Allowed, d.Code, d.Degraded, d.Bypassed, d.Limits, d.Held = false, CodeOK, false, false, d.Limits[:0], Reserved{}
	rs := e.rules.Load()
	addr, err := rs.validate(req)
	if err != nil {
		return err
	}
	now := e.now()
	d.Time = now
	if rs.Allowed(req.APIKey) {
		d.Allowed, d.Bypassed = true, true
		return nil
	}
	if rs.Blocked(req.APIKey) || e.blockedAt(req.APIKey, now) {
		d.Code = CodeBlocked
		e.violations.add(e, CodeBlocked, []byte(req.APIKey), nil, func() Violation {
			return Violation{Time: now, APIKey: req.APIKey, IP: req.IP, Endpoint: req.Endpoint}
		})
		return nil
	}
	sc := e.scratch.Get().(*scratch)
	defer e.scratch.Put(sc)
	sc.items, sc.keys, sc.reserve = sc.items[:0], sc.keys[:0], req.reserve
	if err := e.collect(ctx, sc, rs, req, addr, now); err != nil {
		return err
	}
	if len(sc.items) == 0 {
		d.Allowed = true
		return nil
	}
	var slots []byte // the region's key, to seal the slots the request takes
	if sc.reserve == nil && !req.CountNothing {
		slots = e.slotKey(ctx, sc)
	}
	us := now.UnixMicro()
	// A batch in hand is spent before the denial cache is asked: a sibling
	// request may have found the store empty just because this replica
	// took its last tokens in a batch.
	if sc.reserve == nil { // a reservation is held in the store
		e.takeBatches(sc, us)
	}
	if e.fromCache(sc, us) {
		// Denied without the store, but for the limits that count every
		// hit (count_over_limit): they count it even so.
		e.decide(ctx, sc, us, true)
		for i := range sc.items {
			it := &sc.items[i]
			if it.batched {
				e.unconsumeBatch(it)
			}
			switch {
			case !it.decided:
			case it.rule.CountOverLimit && !it.refused: // decided by the store just now
				e.recordItem(it, req, false, us)
			default: // denied from the cache, or refused
				e.violation(it, req, us)
				if it.rule.Scope == ScopeGlobal {
					e.noteGlobal(it, false, us) // demand denied for want of budget
				}
			}
		}
	} else {
		e.decide(ctx, sc, us, false)
		e.record(sc, req, us)
		if sc.reserve != nil {
			sc.reserve.noteHeld(sc.items)
		}
	}
	e.fill(d, sc)
	if slots != nil && d.Allowed {
		d.Held = e.sealSlots(slots, sc.items)
	}
	if d.Degraded {
		e.stats.Degraded.Add(1)
	}
	return nil
}

// Validate checks a request as Check would, without deciding or counting
// anything: an error wraps ErrInvalidRequest and names the field.
func (e *Engine) Validate(req *Request) error {
	rs := e.rules.Load()
	addr, err := rs.validate(req)
	if err != nil {
		return err
	}
	tier := rs.Tier(req)
	var buf [128]byte
	for _, r := range rs.candidates(req) {
		if !r.matches(req, tier, addr) {
			continue
		}
		if req.CountNothing || r.Shadow { // nothing to take; never denies
			continue
		}
		p := r.params(r.appendKey(buf[:0], req, tier), tier)
		if err := costError(r, p, req.Cost); err != nil {
			return err
		}
	}
	return nil
}

// costError says why a request's cost is wrong for rule r, or nil: more
// than its limit, or for a rule that counts it past its limit
// (CountOverLimit), more than it counts at once.
func costError(r *Rule, p Params, cost int64) error {
	if cost == 0 || r.Base.Algorithm == Concurrency {
		cost = r.Cost
	}
	if r.CountOverLimit {
		if cost > maxLimit {
			return &RequestError{Field: "cost", Msg: fmt.Sprintf("%d is more than rule %q counts at once (2^40)", cost, r.ID), Kind: ErrCostAboveLimit}
		}
		return nil
	}
	if cost > p.Limit {
		return &RequestError{Field: "cost", Msg: fmt.Sprintf("%d is more than rule %q can ever allow (%d)", cost, r.ID, p.Limit), Kind: ErrCostAboveLimit}
	}
	return nil
}

// collect finds the limits that apply, their keys, numbers and costs.
func (e *Engine) collect(ctx context.Context, sc *scratch, rs *RuleSet, req *Request, addr netip.Addr, now time.Time) error {
	tier := rs.Tier(req)
	for _, r := range rs.candidates(req) {
		if !r.matches(req, tier, addr) || req.Report && r.Base.Algorithm == Concurrency {
			continue
		}
		sc.items = append(sc.items, item{rule: r, start: len(sc.keys)})
		it := &sc.items[len(sc.items)-1]
		sc.keys = appendKeyPrefix(sc.keys, r.ID)
		ks := len(sc.keys)
		sc.keys = r.appendKey(sc.keys, req, tier)
		it.params = r.params(sc.keys[ks:], tier)
		it.cost = req.Cost
		switch {
		case req.CountNothing:
			it.cost = 0
		case it.cost == 0 || r.Base.Algorithm == Concurrency: // a slot a request
			it.cost = r.Cost
		}
		if r.CountOverLimit && !r.Shadow && it.cost > maxLimit {
			return costError(r, it.params, req.Cost)
		}
		if r.denyAll || it.cost > it.params.Limit && !r.CountOverLimit { // before the key cap: a bad request tracks no key
			if !r.denyAll && !r.Shadow {
				return costError(r, it.params, req.Cost)
			}
			// Denied, asking the store nothing: a limit of 0, or a cost
			// above a shadow rule's limit (which only says it would deny).
			us := now.UnixMicro()
			reset := it.params.resetAt(us)
			it.result = Result{Remaining: it.params.Limit, ResetAt: reset, RetryAfter: it.params.WindowMicros()}
			if r.denyAll {
				it.params.Limit, it.result.Remaining, it.result.RetryAfter = 0, 0, reset-us
			}
			it.decided = true
			sc.keys = append(sc.keys, keyClose)
			it.end = len(sc.keys)
			continue
		}
		folded := false
		if r.MaxKeys > 0 {
			switch e.admitKey(ctx, r, sc.keys[ks:], now) {
			case keyFolded:
				folded = true
			case keyRefused:
				it.refused = true
			}
		}
		if folded {
			sc.keys = overflowKey(sc.keys[:it.start], r.ID)
			it.params = r.overflow
		} else {
			sc.keys = append(sc.keys, keyClose)
		}
		it.end = len(sc.keys)
		if it.cost > it.params.Limit && !r.Shadow && !r.CountOverLimit { // folded into a smaller limit
			return costError(r, it.params, req.Cost)
		}
	}
	for i := range sc.items {
		sc.items[i].key = sc.keys[sc.items[i].start:sc.items[i].end]
	}
	return nil
}

// decide asks the store about every limit not served by a batch, and
// applies fallbacks when it cannot answer; onlyDebt, about the limits
// that count every hit (Rule.CountOverLimit) alone, of a request already
// denied.
func (e *Engine) decide(ctx context.Context, sc *scratch, now int64, onlyDebt bool) {
	sc.ops, sc.opItem = sc.ops[:0], sc.opItem[:0]
	if onlyDebt && sc.reserve != nil {
		return // an estimate denied is not usage: nothing is counted
	}
	inMemory := false // a global limit this replica admitted without the store has not been written yet
	for i := range sc.items {
		it := &sc.items[i]
		if it.decided || onlyDebt && !it.rule.CountOverLimit {
			continue
		}
		sc.ops = append(sc.ops, Op{Key: it.key, Params: it.params, Cost: it.cost, Shadow: it.rule.Shadow, Debt: it.rule.CountOverLimit, Batch: it.rule.Batch})
		if sc.reserve != nil { // an estimate: taken if it fits, from the store
			op := &sc.ops[len(sc.ops)-1]
			op.Debt, op.Batch = false, 0
		}
		if it.rule.Scope == ScopeGlobal {
			op := &sc.ops[len(sc.ops)-1]
			e.globalOp(op, it.rule, e.heldFor(it, now), time.UnixMicro(now))
			it.allowance = op.Allowance
			if e.shared && e.global.degraded.episode.Load() && sc.reserve != nil {
				// What replicas admitted in memory is not all in the store
				// yet, and the store would hold the estimate against what
				// it has: a reservation waits until it is (unavailable),
				// and the store is not asked for the others.
				sc.ops = sc.ops[:len(sc.ops)-1]
				it.decided, it.degraded, it.unavailable, it.storeNow = true, true, true, now
				it.result = Result{ResetAt: it.params.resetAt(now), RetryAfter: e.breakerWait()}
				inMemory = true
				continue
			}
			if e.shared && e.global.degraded.episode.Load() && it.rule.Fallback != FailClosed {
				sc.ops = sc.ops[:len(sc.ops)-1]
				e.degradedGlobal(it, it.allowance, now)
				inMemory = true
				continue
			}
		}
		sc.opItem = append(sc.opItem, i)
	}
	if inMemory && !commitsItems(sc.items) {
		// Denied in memory: the store is not asked (it would take what
		// the other limits allow), and only the limits that denied speak;
		// but those that count every hit count it.
		ops, at := sc.ops[:0], sc.opItem[:0]
		for j, i := range sc.opItem {
			if sc.ops[j].Debt {
				ops, at = append(ops, sc.ops[j]), append(at, i)
				continue
			}
			sc.items[i].decided = false
		}
		sc.ops, sc.opItem = ops, at
	}
	if len(sc.ops) == 0 {
		return
	}
	sc.results = slices.Grow(sc.results[:0], len(sc.ops))[:len(sc.ops)]
	storeNow, err := e.apply(ctx, sc.ops, sc.results, now)
	if err == nil {
		for j, i := range sc.opItem {
			it := &sc.items[i]
			it.result, it.decided, it.storeNow = sc.results[j], true, storeNow
		}
		return
	}
	// The store could not answer: each rule's fallback decides.
	e.storeError(err, now)
	sc.local, sc.localAt = sc.local[:0], sc.localAt[:0]
	for j, i := range sc.opItem {
		it := &sc.items[i]
		if it.rule.Scope == ScopeGlobal && sc.reserve == nil { // a reservation lives in the store, or nowhere
			e.degradedGlobal(it, it.allowance, now)
			continue
		}
		it.decided, it.degraded, it.storeNow = true, true, now
		fallback := it.rule.Fallback
		if sc.reserve != nil {
			fallback = FailClosed // a reservation lives in the store, or nowhere
		}
		switch fallback {
		case FailOpen:
			it.result = Result{Allowed: true, Remaining: it.params.Limit, ResetAt: it.params.resetAt(now)}
		case FailClosed:
			it.unavailable = true
			it.result = Result{Remaining: 0, ResetAt: it.params.resetAt(now), RetryAfter: e.breakerWait()}
		case LocalOnly:
			op := sc.ops[j]
			op.Batch = 0
			sc.local = append(sc.local, op)
			sc.localAt = append(sc.localAt, i)
		}
	}
	if len(sc.local) > 0 {
		res := slices.Grow(sc.results[:0], len(sc.local))[:len(sc.local)]
		e.local.apply(sc.local, res, now)
		for j, i := range sc.localAt {
			sc.items[i].result = res[j]
		}
	}
}

// commitsItems reports whether every enforced limit decided so far allows.
func commitsItems(items []item) bool {
	for i := range items {
		if it := &items[i]; it.decided && !it.rule.Shadow && !it.result.Allowed {
			return false
		}
	}
	return true
}

// storeError counts a failed store call and logs it, at most once a second
// with the count since: an outage under load must not flood the log.
func (e *Engine) storeError(err error, now int64) {
	n := e.stats.StoreErrors.Add(1)
	last := e.lastErrLog.Load()
	if now-last < 1e6 || !e.lastErrLog.CompareAndSwap(last, now) {
		return
	}
	e.log.Warn("store unavailable; rules fall back", "error", err, "breaker", e.breaker.State().String(),
		"errors", n-e.errsLogged.Swap(n))
}

// Timeout returns the bound on each call to a shared store
// (Config.Timeout).
func (e *Engine) Timeout() time.Duration { return e.cfg.Timeout }

// breakerWait is how long a fail_closed client should wait: until the
// breaker next probes the store.
func (e *Engine) breakerWait() int64 { return e.breaker.cfg.Cooldown.Microseconds() }

// apply calls the store: through the breaker and with the timeout, if it
// is shared.
func (e *Engine) apply(ctx context.Context, ops []Op, results []Result, now int64) (int64, error) {
	if !e.shared { // this process's memory, on the engine's clock
		e.local.apply(ops, results, now)
		return now, nil
	}
	ok, probe := e.breaker.allow()
	if !ok {
		return 0, errBreakerOpen
	}
	// Timeouts are real time, whatever clock the engine runs on.
	deadline := time.Now().Add(e.cfg.Timeout)
	callerFirst := false // the caller's deadline comes before ours
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		callerFirst = true
	}
	var storeNow int64
	var err error
	if ts, ok := e.store.(timedStore); ok {
		storeNow, err = ts.applyUntil(ctx, ops, results, deadline)
	} else {
		cctx, cancel := context.WithDeadline(ctx, deadline)
		storeNow, err = e.store.Apply(cctx, ops, results)
		cancel()
	}
	switch {
	case err == nil:
		e.breaker.success()
	case ctx.Err() != nil, callerFirst && errors.Is(err, context.DeadlineExceeded):
		// The caller gave up, or its deadline was the shorter: that says
		// nothing about the store.
		e.breaker.release(probe)
	default:
		e.breaker.failure()
		e.global.degraded.storeFailed(now)
	}
	return storeNow, err
}

var errBreakerOpen = fmt.Errorf("regional: circuit breaker open")

// record notes what the decision implies: batches kept or given back,
// denials cached and reported.
func (e *Engine) record(sc *scratch, req *Request, now int64) {
	allowed := true
	for i := range sc.items {
		it := &sc.items[i]
		if !it.rule.Shadow && !it.result.Allowed {
			allowed = false
		}
		if it.rule.Base.Algorithm == Concurrency && !it.unavailable {
			it.result.RetryAfter = min(it.result.RetryAfter, slotRetry.Microseconds())
		}
	}
	for i := range sc.items {
		if it := &sc.items[i]; it.decided { // a limit denied in memory spoke alone
			e.recordItem(it, req, allowed, now)
		}
	}
}

// recordItem is record of one limit the store (or a fallback) decided,
// for a request that goes ahead or not (allowed).
func (e *Engine) recordItem(it *item, req *Request, allowed bool, now int64) {
	switch {
	case it.batched && !allowed:
		e.unconsumeBatch(it)
	case it.result.Taken > it.cost && allowed:
		e.keepBatch(it, now)
	case it.degradedTaken && !allowed && !it.rule.CountOverLimit:
		e.uncountDegraded(it)
	case it.degradedTaken:
		e.stats.GlobalDegraded.Add(it.cost)
	}
	if it.rule.Scope == ScopeGlobal && (!it.degraded || it.result.OwnP != 0) {
		e.noteGlobal(it, allowed, now)
	}
	if !it.result.Allowed && !it.rule.Shadow && !it.degraded {
		// Not cached: the next hit of a limit that counts every hit is
		// counted in the store, denied or not; a concurrency limit's slot
		// may be released any moment.
		if !it.rule.CountOverLimit && it.rule.Base.Algorithm != Concurrency {
			e.rememberDenial(it, now)
		}
		e.violation(it, req, now)
	}
}

// violation records a limit's denial in the audit trail.
func (e *Engine) violation(it *item, req *Request, now int64) {
	code := CodeOverLimit
	if it.refused {
		code = CodeKeyLimit
	}
	var ref *violationRef
	if it.dn != nil && !it.refused {
		ref = &it.dn.viol
	}
	e.violations.add(e, code, it.key, ref, func() Violation {
		return Violation{Time: time.UnixMicro(now), Rule: it.rule.ID, Key: string(it.key),
			APIKey: req.APIKey, IP: req.IP, Endpoint: req.Endpoint, Limit: it.params.Limit, Cost: it.cost,
			RetryAfter: time.Duration(it.result.RetryAfter) * time.Microsecond}
	})
}

// fill turns the items into the decision.
func (e *Engine) fill(d *Decision, sc *scratch) {
	d.Allowed = true
	for i := range sc.items {
		it := &sc.items[i]
		if !it.decided {
			continue
		}
		r := it.result
		st := LimitStatus{Rule: it.rule, Allowed: r.Allowed, Shadow: it.rule.Shadow, Debt: max(0, -r.Remaining), Charged: r.Taken,
			Degraded: it.degraded, Cached: it.cached, Batched: it.batched, KeyRefused: it.refused,
			Limit: it.params.Limit, Remaining: max(0, r.Remaining),
			Window: time.Duration(it.params.WindowMicros()) * time.Microsecond,
			// In whole µs, as the store keeps time: d.Time's nanoseconds
			// would put a window's end just after it.
			ResetAt:    time.UnixMicro(d.Time.UnixMicro() + r.ResetAt - it.storeNow),
			RetryAfter: time.Duration(r.RetryAfter) * time.Microsecond}
		if it.storeNow == 0 {
			st.ResetAt = time.UnixMicro(r.ResetAt)
		}
		d.Limits = append(d.Limits, st)
		if it.degraded {
			d.Degraded = true
		}
		if !r.Allowed && !it.rule.Shadow {
			d.Allowed = false
			switch {
			case it.unavailable:
				d.Code = CodeUnavailable
			case it.refused && d.Code != CodeUnavailable:
				d.Code = CodeKeyLimit
			case d.Code == CodeOK:
				d.Code = CodeOverLimit
			}
		}
	}
	if !d.Allowed {
		// A denied request takes nothing: the limits that would have
		// allowed it keep what they had.
		for i := range d.Limits {
			if l := &d.Limits[i]; l.Allowed && !l.Shadow && !l.Degraded && !l.Rule.CountOverLimit {
				l.Remaining, l.Charged = min(l.Limit, l.Remaining+sc.items[i].cost), 0
			}
		}
	}
	if len(d.Limits) > 1 {
		slices.SortStableFunc(d.Limits, func(a, b LimitStatus) int { return SpeaksBefore(a, b, d.Allowed) })
	}
}

// SpeaksBefore orders limits as Decision.Limits says, for a decision
// allowed or not: the one that speaks for it first (docs/design.md).
func SpeaksBefore(a, b LimitStatus, allowed bool) int {
	if a.Shadow != b.Shadow {
		if a.Shadow {
			return 1
		}
		return -1
	}
	if !allowed && a.Allowed != b.Allowed {
		if !a.Allowed {
			return -1
		}
		return 1
	}
	if !allowed && a.RetryAfter != b.RetryAfter {
		if a.RetryAfter > b.RetryAfter {
			return -1
		}
		return 1
	}
	if a.Remaining != b.Remaining {
		if a.Remaining < b.Remaining {
			return -1
		}
		return 1
	}
	switch {
	case a.Limit < b.Limit:
		return -1
	case a.Limit > b.Limit:
		return 1
	}
	return 0
}
