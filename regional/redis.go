package regional

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/redis/go-redis/v9"
)

// The scripts of checks begin with lua/head.lua (the time and the minimum
// TTL), and those that may wait for a token bucket with lua/wait.lua.
var (
	//go:embed lua/head.lua
	headLua string
	//go:embed lua/wait.lua
	waitLua string
	//go:embed lua/limits.lua
	limitsBody string
	limitsLua  = headLua + waitLua + limitsBody
)

//go:embed lua/merge.lua
var mergeLua string

var mergeScript = redis.NewScript(mergeLua)

//go:embed lua/add.lua
var addLua string

var addScript = redis.NewScript(addLua)

//go:embed lua/replicas.lua
var replicasLua string

var replicasScript = redis.NewScript(replicasLua)

//go:embed lua/keys.lua
var keysLua string

var keysScript = redis.NewScript(keysLua)

var (
	limitsScript = redis.NewScript(limitsLua)
	limitsSHA    = limitsScript.Hash()
)

// checks.lua decides checks of one limit of a common kind (a token bucket
// or a fixed window, not global), what limits.lua does for them with
// nothing else for Redis to run, and every such check of a pipeline in
// one script call: Redis spends more on a call than on a check
// (docs/benchmarks.md).
var (
	//go:embed lua/plain.lua
	plainLua string
	//go:embed lua/checks.lua
	checksBody string
	checksLua  = headLua + waitLua + plainLua + checksBody
	checksSHA  = redis.NewScript(checksLua).Hash()
	// checksSHAArg is checksSHA boxed once, for every call.
	checksSHAArg any = checksSHA
)

// settles.lua settles reservations of one limit of the same common kind
// (see plainSettle), every such settlement of a pipeline in one script
// call, as checks.lua checks: a settlement costs Redis no more than a
// check (docs/benchmarks.md#reservations).
var (
	//go:embed lua/settles.lua
	settlesBody string
	settlesLua  = headLua + waitLua + plainLua + settlesBody
	settlesSHA  = redis.NewScript(settlesLua).Hash()
	// settlesSHAArg is settlesSHA boxed once, for every call.
	settlesSHAArg any = settlesSHA
)

// scripts are every script the store runs, loaded on every connection
// and again on NOSCRIPT.
var scripts = []string{limitsLua, checksLua, settlesLua, mergeLua, addLua, replicasLua, keysLua}

// ErrStoreClosed is returned by a store used after Close.
var ErrStoreClosed = errors.New("regional: store closed")

// RedisOptions tune a RedisStore. The zero value is sensible.
type RedisOptions struct {
	// Pipelines is how many pipelines may be in flight at once; 0 means 4.
	// Concurrent checks wait for a free one and share it.
	Pipelines int
	// MaxBatch bounds the checks sent in one pipeline; 0 means 256.
	MaxBatch int
	// Timeout bounds one pipeline's round trip; 0 means 50ms. Callers
	// usually bound their own wait with a shorter context.
	Timeout time.Duration
	// Region names this region's slot of global counters.
	Region string
	// Observe, if set, hears of every pipeline: how long it took, how many
	// checks it carried, and its error. It is called on the store's own
	// goroutines and must not block (a metrics histogram, say).
	Observe func(took time.Duration, checks int, err error)
	// Auth is how to authenticate to Redis, and TLS.
	Auth RedisAuth
}

func (o RedisOptions) withDefaults() RedisOptions {
	if o.Pipelines <= 0 {
		o.Pipelines = 4
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	if o.Timeout <= 0 {
		o.Timeout = 50 * time.Millisecond
	}
	return o
}

// RedisStore keeps counters in Redis and runs the algorithms there, as Lua,
// with the server's clock. Each check costs one EVALSHA per Cluster slot it
// touches (one in all for a single server or Sentinel), and the checks of
// concurrent callers share pipelines. It is safe for concurrent use; Close
// stops it.
type RedisStore struct {
	client  redis.UniversalClient
	cluster bool
	opts    RedisOptions
	queue   chan *redisCall
	stop    chan struct{}
	wg      sync.WaitGroup
	calls   sync.Pool
	// checkArgs are checks.lua's arguments of each rule's limit, encoded
	// once: a map written anew when a limit is new, read without a lock.
	checkArgs   atomic.Pointer[map[Params]*[3]any]
	checkArgsMu sync.Mutex
	// clockOffset is how far Redis's clock (TIME) runs ahead of this
	// process's, in µs, as the last script's time says (clockKnown once
	// one has answered): a check tells the script, in Redis's time, when
	// to do nothing rather than count (see notAfter).
	clockOffset atomic.Int64
	clockKnown  atomic.Bool

	// For tests: the time scripts use instead of TIME, in µs, and a floor
	// on TTLs (ms) so that keys do not expire in real time while a test
	// runs in virtual time.
	testNow    func() int64
	testMinTTL int64
}

// NewRedisStore connects to Redis as regiond's --redis flag says:
//
//	redis://host:port/db, rediss://…          a single server (URL options as go-redis parses them)
//	unix:///path/to/redis.sock?db=N            a single server on this host, by its Unix socket
//	redis-sentinel://host:port,host:port/name  a primary managed by Sentinel
//	host:port,host:port,…                      a Redis Cluster
//
// and loads the scripts, which checks that Redis answers.
func NewRedisStore(ctx context.Context, spec string, opts RedisOptions) (*RedisStore, error) {
	client, cluster, err := NewRedisClient(spec, opts.Auth)
	if err != nil {
		return nil, err
	}
	s := newRedisStore(client, cluster, opts)
	if err := s.loadScripts(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("regional: redis %s: %w", spec, err)
	}
	return s, nil
}

// NewRedisClient makes the go-redis client for a --redis value (see
// NewRedisStore) and its authentication, with the scripts loaded on every
// new connection.
func NewRedisClient(spec string, auth RedisAuth) (client redis.UniversalClient, cluster bool, err error) {
	if err := auth.Check(); err != nil {
		return nil, false, err
	}
	onConnect := func(ctx context.Context, cn *redis.Conn) error {
		// go-redis also runs this on its connections to sentinels, which
		// have no scripts; the NOSCRIPT path covers any server missed.
		for _, src := range scripts[:2] { // those of every check
			if err := cn.ScriptLoad(ctx, src).Err(); err != nil {
				if strings.HasPrefix(err.Error(), "ERR unknown command") {
					return nil
				}
				return err
			}
		}
		return nil
	}
	switch {
	case strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"), strings.HasPrefix(spec, "unix://"):
		o, err := redis.ParseURL(spec)
		if err != nil {
			return nil, false, fmt.Errorf("regional: --redis %q: %w", spec, err)
		}
		if o.Username, o.Password, err = auth.credentials(o.Username, o.Password); err != nil {
			return nil, false, err
		}
		if o.TLSConfig, err = auth.tlsConfig(o.TLSConfig); err != nil {
			return nil, false, err
		}
		if o.Network == "unix" && o.TLSConfig != nil {
			return nil, false, fmt.Errorf("regional: --redis %q: Redis serves no TLS on a Unix socket; drop --redis-tls, --redis-ca and --redis-cert", spec)
		}
		o.OnConnect, o.ContextTimeoutEnabled = onConnect, true
		return redis.NewClient(o), false, nil
	case strings.HasPrefix(spec, "redis-sentinel://"):
		u, err := url.Parse(spec)
		name := strings.Trim(u.Path, "/")
		if err != nil || u.Host == "" || name == "" {
			return nil, false, fmt.Errorf("regional: --redis %q: want redis-sentinel://host:port,host:port/mastername", spec)
		}
		o := &redis.FailoverOptions{MasterName: name, SentinelAddrs: strings.Split(u.Host, ","), OnConnect: onConnect, ContextTimeoutEnabled: true,
			SentinelPassword: auth.SentinelPassword}
		var user, password string
		if u.User != nil {
			user = u.User.Username()
			password, _ = u.User.Password()
		}
		if o.Username, o.Password, err = auth.credentials(user, password); err != nil {
			return nil, false, err
		}
		if o.TLSConfig, err = auth.tlsConfig(nil); err != nil {
			return nil, false, err
		}
		if db := u.Query().Get("db"); db != "" {
			if o.DB, err = strconv.Atoi(db); err != nil {
				return nil, false, fmt.Errorf("regional: --redis %q: db %q is not a number", spec, db)
			}
		}
		return redis.NewFailoverClient(o), false, nil
	case strings.Contains(spec, "://"):
		return nil, false, fmt.Errorf("regional: --redis %q: unknown scheme; want redis://, rediss://, unix://, redis-sentinel:// or host:port,host:port for a Cluster", spec)
	default:
		addrs := strings.Split(spec, ",")
		for _, a := range addrs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, false, fmt.Errorf("regional: --redis %q: %q is not host:port", spec, a)
			}
		}
		tc, err := auth.tlsConfig(nil)
		if err != nil {
			return nil, false, err
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, OnConnect: onConnect, ContextTimeoutEnabled: true,
			Username: auth.Username, Password: auth.Password, TLSConfig: tc}), true, nil
	}
}

func newRedisStore(client redis.UniversalClient, cluster bool, opts RedisOptions) *RedisStore {
	opts = opts.withDefaults()
	s := &RedisStore{client: client, cluster: cluster, opts: opts,
		queue: make(chan *redisCall, opts.Pipelines*opts.MaxBatch), stop: make(chan struct{})}
	s.calls.New = func() any { return &redisCall{done: make(chan struct{}, 1)} }
	for range opts.Pipelines {
		s.wg.Add(1)
		go s.worker()
	}
	return s
}

// Client returns the go-redis client the store uses.
func (s *RedisStore) Client() redis.UniversalClient { return s.client }

// Close stops the store's pipelines and closes its client.
func (s *RedisStore) Close() error {
	select {
	case <-s.stop:
		return nil
	default:
	}
	close(s.stop)
	s.wg.Wait()
	for {
		select {
		case c := <-s.queue:
			c.err = ErrStoreClosed
			c.done <- struct{}{}
		default:
			return s.client.Close()
		}
	}
}

// redisCall is one check: one script run, or one per slot in a Cluster.
// It owns copies of its keys and arguments and its own results, so a
// caller that gives up waiting leaves nothing of its own in the worker's
// hands.
type redisCall struct {
	limits  []redisLimit
	groups  []redisGroup
	results []Result
	// settled is a settlement's (mode settle) answer beside results; a
	// settlement is made once, kept whatever its caller does.
	settled []Settlement
	check   bool // mode check: runs late, it does nothing (notAfter)
	// state says who had the call first once it was sent: the worker,
	// delivering its results (callDelivered), or its caller, giving up
	// (callAbandoned); the worker gives back what an abandoned call took.
	state    atomic.Int32
	deadline time.Time
	now      int64
	err      error
	done     chan struct{}
	// timer bounds the caller's wait; pooled with the call (stopped, it
	// delivers nothing stale: Go 1.23's timers).
	timer *time.Timer
}

type redisLimit struct {
	key                string
	params             Params
	cost               int64
	shadow, debt       bool
	batch              int64
	mark               string // a settlement's: the key that keeps it (mode settle; none for a slot)
	settle             bool   // mode settle: the reply says what it did
	global             bool
	at                 int64 // when the store decided it: its group's time (µs)
	allowance, ceiling int64
	known              [3]int64 // window start (ms), P, N
}

// redisGroup is the limits of one call that share a Cluster slot, and the
// script run that decides them: limits.lua of its own, or, for a common
// check (see plainCheck), its part of the pipeline's checks.lua, or for a
// common settlement (plainSettle), of its settles.lua.
type redisGroup struct {
	slot    uint16
	plain   bool    // checks.lua's or settles.lua's: key and args are its part of the call
	settles bool    // settles.lua's: the counter's settlements' key (mark) follows key
	key     *string // the plain script's key: the limit's (no copy to box)
	mark    *string // settles.lua's second key: the limit's mark
	limits  []int   // indexes into the call's limits
	keys    []string
	args    []any
	cmd     *redis.Cmd // limits.lua's
	// The reply: the script's time, the limits' numbers, or its error.
	now  int64
	vals []int64
	err  error
}

func (s *RedisStore) newCall(ops []Op, mode string, n, at int64) *redisCall {
	c := s.calls.Get().(*redisCall)
	// The limits do not move once made: a plain check's arguments point
	// into them.
	c.limits, c.groups, c.err, c.now = slices.Grow(c.limits[:0], len(ops)), c.groups[:0], nil, 0
	c.results = slices.Grow(c.results[:0], len(ops))[:len(ops)]
	clear(c.results)
	c.settled = c.settled[:0]
	c.check = mode == "check"
	c.state.Store(callPending)
	plain := plainCheck(mode, ops)
	for i, op := range ops {
		c.limits = append(c.limits, redisLimit{key: string(op.Key), params: op.Params, cost: op.Cost, shadow: op.Shadow, debt: op.Debt, batch: op.Batch,
			global: op.Global, allowance: op.Allowance, ceiling: op.Ceiling,
			known: [3]int64{op.KnownStart, int64(op.KnownP), int64(op.KnownN)}})
		var slot uint16 // one group on a single server
		if s.cluster {
			slot = keySlot(op.Key)
		}
		g := 0
		// A single server runs all limits in one script; a Cluster, one
		// script per slot (the keys of one counter share a hash tag).
		for s.cluster && g < len(c.groups) && c.groups[g].slot != slot {
			g++
		}
		if g == len(c.groups) {
			// A pooled call keeps its groups' buffers: reuse them.
			c.groups = slices.Grow(c.groups, 1)[:g+1]
			grp := &c.groups[g]
			grp.slot, grp.plain, grp.settles, grp.limits, grp.keys, grp.cmd, grp.vals = slot, plain, false, grp.limits[:0], grp.keys[:0], nil, nil
			grp.args = grp.args[:0]
			if !plain {
				grp.args = s.appendArgsHead(grp.args, mode, n, at)
			}
		}
		grp := &c.groups[g]
		grp.limits = append(grp.limits, i)
		if plain {
			l := &c.limits[i]
			if l.debt {
				l.batch = plainDebt // a rule with debt takes no batches
			}
			grp.key, grp.args = &l.key, append(grp.args, s.checkArgsOf(l.params)[:]...)
			grp.args = append(grp.args, &l.cost, &l.batch)
			continue
		}
		grp.keys, grp.args = c.limits[i].appendArgs(grp.keys, grp.args)
	}
	return c
}

// plainDebt is checks.lua's batch argument of a limit that counts debt
// (Op.Debt).
const plainDebt = -1

// plainCheck is whether checks.lua decides a call's ops: a check of one
// limit, not global, a token bucket or a fixed window.
func plainCheck(mode string, ops []Op) bool {
	if mode != "check" || len(ops) != 1 || ops[0].Global {
		return false
	}
	a := ops[0].Params.Algorithm
	return a == TokenBucket || a == FixedWindow
}

// checkArgsOf is a limit's first three arguments to checks.lua (see
// lua/checks.lua): its algorithm, limit, and rate or window, encoded once
// for every check of it. It keeps those of at most maxCheckArgs limits;
// beyond them (a great many overrides) it encodes a limit's anew each
// time, as it would without the map.
func (s *RedisStore) checkArgsOf(p Params) *[3]any {
	if m := s.checkArgs.Load(); m != nil {
		if a, ok := (*m)[p]; ok {
			return a
		}
	}
	a := &[3]any{int(p.Algorithm), p.Limit, p.Window}
	if p.Algorithm == TokenBucket {
		a[2] = strconv.FormatFloat(p.Rate, 'g', 17, 64)
	}
	s.checkArgsMu.Lock()
	defer s.checkArgsMu.Unlock()
	m := map[Params]*[3]any{}
	if old := s.checkArgs.Load(); old != nil {
		if len(*old) >= maxCheckArgs {
			return a
		}
		m = maps.Clone(*old)
	}
	m[p] = a
	s.checkArgs.Store(&m)
	return a
}

// plainSettle is whether settles.lua settles a reservation: of one limit,
// not global, a token bucket or a fixed window, unchanged since.
func plainSettle(ops []SettleOp) bool {
	if len(ops) != 1 || ops[0].Global || ops[0].Stale {
		return false
	}
	a := ops[0].Params.Algorithm
	return a == TokenBucket || a == FixedWindow
}

// maxCheckArgs bounds the limits whose arguments a store keeps encoded.
const maxCheckArgs = 4096

// appendArgsHead appends the script's first arguments: the time (tests),
// the minimum TTL (tests), the mode, the amount given back and when it
// was taken, the region, and the time past which a check does nothing
// (set as the call is sent: notAfterArg).
func (s *RedisStore) appendArgsHead(args []any, mode string, n, at int64) []any {
	return append(s.appendTestArgs(args), mode, n, at, s.opts.Region, "")
}

// notAfterArg is the index of limits.lua's ARGV[7], the time past which a
// check does nothing, among a call's arguments.
const notAfterArg = 6

// notAfter is the time, in Redis's clock (µs), past which a check's script
// should do nothing rather than count: a script that runs that late (a
// server stalled with the call in its buffer, SIGSTOP or a long command)
// answers after the caller has given up and decided by a fallback, which
// counts in the replica's memory what it admits of a global limit: the
// store counting the request too would count it twice. It leaves the
// answer a tenth of the timeout (at most half the time the call has left)
// to come back. "" while the store's clock is not known yet, or in tests
// that set the script's time.
func (s *RedisStore) notAfter(deadline, now time.Time) any {
	if s.testNow != nil || !s.clockKnown.Load() {
		return ""
	}
	margin := min(s.opts.Timeout/10, deadline.Sub(now)/2)
	return deadline.Add(-margin).UnixMicro() + s.clockOffset.Load()
}

// observeClock takes in a script's time: it ran after the call was sent
// and before its reply was received, which bounds the offset of Redis's
// clock to this process's. The first reply sets the offset halfway; later
// ones move it only as far as they must to agree (a clock that jumps, a
// failover to a server whose clock differs).
func (s *RedisStore) observeClock(redisNow int64, sent, received time.Time) {
	if s.testNow != nil || redisNow <= 0 {
		return
	}
	lo, hi := redisNow-received.UnixMicro(), redisNow-sent.UnixMicro()
	if !s.clockKnown.Load() {
		s.clockOffset.Store(lo + (hi-lo)/2)
		s.clockKnown.Store(true)
		return
	}
	for {
		cur := s.clockOffset.Load()
		next := min(max(cur, lo), hi)
		if next == cur || s.clockOffset.CompareAndSwap(cur, next) {
			return
		}
	}
}

// appendTestArgs appends a script's first arguments: the time and the
// minimum TTL, both empty but in tests.
func (s *RedisStore) appendTestArgs(args []any) []any {
	now, minTTL := "", ""
	if s.testNow != nil {
		now = strconv.FormatInt(s.testNow(), 10)
	}
	if s.testMinTTL > 0 {
		minTTL = strconv.FormatInt(s.testMinTTL, 10)
	}
	return append(args, now, minTTL)
}

// refundArgs are the script's keys and arguments to give n back to a
// limit, taken at the store's time at.
func (s *RedisStore) refundArgs(l redisLimit, n, at int64) ([]string, []any) {
	return l.appendArgs(nil, s.appendArgsHead(nil, "refund", n, at))
}

func (l *redisLimit) appendArgs(keys []string, args []any) ([]string, []any) {
	keys = append(keys, l.key)
	if l.params.Algorithm.logged() && !l.global { // a global limit's windows are hashes of their own
		keys = append(keys, logKey(l.key, l.params.Algorithm))
	}
	flags := 0 // lua/limits.lua's: 1 shadow, 2 debt
	if l.shadow {
		flags |= 1
	}
	if l.debt {
		flags |= 2
	}
	if l.mark != "" {
		keys = append(keys, l.mark)
	}
	if l.global {
		return keys, append(args, globalAlgorithm+int(l.params.Algorithm), l.params.Limit,
			l.allowance, l.params.Window, l.cost, flags, l.ceiling, l.known[0], l.known[1], l.known[2])
	}
	return keys, append(args, int(l.params.Algorithm), l.params.Limit,
		strconv.FormatFloat(l.params.Rate, 'g', 17, 64), l.params.Window, l.cost, flags, l.batch)
}

// do runs a call and waits for it, until ctx ends or the deadline passes;
// a zero deadline means the store's own timeout. A call given up on is
// the worker's to finish and is not reused.
func (s *RedisStore) do(ctx context.Context, c *redisCall, results []Result, deadline time.Time) (int64, error) {
	return s.doSettle(ctx, c, results, nil, deadline)
}

// doSettle is do, with a settlement's answer copied to settled.
func (s *RedisStore) doSettle(ctx context.Context, c *redisCall, results []Result, settled []Settlement, deadline time.Time) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err // not queued: nothing counted for a caller gone
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(s.opts.Timeout)
	}
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c.deadline = deadline
	if c.timer == nil {
		c.timer = time.NewTimer(time.Until(deadline))
	} else {
		c.timer.Reset(time.Until(deadline))
	}
	// A call given up on is not pooled again, and its timer, unstopped,
	// goes with it (Go 1.23 collects timers no longer referenced).
	timer := c.timer
	select {
	case s.queue <- c: // the queue has room, as it mostly has
	default:
		select {
		case s.queue <- c:
		case <-s.stop:
			return 0, ErrStoreClosed
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-timer.C:
			return 0, fmt.Errorf("regional: redis: %w (no pipeline free)", context.DeadlineExceeded)
		}
	}
	var err error
	select {
	case <-c.done:
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = fmt.Errorf("regional: redis: %w", context.DeadlineExceeded)
	case <-s.stop:
		err = ErrStoreClosed
	}
	if err != nil {
		if c.state.CompareAndSwap(callPending, callAbandoned) {
			return 0, err
		}
		<-c.done // the worker delivered first: its answer stands
	}
	now, err := c.now, c.err
	copy(results, c.results)
	copy(settled, c.settled)
	timer.Stop() // before the call is pooled: its next user resets it
	s.calls.Put(c)
	return now, err
}

// A call's states (redisCall.state).
const (
	callPending int32 = iota
	callDelivered
	callAbandoned
)

// lateReplyWait is how long past its callers' deadlines a pipeline still
// waits for its replies (go-redis's read timeout, 3s, bounds it too): a
// script that ran in time but whose reply comes late (a server stalled
// just after it, a link slowed) counted what its caller, gone, decided
// without the store; its reply says what to give back.
const lateReplyWait = 2 * time.Second

// Apply implements Store. The call is bounded by the store's timeout, or
// ctx's deadline if sooner.
func (s *RedisStore) Apply(ctx context.Context, ops []Op, results []Result) (int64, error) {
	return s.applyUntil(ctx, ops, results, time.Time{})
}

func (s *RedisStore) applyUntil(ctx context.Context, ops []Op, results []Result, deadline time.Time) (int64, error) {
	return s.do(ctx, s.newCall(ops, "check", 0, -1), results, deadline)
}

// Inspect implements Store.
func (s *RedisStore) Inspect(ctx context.Context, key []byte, p Params) (Result, error) {
	var r [1]Result
	_, err := s.do(ctx, s.newCall([]Op{{Key: key, Params: p}}, "inspect", 0, -1), r[:], time.Time{})
	return r[0], err
}

// Grant implements Store.
func (s *RedisStore) Grant(ctx context.Context, key []byte, p Params, n int64) (Result, error) {
	var r [1]Result
	_, err := s.do(ctx, s.newCall([]Op{{Key: key, Params: p}}, "grant", n, -1), r[:], time.Time{})
	return r[0], err
}

// Refund implements Store.
func (s *RedisStore) Refund(ctx context.Context, key []byte, p Params, n, at int64) (int64, error) {
	keys, args := s.refundArgs(redisLimit{key: string(key), params: p}, n, at)
	vals, err := limitsScript.Run(ctx, s.client, keys, args...).Int64Slice() // EVALSHA, or EVAL if the script is gone
	if err != nil {
		return 0, fmt.Errorf("regional: redis: refund: %w", err)
	}
	if len(vals) != 2 {
		return 0, fmt.Errorf("regional: redis: unexpected refund reply %v", vals)
	}
	return vals[1], nil
}

// Settle implements Store: one script run in the pipeline, or one per
// slot in a Cluster, bounded by the store's timeout.
func (s *RedisStore) Settle(ctx context.Context, ops []SettleOp, mark string, until, actual int64, out []Settlement) (int64, error) {
	return s.doSettle(ctx, s.settleCall(ops, mark, until, actual), make([]Result, len(ops)), out, time.Time{})
}

// settleCall is the call that settles a reservation's ops: its part of
// the pipeline's settles.lua (plainSettle), or limits.lua's 'settle'.
func (s *RedisStore) settleCall(ops []SettleOp, mark string, until, actual int64) *redisCall {
	// The estimate in the cost's place, when it was taken in the batch's,
	// a stale limit flagged as shadow (lua/limits.lua), the mark in the
	// head, and the hash that keeps the settlement after the counter's key.
	converted := make([]Op, len(ops))
	for i, op := range ops {
		converted[i] = Op{Key: op.Key, Params: op.Params, Cost: op.Estimate, Batch: op.At, Shadow: op.Stale}
		if op.Global { // when taken, in the known window's place (limits.lua)
			converted[i] = Op{Key: op.Key, Params: op.Params, Cost: op.Estimate, Shadow: op.Stale, Global: true,
				Allowance: op.Allowance, Ceiling: op.Ceiling, KnownStart: op.At}
		}
	}
	c := s.newCall(converted, "settle", actual, until)
	c.settled = slices.Grow(c.settled[:0], len(ops))[:len(ops)]
	if plainSettle(ops) {
		// settles.lua's part: the limit's key and its settlements', and
		// 9 arguments (lua/settles.lua).
		g, l := &c.groups[0], &c.limits[0]
		l.settle, l.mark = true, settledKey(l.key, until)
		g.plain, g.settles, g.key, g.mark = true, true, &l.key, &l.mark
		g.args = append(append(g.args[:0], s.checkArgsOf(l.params)[:]...), l.cost, ops[0].At, actual, until, mark, settledCap(l.params))
		return c
	}
	for gi := range c.groups {
		g := &c.groups[gi]
		g.keys, g.args = g.keys[:0], s.appendArgsHead(g.args[:0], "settle", actual, until)
		g.args[notAfterArg] = mark
		for _, i := range g.limits {
			l := &c.limits[i]
			if l.settle = true; l.params.Algorithm != Concurrency { // a slot is freed once without one
				l.mark = settledKey(l.key, until)
			}
			g.keys, g.args = l.appendArgs(g.keys, g.args)
		}
	}
	return c
}

// reservationKey implements keyStore: the key in the region's Redis,
// fresh if it holds none yet (the first replica to ask sets it).
func (s *RedisStore) reservationKey(ctx context.Context, fresh []byte) ([]byte, error) {
	old, err := s.client.SetArgs(ctx, reservationKeyName, fresh, redis.SetArgs{Mode: "NX", Get: true}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return fresh, nil
	case err != nil:
		return nil, fmt.Errorf("regional: redis: reservation key: %w", err)
	case len(old) < 16:
		return nil, fmt.Errorf("regional: redis: reservation key %s holds %d bytes, not a key", reservationKeyName, len(old))
	}
	return []byte(old), nil
}

// reservationKeyName is where a region's Redis keeps the key that seals
// its reservations (reserve.go).
const reservationKeyName = "gq:reservation-key"

// Reset implements Store.
func (s *RedisStore) Reset(ctx context.Context, key []byte, p Params) error {
	keys := []string{string(key)}
	if p.Algorithm.logged() {
		keys = append(keys, logKey(string(key), p.Algorithm))
	}
	return s.client.Del(ctx, keys...).Err()
}

// logKey is where a logged algorithm keeps its entries: a sliding window
// log's, and concurrency's slots apart (a rule changed from one to the
// other starts afresh, as its state does).
func logKey(key string, a Algorithm) string {
	if a == Concurrency {
		return key + ":slots"
	}
	return key + ":log"
}

// admitKey counts a rule's keys across the region's replicas (see
// regionKeys and lua/keys.lua): a set of the keys' hashes per generation,
// so Redis holds at most about twice maxKeys hashes of a rule in each of
// two sets (72 bytes each in Redis 7.0). The hash (the first 8 bytes of
// SHA-256) is the same in every replica, and costly to aim two keys at.
func (s *RedisStore) admitKey(ctx context.Context, rule string, key []byte, maxKeys int, gen, genUs int64, deadline time.Time) (bool, error) {
	sum := sha256.Sum256(key)
	member := strconv.FormatInt(int64(binary.BigEndian.Uint64(sum[:8])), 10)
	name := func(g int64) string { return "gq:keys:{" + rule + "}:" + strconv.FormatInt(g, 10) }
	ttl := 2 * genUs / 1000
	if s.testMinTTL > ttl {
		ttl = s.testMinTTL
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	n, err := keysScript.Run(ctx, s.client, []string{name(gen), name(gen - 1)}, member, maxKeys, ttl).Int64()
	if err != nil {
		return false, fmt.Errorf("regional: redis key count of rule %q: %w", rule, err)
	}
	return n == 1, nil
}

// checksCall is one checks.lua (or settles.lua) call of a pipeline: the
// plain checks (settlements) of one key in a Cluster, of all keys on a
// single server.
type checksCall struct {
	settles bool
	groups  []*redisGroup
	args    []any
	cmd     *redis.IntSliceCmd
}

func (s *RedisStore) worker() {
	defer s.wg.Done()
	batch := make([]*redisCall, 0, s.opts.MaxBatch)
	var checks []checksCall // reused from pipeline to pipeline
	for {
		select {
		case c := <-s.queue:
			batch = append(batch[:0], c)
		case <-s.stop:
			return
		}
	drain:
		for len(batch) < s.opts.MaxBatch {
			select {
			case c := <-s.queue:
				batch = append(batch, c)
			default:
				break drain
			}
		}
		s.run(batch, &checks)
	}
}

// run sends a batch of calls in one pipeline and hands out the results.
// Calls whose deadline has passed while they queued fail at once; the
// pipeline is bounded by the soonest deadline of the rest.
func (s *RedisStore) run(batch []*redisCall, checks *[]checksCall) {
	now := time.Now()
	live, deadline := batch[:0], now.Add(s.opts.Timeout)
	for _, c := range batch {
		if !c.deadline.After(now) {
			c.err = fmt.Errorf("regional: redis: %w (queued past the deadline)", context.DeadlineExceeded)
			c.done <- struct{}{}
			continue
		}
		if c.deadline.Before(deadline) {
			deadline = c.deadline
		}
		live = append(live, c)
	}
	if batch = live; len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(lateReplyWait))
	defer cancel()
	start := time.Now()
	// Each script's error is read from its command below.
	if s.exec(ctx, batch, checks, false) {
		// The server lost its scripts (a restart, SCRIPT FLUSH): load and
		// run again what failed for that reason.
		if s.loadScripts(ctx) == nil {
			s.exec(ctx, batch, checks, true)
		}
	}
	var refunds []refund
	for _, c := range batch {
		c.err = nil
		ok := make([]bool, len(c.groups))
		for gi := range c.groups {
			err := c.groups[gi].err
			if err != nil {
				err = fmt.Errorf("regional: redis: %w", err)
			} else {
				err = c.read(&c.groups[gi])
			}
			if err != nil && c.err == nil {
				c.err = err
			}
			ok[gi] = err == nil
		}
		switch {
		case len(c.settled) > 0:
			// A settlement is kept whatever its caller does: sent again,
			// it is answered alike. Nothing to give back.
			c.state.CompareAndSwap(callPending, callDelivered)
		case c.state.CompareAndSwap(callPending, callDelivered):
			if len(c.groups) > 1 {
				refunds = c.refunds(refunds, ok, false)
			}
		case c.err == nil && commitsResults(c):
			refunds = c.takenBack(refunds, true) // its caller decided without it
		case len(c.groups) > 1:
			refunds = c.refunds(refunds, ok, true)
		case c.err == nil:
			refunds = c.takenBack(refunds, false) // a global limit's debt, which its caller counted
		}
	}
	if len(refunds) > 0 {
		// Patient: a store that answered late may be slow still.
		s.refund(refunds, max(s.opts.Timeout, time.Until(deadline.Add(lateReplyWait))))
	}
	if s.opts.Observe != nil { // before the callers have their calls back
		s.opts.Observe(time.Since(start), len(batch), batchError(batch))
	}
	for _, c := range batch {
		c.done <- struct{}{}
	}
}

// batchError is the first error of a batch's calls, for observers.
func batchError(batch []*redisCall) error {
	for _, c := range batch {
		if c.err != nil {
			return c.err
		}
	}
	return nil
}

// exec runs the batch's scripts in one pipeline, and gives each group its
// reply: all of them, or again those whose script Redis did not have. It
// says whether a script was missing. The plain checks of a single server
// share one checks.lua call; in a Cluster, those of one key (a call of
// several keys would meet TRYAGAIN while their slot migrates).
func (s *RedisStore) exec(ctx context.Context, batch []*redisCall, checks *[]checksCall, again bool) (noScript bool) {
	pipe := s.client.Pipeline()
	sent := time.Now()
	cs := (*checks)[:0]
	for _, c := range batch {
		for gi := range c.groups {
			g := &c.groups[gi]
			if again && (g.err == nil || !isNoScript(g.err)) {
				continue
			}
			g.err = nil
			if !g.plain {
				if c.check {
					g.args[notAfterArg] = s.notAfter(c.deadline, sent)
				}
				g.cmd = pipe.EvalSha(ctx, limitsSHA, g.keys, g.args...)
				continue
			}
			i := 0
			for i < len(cs) && (cs[i].settles != g.settles || s.cluster && *cs[i].groups[0].key != *g.key) {
				i++
			}
			if i == len(cs) {
				cs = slices.Grow(cs, 1)[:i+1]
				cs[i].groups, cs[i].settles = cs[i].groups[:0], g.settles
			}
			cs[i].groups = append(cs[i].groups, g)
		}
	}
	for i := range cs {
		cc := &cs[i]
		var args []any
		if cc.settles {
			args = append(cc.args[:0], "evalsha", settlesSHAArg, 2*len(cc.groups))
			for _, g := range cc.groups {
				args = append(args, g.key, g.mark)
			}
		} else {
			args = append(cc.args[:0], "evalsha", checksSHAArg, len(cc.groups))
			for _, g := range cc.groups {
				args = append(args, g.key)
			}
		}
		args = s.appendTestArgs(args)
		for _, g := range cc.groups {
			args = append(args, g.args...)
		}
		cc.args, cc.cmd = args, redis.NewIntSliceCmd(ctx, args...)
		pipe.Process(ctx, cc.cmd)
	}
	pipe.Exec(ctx) // each command's error is its own, read below
	received, clocked := time.Now(), false
	for _, c := range batch {
		for gi := range c.groups {
			if g := &c.groups[gi]; !g.plain && g.cmd != nil {
				g.now, g.vals, g.err = 0, nil, g.cmd.Err()
				if g.err == nil {
					var vals []int64
					if vals, g.err = g.cmd.Int64Slice(); len(vals) > 0 {
						g.now, g.vals = vals[0], vals[1:]
					}
				} else if t, ok := lateAt(g.err); ok {
					s.observeClock(t, sent, received) // its clock may have moved
					clocked = true
				}
				if !clocked && g.now > 0 {
					s.observeClock(g.now, sent, received)
					clocked = true
				}
				g.cmd = nil
			}
			if g := &c.groups[gi]; g.err != nil && isNoScript(g.err) {
				noScript = true
			}
		}
	}
	for i := range cs {
		cc := &cs[i]
		vals, cerr := cc.cmd.Result()
		n := 5 // numbers a check, 7 a settlement
		if cc.settles {
			n = 7
		}
		if cerr == nil && len(vals) != 1+n*len(cc.groups) {
			cerr = fmt.Errorf("unexpected plain script reply of %d numbers for %d calls", len(vals), len(cc.groups))
		}
		noScript = noScript || cerr != nil && isNoScript(cerr)
		for k, g := range cc.groups {
			g.now, g.vals, g.err = 0, nil, cerr
			if cerr == nil {
				g.now, g.vals = vals[0], vals[1+n*k:1+n*(k+1)]
			}
		}
		clear(cc.args) // nothing of the batch's calls kept past it
		clear(cc.groups)
		cc.cmd = nil
	}
	*checks = cs
	return noScript
}

func isNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// lateAt reads the script's time from a LATE error: a check run past its
// time (notAfter), that did nothing.
func lateAt(err error) (int64, bool) {
	if !redis.HasErrorPrefix(err, "LATE") {
		return 0, false
	}
	f := strings.Fields(err.Error())
	if len(f) < 2 {
		return 0, false
	}
	t, perr := strconv.ParseInt(f[len(f)-1], 10, 64)
	return t, perr == nil
}

// loadScripts loads the scripts on every primary.
func (s *RedisStore) loadScripts(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, src := range scripts {
			if err := c.ScriptLoad(ctx, src).Err(); err != nil {
				return err
			}
		}
		return nil
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, s.client)
}

// read takes one group's reply: per limit allowed, remaining, reset_at,
// retry_after, taken, and for a global limit its P and N.
func (c *redisCall) read(g *redisGroup) error {
	want := 0
	for _, i := range g.limits {
		want += c.limits[i].replyLen()
	}
	if len(g.vals) != want {
		return fmt.Errorf("regional: redis: unexpected script reply %v", g.vals)
	}
	c.now = g.now
	v := g.vals
	for _, i := range g.limits {
		c.limits[i].at = g.now
		c.results[i] = Result{Allowed: v[0] == 1, Remaining: v[1], ResetAt: v[2], RetryAfter: v[3], Taken: v[4]}
		switch {
		case c.limits[i].global && c.limits[i].settle:
			c.results[i].OwnP, c.results[i].OwnN = uint64(v[5]), uint64(v[6])
			c.settled[i] = Settlement{Again: v[7] == 1, Ended: v[7] == 2, Full: v[7] == 3, Charged: v[8], Result: c.results[i]}
		case c.limits[i].global && c.limits[i].params.Algorithm == Concurrency:
			c.results[i].OwnP, c.results[i].OwnN = uint64(v[5]), uint64(v[6])
			c.results[i].PrevP, c.results[i].PrevN = uint64(v[7]), uint64(v[8])
		case c.limits[i].global:
			c.results[i].OwnP, c.results[i].OwnN = uint64(v[5]), uint64(v[6])
		case c.limits[i].settle:
			c.settled[i] = Settlement{Again: v[5] == 1, Ended: v[5] == 2, Full: v[5] == 3, Charged: v[6], Result: c.results[i]}
		}
		v = v[c.limits[i].replyLen():]
	}
	return nil
}

// globalAlgorithm is added to a global limit's algorithm in the script's
// arguments.
const globalAlgorithm = 10

// replyLen is how many numbers the script answers for the limit.
func (l *redisLimit) replyLen() int {
	switch {
	case l.global && l.settle:
		return 9
	case l.global && l.params.Algorithm == Concurrency:
		return 9 // and the window before's P and N
	case l.global || l.settle:
		return 7
	}
	return 5
}

// refund is what to give back to a limit: n, taken at the store's time at.
type refund struct {
	limit redisLimit
	n, at int64
}

// refunds lists what to give back when the limits of one request were split
// over slots and the request did not go ahead (a slot denied, or failed)
// while another slot took its cost. ok[g] says group g answered;
// abandoned, that the caller gave up on the call. A limit that counts
// debt keeps it, unless it is a global limit and its caller decided
// without the store (a slot failed, or the call was abandoned): the caller
// then counts it in memory (degraded.go).
func (c *redisCall) refunds(dst []refund, ok []bool, abandoned bool) []refund {
	denied := func(limits []int) bool {
		for _, i := range limits {
			if !c.limits[i].shadow && !c.results[i].Allowed {
				return true
			}
		}
		return false
	}
	failed, errored := false, false
	for gi := range c.groups {
		if !ok[gi] || denied(c.groups[gi].limits) {
			failed = true
		}
		errored = errored || !ok[gi]
	}
	if !failed {
		return dst
	}
	for gi := range c.groups {
		g := &c.groups[gi]
		if !ok[gi] {
			continue
		}
		for _, i := range g.limits {
			l, r := &c.limits[i], c.results[i]
			switch {
			case r.Taken <= 0:
			case l.debt && !(l.global && (errored || abandoned)):
			case l.debt || !denied(g.limits):
				dst = append(dst, refund{limit: *l, n: r.Taken, at: takenAt(l, &r)})
			}
		}
	}
	return dst
}

// commitsResults reports whether a call's script went ahead: every
// enforced limit allowed.
func commitsResults(c *redisCall) bool {
	for i := range c.limits {
		if !c.limits[i].shadow && !c.results[i].Allowed {
			return false
		}
	}
	return true
}

// takenBack appends the refunds of everything a call took that its caller,
// having given up on it, counts itself: what the limits that allowed took
// if the script went ahead (committed), and what global limits took as
// debt (their caller counts it in memory, degraded.go). A regional limit
// keeps its debt: no fallback counts it again.
func (c *redisCall) takenBack(dst []refund, committed bool) []refund {
	for i := range c.limits {
		l, r := &c.limits[i], c.results[i]
		if r.Taken > 0 && (l.debt && l.global || !l.debt && committed) {
			dst = append(dst, refund{limit: *l, n: r.Taken, at: takenAt(l, &r)})
		}
	}
	return dst
}

// takenAt is when a limit took what a refund gives back: its group's time,
// or a slot's own (slotAt).
func takenAt(l *redisLimit, r *Result) int64 {
	if l.params.Algorithm == Concurrency {
		return slotAt(l.params, r)
	}
	return l.at
}

// refund gives back what split requests took, on a deadline of its own:
// the batch's may be spent. Best effort: a lost refund leaves a limit
// stricter, never looser.
func (s *RedisStore) refund(refunds []refund, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	for _, r := range refunds {
		keys, args := s.refundArgs(r.limit, r.n, r.at)
		pipe.EvalSha(ctx, limitsSHA, keys, args...)
	}
	pipe.Exec(ctx)
}

// MergeGlobal implements GlobalStore: one script per window, pipelined.
func (s *RedisStore) MergeGlobal(ctx context.Context, windows []GlobalWindow) (int, error) {
	if len(windows) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout*4)
	defer cancel()
	for attempt := 0; ; attempt++ {
		pipe := s.client.Pipeline()
		cmds := make([]*redis.Cmd, len(windows))
		for i, w := range windows {
			args := make([]any, 0, 1+4*len(w.Slots))
			args = append(args, max(1, w.TTL.Milliseconds()))
			for _, sl := range w.Slots {
				args = append(args, sl.Region, sl.P, "-"+sl.Region, sl.N)
			}
			cmds[i] = pipe.EvalSha(ctx, mergeScript.Hash(), []string{string(GlobalKey(w.Key, w.StartMillis))}, args...)
		}
		_, err := pipe.Exec(ctx)
		if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err = s.loadScripts(ctx); err != nil {
				return 0, fmt.Errorf("regional: redis: merge: %w", err)
			}
			continue // merging again is harmless: it is idempotent
		}
		raised := 0
		for _, c := range cmds {
			n, _ := c.Int()
			raised += n
		}
		if err != nil {
			return raised, fmt.Errorf("regional: redis: merge: %w", err)
		}
		return raised, nil
	}
}

// AddGlobal implements GlobalStore: one script per window, pipelined
// (lua/add.lua).
func (s *RedisStore) AddGlobal(ctx context.Context, adds []GlobalAdd, slots []crdt.Slot) error {
	if len(adds) == 0 {
		return nil
	}
	for attempt := 0; ; attempt++ {
		pipe := s.client.Pipeline()
		cmds := make([]*redis.Cmd, len(adds))
		for i, a := range adds {
			k := string(GlobalKey(a.Key, a.StartMillis))
			cmds[i] = pipe.EvalSha(ctx, addScript.Hash(), []string{k, k + ":added"},
				max(1, a.TTL.Milliseconds()), s.opts.Region, a.Replica, a.Admitted, a.KnownP, a.KnownN)
		}
		_, err := pipe.Exec(ctx)
		if err != nil && attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err = s.loadScripts(ctx); err != nil {
				return fmt.Errorf("regional: redis: add: %w", err)
			}
			continue // adding again counts nothing twice
		}
		if err != nil {
			return fmt.Errorf("regional: redis: add: %w", err)
		}
		for i, c := range cmds {
			v, err := c.Int64Slice()
			if err != nil || len(v) != 2 || v[0] < 0 || v[1] < 0 {
				return fmt.Errorf("regional: redis: add: reply %v: %w", c.Val(), err)
			}
			slots[i] = crdt.Slot{Region: s.opts.Region, P: uint64(v[0]), N: uint64(v[1])}
		}
		return nil
	}
}

// Heartbeat implements GlobalStore (lua/replicas.lua): a hash per region.
func (s *RedisStore) Heartbeat(ctx context.Context, replica string, unwritten int64, keep time.Duration) ([]ReplicaState, int64, error) {
	v, err := replicasScript.Run(ctx, s.client, []string{"gq:replicas:{" + s.opts.Region + "}"}, replica, unwritten, keep.Microseconds()).Slice()
	if err != nil {
		return nil, 0, fmt.Errorf("regional: redis: replicas: %w", err)
	}
	if len(v)%3 != 1 {
		return nil, 0, fmt.Errorf("regional: redis: replicas: reply of %d values", len(v))
	}
	now, _ := v[0].(int64)
	states := make([]ReplicaState, 0, len(v)/3)
	for i := 1; i+2 < len(v); i += 3 {
		name, _ := v[i].(string)
		n, _ := v[i+1].(int64)
		at, _ := v[i+2].(int64)
		states = append(states, ReplicaState{Replica: name, Unwritten: n, At: at})
	}
	return states, now, nil
}

// ReadGlobal implements GlobalStore.
func (s *RedisStore) ReadGlobal(ctx context.Context, key []byte, startMillis int64) ([]crdt.Slot, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout*4)
	defer cancel()
	raw, err := s.client.HGetAll(ctx, string(GlobalKey(key, startMillis))).Result()
	if err != nil {
		return nil, fmt.Errorf("regional: redis: %w", err)
	}
	fields := make(map[string]uint64, len(raw))
	for f, v := range raw {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("regional: redis: global field %s=%q: %w", f, v, err)
		}
		fields[f] = n
	}
	return slotsOf(fields), nil
}

const blocksKey = "gq:blocks"

// SaveBlock implements BlockStore: a hash of pattern to expiry (Unix ms, 0
// for none).
func (s *RedisStore) SaveBlock(ctx context.Context, b Block) error {
	var until int64
	if !b.Until.IsZero() {
		until = b.Until.UnixMilli()
	}
	return s.client.HSet(ctx, blocksKey, b.Pattern, until).Err()
}

// DeleteBlock implements BlockStore.
func (s *RedisStore) DeleteBlock(ctx context.Context, pattern string) error {
	return s.client.HDel(ctx, blocksKey, pattern).Err()
}

// LoadBlocks implements BlockStore.
func (s *RedisStore) LoadBlocks(ctx context.Context) ([]Block, error) {
	m, err := s.client.HGetAll(ctx, blocksKey).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Block, 0, len(m))
	for pattern, v := range m {
		b := Block{Pattern: pattern}
		if ms, _ := strconv.ParseInt(v, 10, 64); ms > 0 {
			b.Until = time.UnixMilli(ms)
		}
		out = append(out, b)
	}
	return out, nil
}
