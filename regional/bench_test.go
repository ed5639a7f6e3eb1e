package regional

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("sk_prod_%06d", i)
	}
	return keys
}

// BenchmarkCheckMemory is a whole decision in memory: validation, rule
// matching, keys, the algorithms, the decision. Run with -cpu 1 for the
// per-core figure.
func BenchmarkCheckMemory(b *testing.B) {
	for _, tc := range []struct {
		name     string
		rules    string
		endpoint string
		limits   int
		keys     int
	}{
		{"1-limit", "rules:\n  - { id: tb, by: [api_key], capacity: 10000000, refill_per_second: 1 }\n", "/search", 1, 10_000},
		{"1-limit-hot", "rules:\n  - { id: tb, by: [api_key], capacity: 10000000, refill_per_second: 1 }\n", "/search", 1, 16},
		// The same without the default cap on the keys tracked
		// (DefaultMaxKeys): what the cap costs a check.
		{"1-limit-uncapped", "rules:\n  - { id: tb, by: [api_key], capacity: 10000000, refill_per_second: 1, max_keys: 0 }\n", "/search", 1, 10_000},
		// The example rules for /search (token bucket, tier fixed
		// window, tenant fixed window), with limits no benchmark reaches.
		{"3-limits", `
rules:
  - { id: search, match: { endpoint: /search }, by: [api_key], capacity: 10000000, refill_per_second: 1 }
  - { id: tier-minute, by: [api_key], algorithm: fixed_window, window: 1m, tiers: { pro: 1000000000 } }
  - { id: tenant, match: { api_key: "sk_*" }, by: [api_key], algorithm: fixed_window, limit: 1000000000, window: 1m }
tier_of:
  - { api_key: "sk_prod_*", tier: pro }
`, "/search", 3, 10_000},
		// A global limit, strict, among three regions: the region's slot
		// of the window, the replica's copy for the gossip, the demand.
		{"1-global", "rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: 1000000000, window: 1m }\n", "/search", 1, 10_000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := New(Config{Region: "eu", Global: GlobalConfig{Regions: []string{"ap", "eu", "us"}}}, mustParse(b, tc.rules))
			keys := benchKeys(tc.keys)
			reqs := make([]Request, len(keys))
			for i, k := range keys {
				reqs[i] = Request{APIKey: k, Endpoint: tc.endpoint, Method: "GET", IP: "203.0.113.7"}
			}
			ctx := context.Background()
			var d Decision
			for i := range reqs { // every counter exists: the steady state
				e.Check(ctx, &reqs[i], &d)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := e.Check(ctx, &reqs[i%len(reqs)], &d); err != nil || len(d.Limits) != tc.limits {
					b.Fatalf("%v, %d limits", err, len(d.Limits))
				}
				i++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
		})
	}
}

// BenchmarkRedis compares checks per second through the engine, with 50
// concurrent callers against a local redis-server (token bucket, 10,000
// keys), with what redis-benchmark reaches running the same script on the
// same keys over 50 connections pipelining 16 deep. The machine's speed
// drifts, so the two alternate for five rounds and the medians are
// reported. It ignores b.N: run it with -benchtime 1x.
func BenchmarkRedis(b *testing.B) {
	store, srv := newTestRedisStore(b, RedisOptions{})
	e := New(Config{Store: store, Timeout: time.Second}, mustParse(b,
		"rules:\n  - { id: bench, by: [api_key], capacity: 1000000000, refill_per_second: 1000000 }\n"))
	keys := benchKeys(10_000)
	var engine, ref, ratio, allocs []float64
	for range 5 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rate, err := engineLoad(e, keys, 50, 2*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		runtime.ReadMemStats(&after)
		allocs = append(allocs, float64(after.Mallocs-before.Mallocs)/(rate*2))
		r, err := redisBenchmark(srv.Port(), int(max(rate, 20_000)*2))
		if err != nil {
			b.Fatal(err)
		}
		engine, ref, ratio = append(engine, rate), append(ref, r), append(ratio, rate/r)
	}
	b.ReportMetric(median(engine), "checks/s")
	b.ReportMetric(median(ref), "redis-benchmark/s")
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(median(allocs), "allocs/check")
	b.Logf("rounds: engine %.0f, redis-benchmark %.0f, ratio %.2f, allocations per check %.1f", engine, ref, ratio, allocs)
}

// BenchmarkReport is usage reported past a count_over_limit rule's limit
// (every call counted as debt, through limits.lua) beside a plain check of
// a token bucket (checks.lua), on one redis-server, in interleaved
// rounds: calls a second and Redis's CPU a call, each, and their ratios.
func BenchmarkReport(b *testing.B) {
	store, _ := newTestRedisStore(b, RedisOptions{})
	e := New(Config{Store: store, Timeout: time.Second}, mustParse(b, `
rules:
  - { id: bench, match: { endpoint: /check }, by: [api_key], capacity: 1000000000, refill_per_second: 1000000 }
  - { id: tokens, match: { endpoint: /report }, by: [api_key], algorithm: fixed_window, limit: 1, window: 1h, count_over_limit: true }
`))
	keys := benchKeys(10_000)
	cpu := func() float64 { return redisCPU(b, store) }
	round := func(endpoint string, cost int64, want bool) (rate, usPerCall float64) {
		c0 := cpu()
		rate, err := load(e, keys, 50, 2*time.Second, func(key string) Request {
			return Request{APIKey: key, Endpoint: endpoint, Cost: cost}
		}, func(d *Decision) bool { return d.Allowed == want && !d.Degraded })
		if err != nil {
			b.Fatal(err)
		}
		return rate, (cpu() - c0) * 1e6 / (rate * 2)
	}
	var checks, reports, rateRatio, cpuRatio []float64
	for range 4 {
		cr, ccpu := round("/check", 1, true)
		rr, rcpu := round("/report", 730, false)
		checks, reports = append(checks, cr), append(reports, rr)
		rateRatio, cpuRatio = append(rateRatio, rr/cr), append(cpuRatio, rcpu/ccpu)
		b.Logf("round: checks %.0f/s, Redis %.1f µs each; reports past the limit %.0f/s, Redis %.1f µs each", cr, ccpu, rr, rcpu)
	}
	b.ReportMetric(median(checks), "checks/s")
	b.ReportMetric(median(reports), "reports/s")
	b.ReportMetric(median(rateRatio), "rate-ratio")
	b.ReportMetric(median(cpuRatio), "redis-cpu-ratio")
}

// redisCPU is the CPU time the store's Redis has used, in seconds (INFO cpu).
func redisCPU(b *testing.B, store *RedisStore) float64 {
	info, err := store.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return total
}

// scriptRuns is how many scripts a Redis server has run (EVALSHA), and
// the µs it spent inside them, from INFO commandstats.
func scriptRuns(b *testing.B, store *RedisStore) (runs, usec float64) {
	info, err := store.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "calls":
					runs, _ = strconv.ParseFloat(v, 64)
				case "usec":
					usec, _ = strconv.ParseFloat(v, 64)
				}
			}
		}
	}
	return runs, usec
}

// engineLoad runs callers goroutines checking for d, and returns checks/s.
func engineLoad(e *Engine, keys []string, callers int, d time.Duration) (float64, error) {
	return load(e, keys, callers, d, func(key string) Request { return Request{APIKey: key} },
		func(d *Decision) bool { return d.Allowed && !d.Degraded })
}

// load runs callers goroutines sending the requests of req for d, each
// decision as ok wants, and returns calls/s.
func load(e *Engine, keys []string, callers int, d time.Duration, req func(key string) Request, ok func(*Decision) bool) (float64, error) {
	var n, bad atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dec Decision
			for i := g; time.Now().Before(stop); i += callers {
				r := req(keys[i%len(keys)])
				if err := e.Check(context.Background(), &r, &dec); err != nil || !ok(&dec) {
					bad.Add(1)
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if bad.Load() > 0 {
		return 0, fmt.Errorf("%d of %d calls failed, or were decided not as wanted", bad.Load(), n.Load())
	}
	return float64(n.Load()) / d.Seconds(), nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// redisBenchmark runs redis-benchmark with the script the engine runs for
// one token-bucket check alone (lua/checks.lua), on the same server,
// and returns requests/s.
// It first runs the command once and checks that the script took a token,
// so that a change to the script's arguments cannot leave the reference
// measuring a script that does nothing.
func redisBenchmark(port, requests int) (float64, error) {
	argv := []string{"", "", "1", "1000000000", "1000000", "1", "0"}
	probe := append([]string{"-p", strconv.Itoa(port), "EVALSHA", checksSHA, "1", "gq:{bench:probe}"}, argv...)
	out, err := exec.Command("redis-cli", probe...).CombinedOutput()
	// The reply: now, then allowed, remaining, reset_at, retry_after, taken.
	if f := strings.Fields(string(out)); err != nil || len(f) != 6 || f[1] != "1" || f[5] != "1" {
		return 0, fmt.Errorf("the reference command does not take a token (%v): %q", err, out)
	}
	args := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(port), "-c", "50", "-n", strconv.Itoa(requests), "-P", "16", "-r", "10000", "-q",
		"EVALSHA", checksSHA, "1", "gq:{bench:sk_prod___rand_int__}"}, argv...)
	out, err = exec.Command("redis-benchmark", args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %v: %s", err, out)
	}
	// Output ends with: "EVALSHA …: 123456.79 requests per second, p50=… msec"
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(string(out), "\r", "\n")))
	var rps float64
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, " requests per second"); i > 0 {
			f := strings.Fields(line[:i])
			rps, err = strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	if rps == 0 {
		return 0, fmt.Errorf("redis-benchmark printed no rate (%v): %s", err, out)
	}
	return rps, nil
}

// BenchmarkDecide is one algorithm's decision alone.
func BenchmarkDecide(b *testing.B) {
	for _, p := range []Params{
		{Algorithm: TokenBucket, Limit: 1e9, Rate: 1e6},
		{Algorithm: GCRA, Limit: 1e9, Rate: 1e6},
		{Algorithm: FixedWindow, Limit: 1e9, Window: 60e6},
		{Algorithm: SlidingWindowCounter, Limit: 1e9, Window: 60e6},
	} {
		b.Run(p.Algorithm.String(), func(b *testing.B) {
			var s State
			now := int64(t0)
			for b.Loop() {
				now++
				_, s = Decide(p, s, now, 1)
			}
		})
	}
}

// BenchmarkReservations is reservations of a token bucket (limits.lua,
// holding each estimate under an id) and their commits, beside plain
// checks of the same bucket (checks.lua) and checks of a GCRA meter
// (limits.lua), on one redis-server, in interleaved rounds: calls a second
// and Redis's CPU a call, each, and their ratios to the plain checks'.
func BenchmarkReservations(b *testing.B) {
	store, _ := newTestRedisStore(b, RedisOptions{})
	e := New(Config{Store: store, Timeout: time.Second}, mustParse(b, `
rules:
  - { id: bench, match: { endpoint: /b }, by: [api_key], capacity: 1000000000, refill_per_second: 1000000 }
  - { id: gcra, match: { endpoint: /g }, by: [api_key], algorithm: gcra, burst: 1000000000, rate: 1000000 }
`))
	keys := benchKeys(10_000)
	cpu := func() float64 { return redisCPU(b, store) }
	// round runs call from 50 goroutines for 2 s, or until each has no
	// more to call (call returns false): calls a second, and Redis's CPU a
	// call in µs; it logs how many calls a script run took, and Redis's
	// µs a call inside scripts.
	round := func(call func(g, i int) (bool, error)) (rate, usPerCall float64) {
		c0 := cpu()
		r0, u0 := scriptRuns(b, store)
		defer func() {
			r1, u1 := scriptRuns(b, store)
			b.Logf("  %.1f calls a script run, %.1f µs a call in scripts", rate*2/(r1-r0), (u1-u0)/(rate*2))
		}()
		var n, bad atomic.Int64
		start := time.Now()
		stop := start.Add(2 * time.Second)
		var wg sync.WaitGroup
		for g := range 50 {
			wg.Go(func() {
				for i := 0; time.Now().Before(stop); i++ {
					more, err := call(g, i)
					if !more {
						return
					}
					if err != nil {
						bad.Add(1)
					}
					n.Add(1)
				}
			})
		}
		wg.Wait()
		if bad.Load() > 0 {
			b.Fatalf("%d of %d calls failed", bad.Load(), n.Load())
		}
		rate = float64(n.Load()) / time.Since(start).Seconds()
		return rate, (cpu() - c0) * 1e6 / float64(n.Load())
	}
	check := func(endpoint string) func(g, i int) (bool, error) {
		return func(g, i int) (bool, error) {
			var d Decision
			err := e.Check(context.Background(), &Request{APIKey: keys[(g+50*i)%len(keys)], Endpoint: endpoint}, &d)
			if err == nil && (!d.Allowed || d.Degraded) {
				err = fmt.Errorf("check: %+v", d)
			}
			return true, err
		}
	}
	var made [50][]string // each goroutine's reservations, for its commits
	var ratesR, ratesC, cpuR, cpuC, cpuL []float64
	for range 4 {
		cr, ccpu := round(check("/b"))
		_, lcpu := round(check("/g"))
		for g := range made {
			made[g] = made[g][:0]
		}
		rr, rcpu := round(func(g, i int) (bool, error) {
			var d Decision
			res, err := e.Reserve(context.Background(), &Request{APIKey: keys[(g+50*i)%len(keys)], Endpoint: "/b", Cost: 5}, time.Minute, &d)
			if err == nil && res.ID == "" {
				err = fmt.Errorf("reserve: %+v", d)
			}
			made[g] = append(made[g], res.ID)
			return true, err
		})
		mr, mcpu := round(func(g, i int) (bool, error) {
			if i >= len(made[g]) {
				return false, nil
			}
			_, err := e.Settle(context.Background(), made[g][i], 3)
			return true, err
		})
		ratesR, ratesC = append(ratesR, rr/cr), append(ratesC, mr/cr)
		cpuR, cpuC, cpuL = append(cpuR, rcpu/ccpu), append(cpuC, mcpu/ccpu), append(cpuL, lcpu/ccpu)
		b.Logf("round: checks %.0f/s, Redis %.1f µs each (through limits.lua: %.1f µs); reserves %.0f/s, %.1f µs; commits %.0f/s, %.1f µs",
			cr, ccpu, lcpu, rr, rcpu, mr, mcpu)
	}
	b.ReportMetric(median(cpuL), "limits.lua-redis-cpu-ratio")
	b.ReportMetric(median(ratesR), "reserve-rate-ratio")
	b.ReportMetric(median(cpuR), "reserve-redis-cpu-ratio")
	b.ReportMetric(median(ratesC), "commit-rate-ratio")
	b.ReportMetric(median(cpuC), "commit-redis-cpu-ratio")
}
