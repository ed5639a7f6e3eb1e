package regional

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/geoquota/geoquota/crdt"
)

// Admin operations on counters, and runtime blocks. Counters are named by
// a rule and the request values their key is made of.

// ErrUnknownRule is returned for an admin call naming no rule in force.
var ErrUnknownRule = errors.New("regional: unknown rule")

// counter finds the store key and numbers of rule id's counter for req.
func (e *Engine) counter(id string, req *Request) (*Rule, counterKey, Params, error) {
	rs := e.rules.Load()
	r := rs.Rule(id)
	if r == nil {
		return nil, counterKey{}, Params{}, fmt.Errorf("%w %q", ErrUnknownRule, id)
	}
	if _, err := rs.validate(req); err != nil {
		return nil, counterKey{}, Params{}, err
	}
	tier := rs.Tier(req)
	for _, name := range r.By {
		if name == "tier" && tier == "" {
			return nil, counterKey{}, Params{}, &RequestError{Field: "tier", Msg: "rule " + strconv.Quote(id) + " counts by tier"}
		}
		if _, ok := req.Value(name); name != "tier" && !ok {
			return nil, counterKey{}, Params{}, &RequestError{Field: name, Msg: "rule " + strconv.Quote(id) + " counts by it"}
		}
	}
	key := appendKeyPrefix(nil, r.ID)
	ks := len(key)
	key = r.appendKey(key, req, tier)
	p := r.params(key[ks:], tier)
	if p.Limit == 0 {
		return nil, counterKey{}, Params{}, &RequestError{Field: "tier", Msg: "rule " + strconv.Quote(id) + " has no limit for tier " + strconv.Quote(tier)}
	}
	key = append(key, keyClose)
	return r, counterKey{store: key, values: key[ks : len(key)-1]}, p, nil
}

// counterKey is a counter's key in the store, and the part of it made of
// the request's values.
type counterKey struct{ store, values []byte }

func status(r *Rule, p Params, res Result) LimitStatus {
	return LimitStatus{Rule: r, Allowed: res.Allowed, Shadow: r.Shadow, Limit: p.Limit, Remaining: max(0, res.Remaining), Debt: max(0, -res.Remaining),
		Window: time.Duration(p.WindowMicros()) * time.Microsecond, ResetAt: time.UnixMicro(res.ResetAt)}
}

// Usage is where a counter stands, as operators ask for it.
type Usage struct {
	LimitStatus
	// Key is the counter key: the rule's descriptor values, joined by |.
	Key       string
	Algorithm Algorithm
	// WindowStart is the start of the current window, for window
	// algorithms; zero otherwise.
	WindowStart time.Time
	// Global is set for a global rule: GlobalUsed is what all regions
	// used in the window, as this region's store has them, and Regions
	// each region's part.
	Global     bool
	GlobalUsed int64
	Regions    []RegionUsage
}

// RegionUsage is one region's part of a global counter's window.
type RegionUsage struct {
	Region string
	Used   int64
	// Share is the fraction of the limit the region may admit, as the
	// last lease known here says, or -1 if none is known.
	Share float64
}

// Usage reports where rule's counter for req stands, changing nothing.
func (e *Engine) Usage(ctx context.Context, rule string, req *Request) (Usage, error) {
	r, key, p, err := e.counter(rule, req)
	if err != nil {
		return Usage{}, err
	}
	if r.Scope == ScopeGlobal {
		return e.globalUsage(ctx, r, key, p, e.now())
	}
	res, err := e.store.Inspect(ctx, key.store, p)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{LimitStatus: status(r, p, res), Algorithm: p.Algorithm, Key: string(key.values)}
	if p.Window > 0 {
		now := e.now().UnixMicro()
		u.WindowStart = time.UnixMicro(now / p.Window * p.Window)
	}
	return u, nil
}

// UsageAt reports a global rule's window that contains at, as this
// region's store has it: past windows are kept until a window (at least
// a minute) after they end, for globalsync and for whoever checks that
// every region agrees. A window older than that is a WindowExpiredError
// (ErrWindowExpired), one not begun a RequestError. A rule that is not
// global keeps no past windows.
func (e *Engine) UsageAt(ctx context.Context, rule string, req *Request, at time.Time) (Usage, error) {
	r, key, p, err := e.counter(rule, req)
	if err != nil {
		return Usage{}, err
	}
	if r.Scope != ScopeGlobal {
		return Usage{}, &RequestError{Field: "window_start", Msg: fmt.Sprintf("%q is not a global rule: only global rules keep past windows", r.ID)}
	}
	if err := keptWindow(r, &p, at, e.now()); err != nil {
		return Usage{}, err
	}
	return e.globalUsage(ctx, r, key, p, at)
}

// Inspect returns where a counter stands, changing nothing.
func (e *Engine) Inspect(ctx context.Context, rule string, req *Request) (LimitStatus, error) {
	u, err := e.Usage(ctx, rule, req)
	return u.LimitStatus, err
}

// errGlobalAdmin refuses resets and grants of a global rule's counters:
// they are a window's slots in every region, not this region's to change.
func errGlobalAdmin(r *Rule) error {
	return &RequestError{Field: "rule", Msg: fmt.Sprintf("%q is a global rule: its counters are every region's usage and cannot be reset or granted here", r.ID)}
}

// Reset starts a counter afresh, here and in the store.
func (e *Engine) Reset(ctx context.Context, rule string, req *Request) error {
	r, key, p, err := e.counter(rule, req)
	if err != nil {
		return err
	}
	if r.Scope == ScopeGlobal {
		return errGlobalAdmin(r)
	}
	e.forget(key.store, false)
	return e.store.Reset(ctx, key.store, p)
}

// Grant gives a counter n more (see Store.Grant) and returns where it stands.
func (e *Engine) Grant(ctx context.Context, rule string, req *Request, n int64) (LimitStatus, error) {
	if n < 1 || n > maxLimit {
		return LimitStatus{}, &RequestError{Field: "amount", Msg: fmt.Sprintf("must be between 1 and %d", int64(maxLimit))}
	}
	r, key, p, err := e.counter(rule, req)
	if err != nil {
		return LimitStatus{}, err
	}
	if r.Scope == ScopeGlobal {
		return LimitStatus{}, errGlobalAdmin(r)
	}
	e.forget(key.store, true)
	res, err := e.store.Grant(ctx, key.store, p, n)
	if err != nil {
		return LimitStatus{}, err
	}
	return status(r, p, res), nil
}

// forget drops what this replica remembers of a counter. What is left of
// its batch goes back if giveBack is set; after a reset nothing is owed,
// and giving it back would put the new count below zero.
func (e *Engine) forget(key []byte, giveBack bool) {
	e.denials.with(key, func(m map[string]*denial) {
		if _, ok := m[string(key)]; ok {
			delete(m, string(key))
			e.denialCount.Add(-1)
		}
	})
	e.batches.with(key, func(m map[string]*batch) {
		if l := m[string(key)]; l != nil {
			delete(m, string(key))
			if giveBack {
				e.endBatch(string(key), l)
			}
		}
	})
}

// Block is a runtime block: API keys matching Pattern are denied with
// KEY_BLOCKED until Until (forever if zero).
type Block struct {
	Pattern string
	Until   time.Time
}

type block struct {
	Block
	glob glob
}

// BlockStore keeps runtime blocks where every replica of a region sees
// them. The Redis store is one; without one, blocks are this replica's.
type BlockStore interface {
	SaveBlock(ctx context.Context, b Block) error
	DeleteBlock(ctx context.Context, pattern string) error
	LoadBlocks(ctx context.Context) ([]Block, error)
}

// Block denies API keys matching the glob pattern until the given time
// (zero: until Unblock), in every replica that shares the store.
func (e *Engine) Block(ctx context.Context, b Block) error {
	g, err := compileGlob(b.Pattern)
	if err != nil || len(b.Pattern) > MaxValueLen {
		return &RequestError{Field: "pattern", Msg: fmt.Sprintf("want a glob of 1 to %d bytes", MaxValueLen)}
	}
	if strings.Trim(b.Pattern, "*?") == "" {
		// As the rules file's block refuses it.
		return &RequestError{Field: "pattern", Msg: fmt.Sprintf("%q blocks every API key: every request would be denied", b.Pattern)}
	}
	if !b.Until.IsZero() && !b.Until.After(e.now()) {
		return &RequestError{Field: "until", Msg: "in the past: the block would block nothing"}
	}
	if bs, ok := e.store.(BlockStore); ok {
		if err := bs.SaveBlock(ctx, b); err != nil {
			return err
		}
	}
	e.setBlocks(func(list []block) []block {
		list = slices.DeleteFunc(list, func(x block) bool { return x.Pattern == b.Pattern })
		return append(list, block{Block: b, glob: g})
	})
	return nil
}

// Unblock lifts a runtime block.
func (e *Engine) Unblock(ctx context.Context, pattern string) error {
	if bs, ok := e.store.(BlockStore); ok {
		if err := bs.DeleteBlock(ctx, pattern); err != nil {
			return err
		}
	}
	e.setBlocks(func(list []block) []block {
		return slices.DeleteFunc(list, func(x block) bool { return x.Pattern == pattern })
	})
	return nil
}

// Blocks returns the runtime blocks in force.
func (e *Engine) Blocks() []Block {
	now := e.now()
	var out []Block
	for _, b := range *e.blocks.Load() {
		if b.Until.IsZero() || b.Until.After(now) {
			out = append(out, b.Block)
		}
	}
	return out
}

func (e *Engine) setBlocks(f func([]block) []block) {
	e.blockMu.Lock()
	defer e.blockMu.Unlock()
	list := f(slices.Clone(*e.blocks.Load()))
	e.blocks.Store(&list)
}

func (e *Engine) blockedAt(apiKey string, now time.Time) bool {
	if apiKey == "" {
		return false
	}
	for _, b := range *e.blocks.Load() {
		if (b.Until.IsZero() || b.Until.After(now)) && b.glob.match(apiKey) {
			return true
		}
	}
	return false
}

// syncBlocks takes the blocks from the store, where siblings put theirs.
func (e *Engine) syncBlocks(ctx context.Context) error {
	bs, ok := e.store.(BlockStore)
	if !ok {
		return nil
	}
	loaded, err := bs.LoadBlocks(ctx)
	if err != nil {
		return err
	}
	list := make([]block, 0, len(loaded))
	for _, b := range loaded {
		if g, err := compileGlob(b.Pattern); err == nil {
			list = append(list, block{Block: b, glob: g})
		}
	}
	e.blockMu.Lock()
	e.blocks.Store(&list)
	e.blockMu.Unlock()
	return nil
}

// Maintain does the engine's periodic work: gives a store back after an
// outage the global counters this replica holds, drops the windows the
// store no longer keeps from its copy of them, gives back what is left
// of ended batches, drops expired cache entries and untracked keys, writes
// pending violations to the log, and takes runtime blocks from the store.
// Call it every few hundred milliseconds (Run does).
func (e *Engine) Maintain(ctx context.Context) error {
	if n := e.breaker.recoveries.Load(); n != e.reseeded.Load() {
		// The store is back after an outage: give it back the global
		// counters this replica holds.
		if err := e.reseedStore(ctx); err != nil {
			e.log.Warn("global counters not given back to the store", "err", err)
		} else {
			e.reseeded.Store(n)
		}
	}
	now := e.now()
	us := now.UnixMicro()
	e.expireGlobal(now)
	var errs []error
	if gs, ok := e.store.(GlobalStore); ok && e.shared {
		// What fails here fails while the store does: logged as a
		// check's failure is, at most once a second.
		if _, err := e.writeBack(ctx, gs, now); err != nil {
			e.storeError(err, us)
		} else if err := e.heartbeat(ctx, gs); err != nil {
			e.storeError(err, us)
		}
	}
	// After the heartbeat, which the region's degraded allowances wait on.
	if _, err := e.refundExpired(ctx); err != nil {
		e.storeError(err, us) // logged at most once a second, as a check's failure
	}
	e.batches.sweep(func(key string, l *batch) bool {
		if l.expires > us {
			return false
		}
		e.endBatch(key, l)
		return true
	})
	e.returnsMu.Lock()
	returns := e.returns
	e.returns = nil
	e.returnsMu.Unlock()
	var retry []batchReturn
	for _, r := range returns {
		given, err := e.store.Refund(ctx, []byte(r.key), r.params, r.n, r.takenAt)
		if err != nil {
			if r.tries++; r.tries < 5 { // the store may be back next time
				retry = append(retry, r)
			}
			errs = append(errs, err)
			continue
		}
		e.stats.BatchReturned.Add(given)
		e.stats.BatchLapsed.Add(r.n - given)
	}
	if len(retry) > 0 {
		e.returnsMu.Lock()
		e.returns = append(e.returns, retry...)
		e.returnsMu.Unlock()
	}
	e.denials.sweep(func(_ string, d *denial) bool {
		if d.until <= us {
			e.denialCount.Add(-1)
			return true
		}
		return false
	})
	rs := e.rules.Load()
	var gone []string
	if m := e.trackers.Load(); m != nil {
		for id, tr := range *m {
			r := rs.Rule(id)
			if r == nil || r.MaxKeys == 0 {
				gone = append(gone, id)
				continue
			}
			// A rule's window, or its refill period: every limit of a
			// rule has the same, whatever its tier.
			tr.forget(us, regionKeysGen(r.Base.WindowMicros()))
		}
	}
	if len(gone) > 0 {
		e.dropTrackers(gone)
	}
	if vs := e.violations.drain(); len(vs) > 0 {
		if e.cfg.RedactKeys {
			for i := range vs {
				vs[i] = vs[i].redacted()
			}
		}
		for _, v := range vs {
			e.log.Info("rate limit violation", "region", v.Region, "rule", v.Rule, "code", v.Code, "key", v.Key,
				"api_key", v.APIKey, "ip", v.IP, "endpoint", v.Endpoint, "count", v.Count, "retry_after", v.RetryAfter)
		}
		if e.cfg.Violations != nil {
			if err := e.cfg.Violations.Append(ctx, vs); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := e.syncBlocks(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Run calls Maintain every interval until ctx ends.
func (e *Engine) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := e.Maintain(ctx); err != nil {
				e.log.Warn("maintenance", "error", err)
			}
		}
	}
}

// globalUsage is Usage for a global rule: the window's slots.
func (e *Engine) globalUsage(ctx context.Context, r *Rule, key counterKey, p Params, at time.Time) (Usage, error) {
	now := e.now()
	start := at.UnixMicro() / p.Window * p.Window
	var slots []crdt.Slot
	if gs, ok := e.store.(GlobalStore); ok {
		var err error
		if slots, err = gs.ReadGlobal(ctx, key.store, start/1000); err != nil {
			return Usage{}, err
		}
		if p.Algorithm == Concurrency {
			// In flight: the slots of the window before count still.
			prev, err := gs.ReadGlobal(ctx, key.store, (start-p.Window)/1000)
			if err != nil {
				return Usage{}, err
			}
			slots = append(slots, prev...)
		}
	}
	u := Usage{Algorithm: p.Algorithm, Key: string(key.values), WindowStart: time.UnixMicro(start), Global: true}
	used := map[string]int64{}
	for _, s := range slots {
		n := int64(s.P) - int64(s.N)
		used[s.Region] += n
		u.GlobalUsed += n
	}
	for _, name := range e.global.regions {
		ru := RegionUsage{Region: name, Used: used[name], Share: -1}
		if name == e.cfg.Region {
			ru.Share, _, _ = e.allowance(r, key.store, now)
		} else {
			ru.Share = e.otherAllowance(r.ID, name, now)
		}
		u.Regions = append(u.Regions, ru)
	}
	u.LimitStatus = LimitStatus{Rule: r, Allowed: u.GlobalUsed < p.Limit, Limit: p.Limit, Remaining: max(0, p.Limit-u.GlobalUsed), Debt: max(0, u.GlobalUsed-p.Limit),
		Window: time.Duration(p.Window) * time.Microsecond, ResetAt: time.UnixMicro(start + p.Window)}
	return u, nil
}
