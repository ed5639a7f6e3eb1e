package regional

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// newTestRedisStore starts a redis-server for the test and returns a store
// on it.
func newTestRedisStore(t testing.TB, opts RedisOptions) (*RedisStore, *harness.Redis) {
	t.Helper()
	srv := harness.NewRedis(t, harness.RedisOptions{})
	return openTestRedisStore(t, srv.URL(), opts), srv
}

// openTestRedisStore opens a store on a --redis spec, closed when the test
// ends.
func openTestRedisStore(t testing.TB, spec string, opts RedisOptions) *RedisStore {
	t.Helper()
	s, err := NewRedisStore(t.Context(), spec, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// virtualClock is a clock tests move by hand, shared by both stores.
type virtualClock struct{ us atomic.Int64 }

func newVirtualClock() *virtualClock {
	c := &virtualClock{}
	c.us.Store(t0)
	return c
}

func (c *virtualClock) Now() time.Time            { return time.UnixMicro(c.us.Load()) }
func (c *virtualClock) micros() int64             { return c.us.Load() }
func (c *virtualClock) Advance(d int64)           { c.us.Add(d) }
func (c *virtualClock) AdvanceBy(d time.Duration) { c.us.Add(d.Microseconds()) }

// newVirtualRedisStore is a store on a redis-server of its own whose
// scripts run at a virtual clock's time, and whose keys outlive the test.
func newVirtualRedisStore(t testing.TB, opts RedisOptions) (*RedisStore, *virtualClock) {
	rs, _ := newTestRedisStore(t, opts)
	clock := newVirtualClock()
	rs.testNow, rs.testMinTTL = clock.micros, int64(time.Hour/time.Millisecond)
	return rs, clock
}

// againstMemory runs a property of a Redis store and an in-memory store at
// one virtual time: each case has a fresh in-memory store and its number,
// for keys of its own on the one redis-server.
func againstMemory(t *testing.T, prop func(t *rapid.T, rs *RedisStore, mem *MemoryStore, clock *virtualClock, run int)) {
	rs, clock := newVirtualRedisStore(t, RedisOptions{})
	run := 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		prop(t, rs, NewMemoryStore(clock.Now), clock, run)
	})
}

// TestStoresDecideAlike drives random requests, costs, grants and clock
// advances through the in-memory store and a real redis-server running
// the Lua, at the same virtual time, and requires the same decisions.
func TestStoresDecideAlike(t *testing.T) {
	ctx := t.Context()
	againstMemory(t, func(t *rapid.T, rs *RedisStore, mem *MemoryStore, clock *virtualClock, run int) {
		limits := rapid.SliceOfN(genParams(), 1, 3).Draw(t, "limits")
		shadow := rapid.SliceOfN(rapid.Bool(), len(limits), len(limits)).Draw(t, "shadow")
		// Some limits count every hit, past the limit as debt
		// (count_over_limit), where the algorithm takes debt.
		debt := rapid.SliceOfN(rapid.Bool(), len(limits), len(limits)).Draw(t, "debt")
		for i, p := range limits {
			debt[i] = debt[i] && !p.Algorithm.logged()
		}
		for range rapid.IntRange(1, 40).Draw(t, "steps") {
			clock.Advance(rapid.SampledFrom([]int64{0, 1, 7, 999, 1000, 33_333, 1e6, 61e6}).Draw(t, "advance"))
			// A request touches some of the limits.
			var ops []Op
			for i, p := range limits {
				if rapid.IntRange(0, 3).Draw(t, "use") > 0 {
					op := Op{
						Key:    []byte(fmt.Sprintf("gq:{diff%d:%d}", run, i)),
						Params: p, Cost: genCost(t, p), Shadow: shadow[i], Debt: debt[i],
					}
					switch rapid.IntRange(0, 5).Draw(t, "cost kind") {
					case 0: // a check that counts nothing
						op.Cost = 0
					case 1: // usage reported past the limit
						if debt[i] {
							op.Cost = p.Limit + rapid.Int64Range(1, 3*p.Limit).Draw(t, "report")
						}
					case 2: // far past it: the debt kept is capped (debtCap)
						if debt[i] {
							op.Cost = rapid.SampledFrom([]int64{1 << 40, 1<<40 + 7, 1 << 53, 1 << 62}).Draw(t, "huge report")
						}
					}
					if !debt[i] && op.Cost > 0 && !p.Algorithm.logged() && rapid.IntRange(0, 3).Draw(t, "leased") == 0 {
						op.Batch = rapid.Int64Range(1, p.Limit).Draw(t, "lease")
					}
					ops = append(ops, op)
				}
			}
			if len(ops) == 0 {
				continue
			}
			switch rapid.IntRange(0, 9).Draw(t, "give back") {
			case 0:
				n := rapid.Int64Range(1, 5).Draw(t, "n")
				gm, err1 := mem.Grant(ctx, ops[0].Key, ops[0].Params, n)
				gr, err2 := rs.Grant(ctx, ops[0].Key, ops[0].Params, n)
				if err1 != nil || err2 != nil || gm != gr {
					t.Fatalf("grant %d on %v: memory %+v (%v), redis %+v (%v)", n, ops[0].Params, gm, err1, gr, err2)
				}
				continue
			case 1:
				// A refund of what was taken at some recent time, in this
				// window or an earlier one.
				n := rapid.Int64Range(1, 5).Draw(t, "n")
				at := clock.micros() - rapid.SampledFrom([]int64{0, 1, 999, 61e6}).Draw(t, "taken ago")
				gm, err1 := mem.Refund(ctx, ops[0].Key, ops[0].Params, n, at)
				gr, err2 := rs.Refund(ctx, ops[0].Key, ops[0].Params, n, at)
				if err1 != nil || err2 != nil || gm != gr {
					t.Fatalf("refund %d taken at now-%d on %v: memory %d (%v), redis %d (%v)", n, clock.micros()-at, ops[0].Params, gm, err1, gr, err2)
				}
				continue
			}
			mres, rres := make([]Result, len(ops)), make([]Result, len(ops))
			mnow, err := mem.Apply(ctx, ops, mres)
			if err != nil {
				t.Fatal(err)
			}
			rnow, err := rs.Apply(ctx, ops, rres)
			if err != nil {
				t.Fatal(err)
			}
			if mnow != rnow {
				t.Fatalf("now: memory %d, redis %d", mnow, rnow)
			}
			for i := range ops {
				if mres[i] != rres[i] {
					t.Fatalf("limit %d (%v, cost %d, shadow %v, debt %v): memory %+v, redis %+v", i, ops[i].Params, ops[i].Cost, ops[i].Shadow, ops[i].Debt, mres[i], rres[i])
				}
			}
			for i := range ops {
				mi, _ := mem.Inspect(ctx, ops[i].Key, ops[i].Params)
				ri, err := rs.Inspect(ctx, ops[i].Key, ops[i].Params)
				if err != nil || mi != ri {
					t.Fatalf("inspect limit %d (%v): memory %+v, redis %+v (%v)", i, ops[i].Params, mi, ri, err)
				}
			}
		}
	})
}

// TestPlainChecksRun: a check of one token bucket or one fixed window
// runs checks.lua; one of another algorithm, or of several limits,
// limits.lua (TestStoresDecideAlike holds them to the same decisions).
// The plain checks of one pipeline share one checks.lua call.
func TestPlainChecksRun(t *testing.T) {
	rs, srv := newTestRedisStore(t, RedisOptions{})
	ctx := t.Context()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer admin.Close()
	admin.Ping(ctx)
	tb := Op{Key: []byte("gq:{a:1}"), Params: Params{Algorithm: TokenBucket, Limit: 100, Rate: 10}, Cost: 1}
	fw := Op{Key: []byte("gq:{c:1}"), Params: Params{Algorithm: FixedWindow, Limit: 100, Window: 60e6}, Cost: 1}
	log := Op{Key: []byte("gq:{b:1}"), Params: Params{Algorithm: SlidingWindowLog, Limit: 100, Window: 60e6}, Cost: 1}
	mon := startMonitor(t, srv.Addr())
	for _, ops := range [][]Op{{tb}, {fw}, {log}, {tb, fw}} {
		if _, err := rs.Apply(ctx, ops, make([]Result, len(ops))); err != nil {
			t.Fatal(err)
		}
	}
	// One pipeline of five calls: three plain, two not.
	batch := []*redisCall{
		rs.newCall([]Op{tb}, "check", 0, -1), rs.newCall([]Op{log}, "check", 0, -1), rs.newCall([]Op{fw}, "check", 0, -1),
		rs.newCall([]Op{tb, fw}, "check", 0, -1), rs.newCall([]Op{tb}, "check", 0, -1),
	}
	runBatch(t, rs, batch)
	run := mon.scripts(t, admin, "plain-marker")
	want := []string{checksSHA + " 1", checksSHA + " 1", limitsSHA + " 2", limitsSHA + " 2",
		limitsSHA + " 2", limitsSHA + " 2", checksSHA + " 3"} // a log has two keys
	if !slices.Equal(run, want) {
		t.Fatalf("scripts run (sha, keys) %q, want %q", run, want)
	}
}

// runBatch sends calls in one pipeline, as a worker does, and fails the
// test on an error of any.
func runBatch(t interface{ Fatalf(string, ...any) }, rs *RedisStore, batch []*redisCall) {
	for _, c := range batch {
		c.deadline = time.Now().Add(10 * time.Second)
	}
	var checks []checksCall
	rs.run(slices.Clone(batch), &checks)
	for i, c := range batch {
		<-c.done
		if c.err != nil {
			t.Fatalf("call %d: %v", i, c.err)
		}
	}
}

// TestPlainChecksShareAScript: plain checks run in one checks.lua call
// decide as the in-memory store deciding them one after another, the same
// key repeated among them.
func TestPlainChecksShareAScript(t *testing.T) {
	ctx := t.Context()
	againstMemory(t, func(t *rapid.T, rs *RedisStore, mem *MemoryStore, clock *virtualClock, run int) {
		var limits []Params
		for len(limits) < 3 {
			if p := genParams().Draw(t, "params"); p.Algorithm == TokenBucket || p.Algorithm == FixedWindow {
				limits = append(limits, p)
			}
		}
		for range rapid.IntRange(1, 5).Draw(t, "pipelines") {
			clock.Advance(rapid.SampledFrom([]int64{0, 1, 999, 33_333, 1e6, 61e6}).Draw(t, "advance"))
			var ops []Op
			var batch []*redisCall
			for range rapid.IntRange(1, 12).Draw(t, "checks") {
				i := rapid.IntRange(0, len(limits)-1).Draw(t, "limit")
				op := Op{Key: []byte(fmt.Sprintf("gq:{share%d:%d}", run, i)), Params: limits[i], Cost: genCost(t, limits[i])}
				if rapid.IntRange(0, 3).Draw(t, "leased") == 0 {
					op.Batch = rapid.Int64Range(1, op.Params.Limit).Draw(t, "lease")
				}
				ops = append(ops, op)
				batch = append(batch, rs.newCall([]Op{op}, "check", 0, -1))
			}
			runBatch(t, rs, batch)
			for k, op := range ops {
				var want [1]Result
				now, err := mem.Apply(ctx, []Op{op}, want[:])
				if err != nil {
					t.Fatal(err)
				}
				if got := batch[k].results[0]; got != want[0] || batch[k].now != now {
					t.Fatalf("check %d of %d (%v, cost %d, batch %d): memory %+v at %d, redis %+v at %d",
						k, len(ops), op.Params, op.Cost, op.Batch, want[0], now, got, batch[k].now)
				}
			}
		}
	})
}

// commandCalls reads a command's call count from INFO commandstats.
func commandCalls(t *testing.T, c *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// monitor watches every command a Redis server runs, through MONITOR on a
// connection of its own.
type monitor struct {
	conn net.Conn
	r    *bufio.Reader
}

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m := &monitor{conn: conn, r: bufio.NewReader(conn)}
	fmt.Fprint(conn, "MONITOR\r\n")
	if line, err := m.r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}
	return m
}

// scripts returns the scripts clients ran, as "sha keys", until admin
// echoes marker.
func (m *monitor) scripts(t *testing.T, admin *redis.Client, marker string) []string {
	t.Helper()
	admin.Echo(t.Context(), marker)
	var run []string
	for _, c := range m.until(t, marker) {
		if f := strings.Fields(c); len(f) > 5 && f[3] == `"evalsha"` {
			run = append(run, strings.Trim(f[4], `"`)+" "+strings.Trim(f[5], `"`))
		}
	}
	return run
}

// until returns the commands clients sent (not those scripts ran) until one
// whose line contains marker.
func (m *monitor) until(t *testing.T, marker string) []string {
	t.Helper()
	m.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var cmds []string
	for {
		line, err := m.r.ReadString('\n')
		if err != nil {
			t.Fatalf("monitor: %v", err)
		}
		if strings.Contains(line, marker) {
			return cmds
		}
		if !strings.Contains(line, " lua] ") {
			cmds = append(cmds, strings.TrimSpace(line))
		}
	}
}

func TestOneRoundTripPerCheck(t *testing.T) {
	rs, srv := newTestRedisStore(t, RedisOptions{})
	ctx := t.Context()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer admin.Close()
	admin.Ping(ctx) // connected before the monitor starts
	ops := []Op{
		{Key: []byte("gq:{a:1}"), Params: Params{Algorithm: TokenBucket, Limit: 100, Rate: 10}, Cost: 1},
		{Key: []byte("gq:{b:1}"), Params: Params{Algorithm: SlidingWindowLog, Limit: 100, Window: 60e6}, Cost: 1},
		{Key: []byte("gq:{c:1}"), Params: Params{Algorithm: FixedWindow, Limit: 100, Window: 60e6}, Cost: 1},
	}
	// Warm up: the connection exists and the script is loaded.
	if _, err := rs.Apply(ctx, ops, make([]Result, 3)); err != nil {
		t.Fatal(err)
	}
	mon := startMonitor(t, srv.Addr())
	admin.ConfigResetStat(ctx)
	const checks = 50
	for range checks {
		if _, err := rs.Apply(ctx, ops, make([]Result, 3)); err != nil {
			t.Fatal(err)
		}
	}
	if n := commandCalls(t, admin, "evalsha"); n != checks {
		t.Fatalf("%d EVALSHA for %d checks of 3 limits, want one each", n, checks)
	}
	admin.Echo(ctx, "round-trip-marker")
	cmds := mon.until(t, "round-trip-marker")
	var sent int
	for _, c := range cmds {
		if strings.Contains(c, `"evalsha"`) {
			sent++
		} else if !strings.Contains(c, `"config"`) && !strings.Contains(c, `"info"`) {
			t.Errorf("a client sent more than the script: %s", c)
		}
	}
	if sent != checks {
		t.Fatalf("clients sent %d EVALSHA for %d checks", sent, checks)
	}
}

// TestCheckArgsAreBounded: the arguments encoded once per limit are those
// of the first maxCheckArgs limits, and right for every limit.
func TestCheckArgsAreBounded(t *testing.T) {
	rs := &RedisStore{}
	for i := range int64(maxCheckArgs + 100) {
		p := Params{Algorithm: TokenBucket, Limit: i + 1, Rate: float64(i) / 3}
		if a := rs.checkArgsOf(p); a[0] != int(TokenBucket) || a[1] != p.Limit || a[2] != strconv.FormatFloat(p.Rate, 'g', 17, 64) {
			t.Fatalf("arguments of %v: %v", p, *a)
		}
		if a, b := rs.checkArgsOf(p), rs.checkArgsOf(p); (a == b) != (i < maxCheckArgs) {
			t.Fatalf("arguments of limit %d kept: %v, want %v", i, a == b, i < maxCheckArgs)
		}
	}
	if n := len(*rs.checkArgs.Load()); n != maxCheckArgs {
		t.Fatalf("%d limits' arguments kept, want %d", n, maxCheckArgs)
	}
	fw := Params{Algorithm: FixedWindow, Limit: 5, Window: 60e6}
	if a := rs.checkArgsOf(fw); a[0] != int(FixedWindow) || a[1] != int64(5) || a[2] != int64(60e6) {
		t.Fatalf("arguments of %v: %v", fw, *a)
	}
}

// TestPlainChecksSurviveForeignKeys: a counter key that holds something
// else (another type, a string that is no state, a state whose numbers
// are not finite, in either form) is no state to the check that meets
// it, and fails none of the checks sharing its call.
func TestPlainChecksSurviveForeignKeys(t *testing.T) {
	rs, srv := newTestRedisStore(t, RedisOptions{})
	ctx := t.Context()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	admin.RPush(ctx, "gq:{list:1}", "x")
	admin.Set(ctx, "gq:{junk:1}", "1 not numbers here", 0)
	admin.Set(ctx, "gq:{junk:2}", "1 -inf 0 0", 0)
	inf := make([]byte, 25) // the binary form, its tokens -Inf
	inf[0] = byte(TokenBucket)
	binary.LittleEndian.PutUint64(inf[1:], math.Float64bits(math.Inf(-1)))
	admin.Set(ctx, "gq:{junk:3}", inf, 0)
	p := Params{Algorithm: TokenBucket, Limit: 10, Rate: 1}
	var batch []*redisCall
	for _, key := range []string{"gq:{ok:1}", "gq:{list:1}", "gq:{junk:1}", "gq:{junk:2}", "gq:{junk:3}", "gq:{ok:2}"} {
		batch = append(batch, rs.newCall([]Op{{Key: []byte(key), Params: p, Cost: 1}}, "check", 0, -1))
	}
	runBatch(t, rs, batch)
	for i, c := range batch {
		if r := c.results[0]; !r.Allowed || r.Remaining != 9 {
			t.Errorf("check %d (%s): %+v, want allowed with 9 left, as a fresh bucket", i, c.limits[0].key, r)
		}
	}
}

// TestStateFormsAreRead: a counter's state is read in both its forms, the
// text the scripts write and the 25 bytes they will write once every
// replica reads them (lua/head.lua), by checks.lua and by limits.lua, and
// written back as text.
func TestStateFormsAreRead(t *testing.T) {
	rs, srv := newTestRedisStore(t, RedisOptions{})
	now := int64(1_764_166_000_123_456)
	rs.testNow = func() int64 { return now }
	ctx := t.Context()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	binaryState := func(alg Algorithm, a, b float64) string {
		v := make([]byte, 25)
		v[0] = byte(alg)
		binary.LittleEndian.PutUint64(v[1:], math.Float64bits(a))
		binary.LittleEndian.PutUint64(v[9:], math.Float64bits(b))
		return string(v)
	}
	// A bucket of 10 holding 5 tokens now; a fixed window of 10 that has
	// counted 7 in the window now is in.
	start := now / 60e6 * 60e6
	seeds := []struct {
		op    Op
		state string
		left  int64 // after one check
	}{
		{Op{Params: Params{Algorithm: TokenBucket, Limit: 10, Rate: 1}}, fmt.Sprintf("%d 5 %d 0", TokenBucket, now), 4},
		{Op{Params: Params{Algorithm: TokenBucket, Limit: 10, Rate: 1}}, binaryState(TokenBucket, 5, float64(now)), 4},
		{Op{Params: Params{Algorithm: FixedWindow, Limit: 10, Window: 60e6}}, fmt.Sprintf("%d %d 7 0", FixedWindow, start), 2},
		{Op{Params: Params{Algorithm: FixedWindow, Limit: 10, Window: 60e6}}, binaryState(FixedWindow, float64(start), 7), 2},
	}
	for i, seed := range seeds {
		for _, plain := range []bool{true, false} {
			op := seed.op
			op.Key, op.Cost = []byte(fmt.Sprintf("gq:{state:%d}", i)), 1
			admin.Set(ctx, string(op.Key), seed.state, 0)
			ops := []Op{op}
			if !plain { // two limits: limits.lua's
				ops = append(ops, Op{Key: []byte(fmt.Sprintf("gq:{other:%d}", i)), Params: op.Params, Cost: 1})
			}
			c := rs.newCall(ops, "check", 0, -1)
			if c.groups[0].plain != plain {
				t.Fatalf("seed %d: plain %v, want %v", i, c.groups[0].plain, plain)
			}
			runBatch(t, rs, []*redisCall{c})
			if r := c.results[0]; !r.Allowed || r.Remaining != seed.left {
				t.Fatalf("seed %d (%q), plain %v: %+v, want allowed with %d left", i, seed.state, plain, r, seed.left)
			}
			if v, err := admin.Get(ctx, string(op.Key)).Result(); err != nil || !strings.HasPrefix(v, fmt.Sprintf("%d ", op.Params.Algorithm)) {
				t.Fatalf("seed %d stored as %q (%v), want the text form", i, v, err)
			}
		}
	}
}

// TestScriptsLostAreLoadedAgain: after SCRIPT FLUSH, a pipeline of plain
// and other checks is run again once its scripts are loaded, and each
// check counts once.
func TestScriptsLostAreLoadedAgain(t *testing.T) {
	rs, srv := newTestRedisStore(t, RedisOptions{})
	ctx := t.Context()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	tb := Op{Key: []byte("gq:{a:1}"), Params: Params{Algorithm: TokenBucket, Limit: 100, Rate: 1e-6}, Cost: 1}
	fw := Op{Key: []byte("gq:{c:1}"), Params: Params{Algorithm: FixedWindow, Limit: 100, Window: 3600e6}, Cost: 1}
	log := Op{Key: []byte("gq:{b:1}"), Params: Params{Algorithm: SlidingWindowLog, Limit: 100, Window: 3600e6}, Cost: 1}
	for round := 1; round <= 2; round++ {
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		runBatch(t, rs, []*redisCall{rs.newCall([]Op{tb}, "check", 0, -1), rs.newCall([]Op{log}, "check", 0, -1),
			rs.newCall([]Op{fw}, "check", 0, -1), rs.newCall([]Op{tb, fw}, "check", 0, -1)})
		for _, op := range []Op{tb, fw, log} {
			r, err := rs.Inspect(ctx, op.Key, op.Params)
			want := int64(100 - round)
			if op.Key[4] != 'b' {
				want = int64(100 - 2*round) // in two of the checks
			}
			if err != nil || r.Remaining != want {
				t.Fatalf("round %d, %s: %+v (%v), want %d left", round, op.Key, r, err, want)
			}
		}
	}
}

// TestPlainChecksInACluster: in a Cluster the plain checks of one key share
// a checks.lua call, and those of different keys do not, even in one slot
// (a call of several keys would meet TRYAGAIN while its slot migrates).
func TestPlainChecksInACluster(t *testing.T) {
	cluster := harness.NewRedisCluster(t, harness.RedisClusterOptions{})
	rs := openTestRedisStore(t, cluster.Spec(), RedisOptions{})
	ctx := t.Context()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs()})
	defer admin.Close()
	p := Params{Algorithm: TokenBucket, Limit: 10, Rate: 1e-6}
	keys := []string{"gq:{same}a", "gq:{same}b", "gq:{same}a", "gq:{other}a", "gq:{same}a"}
	var batch []*redisCall
	for _, key := range keys {
		batch = append(batch, rs.newCall([]Op{{Key: []byte(key), Params: p, Cost: 1}}, "check", 0, -1))
	}
	runBatch(t, rs, batch) // loads the scripts on every primary, and connects
	if err := admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.ConfigResetStat(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	batch = batch[:0]
	for _, key := range keys {
		batch = append(batch, rs.newCall([]Op{{Key: []byte(key), Params: p, Cost: 1}}, "check", 0, -1))
	}
	runBatch(t, rs, batch)
	var calls atomic.Int64
	admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		calls.Add(commandCalls(t, c, "evalsha"))
		return nil
	})
	if n := calls.Load(); n != 3 {
		t.Errorf("%d script calls for the checks of 3 keys, want one a key", n)
	}
	for i, want := range []int64{6, 8, 5, 8, 4} { // the second round: a three times, b and other once
		if r := batch[i].results[0]; !r.Allowed || r.Remaining != want {
			t.Errorf("check %d (%s): %+v, want allowed with %d left", i, keys[i], r, want)
		}
	}
	// Releases of one counter each run settles.lua, a call a key: the
	// counter's settlements are kept beside it, in its slot.
	at := batch[0].now
	var settles []*redisCall
	for i, key := range []string{"gq:{same}a", "gq:{other}a", "gq:{same}b"} {
		settles = append(settles, rs.settleCall([]SettleOp{{Key: []byte(key), Params: p, Estimate: 1, At: at}}, fmt.Sprint("m", i), at+60e6, -1))
	}
	runBatch(t, rs, settles)
	for i, want := range []int64{5, 9, 9} {
		if st := settles[i].settled[0]; st.Again || st.Ended || st.Full || st.Result.Remaining != want {
			t.Errorf("release %d: %+v, want %d left", i, st, want)
		}
	}
}
