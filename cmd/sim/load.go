package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

// loadConfig is sim load's flags.
type loadConfig struct {
	target      string
	api         string
	keys        int
	zipf        float64
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	rate        float64
	endpoint    string
	method      string
	keyPrefix   string
	domain      string
}

// maxLoadDuration bounds a run: load tests are bounded in time.
const maxLoadDuration = 10 * time.Minute

func parseLoadFlags(args []string) (loadConfig, error) {
	var c loadConfig
	fs := flag.NewFlagSet("sim load", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.target, "target", "127.0.0.1:8081", "host:port of the API (a loopback address)")
	fs.StringVar(&c.api, "api", "grpc", "API: envoy (RLS v3), grpc (geoquota.v1) or http (/v1/check)")
	fs.IntVar(&c.keys, "keys", 10000, "number of distinct API keys")
	fs.Float64Var(&c.zipf, "zipf", 0, "draw keys by Zipf with this exponent (> 1); 0 draws them uniformly")
	fs.IntVar(&c.concurrency, "concurrency", 50, "concurrent callers")
	fs.DurationVar(&c.duration, "duration", 20*time.Second, "how long to measure, after the warm-up")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Second, "how long to send before measuring")
	fs.Float64Var(&c.rate, "rate", 0, "requests per second in all (open loop; latency counts from each request's due time); 0 sends as fast as answers come")
	fs.StringVar(&c.endpoint, "endpoint", "/search", "the endpoint descriptor")
	fs.StringVar(&c.method, "method", "GET", "the method descriptor")
	fs.StringVar(&c.keyPrefix, "key-prefix", "sk_load_", "prefix of the API keys")
	fs.StringVar(&c.domain, "domain", "", "rate-limit domain")
	if err := fs.Parse(args); err != nil {
		return c, usageError(fs, err)
	}
	switch {
	case c.api != "envoy" && c.api != "grpc" && c.api != "http":
		return c, fmt.Errorf("-api %q: want envoy, grpc or http", c.api)
	case c.keys < 1:
		return c, errors.New("-keys must be at least 1")
	case c.zipf != 0 && c.zipf <= 1:
		return c, errors.New("-zipf must be above 1 (or 0 for uniform keys)")
	case c.concurrency < 1 || c.concurrency > 10_000:
		return c, errors.New("-concurrency must be 1 to 10000")
	case c.duration <= 0 || c.warmup < 0 || c.duration+c.warmup > maxLoadDuration:
		return c, fmt.Errorf("-duration must be positive and, with -warmup, at most %v", maxLoadDuration)
	case c.rate < 0:
		return c, errors.New("-rate must not be negative")
	}
	return c, checkLoopback(c.target)
}

// checkLoopback refuses targets off this machine: sim load is for loopback.
func checkLoopback(target string) error {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return fmt.Errorf("-target %q: want host:port", target)
	}
	addrs, err := net.LookupHost(host)
	if err != nil {
		return fmt.Errorf("-target %q: %v", target, err)
	}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("-target %q: %s is not a loopback address; sim load only targets this machine", target, a)
		}
	}
	return nil
}

// caller sends one check and says whether it was allowed.
type caller func(ctx context.Context, key string) (allowed bool, err error)

func newCaller(c loadConfig) (caller, func(), error) {
	switch c.api {
	case "http":
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c.concurrency, MaxConnsPerHost: c.concurrency}, Timeout: 10 * time.Second}
		url := "http://" + c.target + "/v1/check"
		return func(ctx context.Context, key string) (bool, error) {
			body := `{"descriptors":{"api_key":"` + key + `","endpoint":"` + c.endpoint + `","method":"` + c.method + `"}}`
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewBufferString(body))
			if err != nil {
				return false, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return false, err
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return true, nil
			case http.StatusTooManyRequests, http.StatusForbidden:
				return false, nil
			}
			return false, fmt.Errorf("HTTP %s", resp.Status)
		}, client.CloseIdleConnections, nil
	case "grpc", "envoy":
		conn, err := grpc.NewClient(c.target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		closer := func() { conn.Close() }
		if c.api == "grpc" {
			rl := pb.NewRateLimiterClient(conn)
			return func(ctx context.Context, key string) (bool, error) {
				resp, err := rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.Request{{Domain: c.domain,
					Descriptors: map[string]string{"api_key": key, "endpoint": c.endpoint, "method": c.method}}}})
				if err != nil {
					return false, err
				}
				return resp.Decisions[0].Allowed, nil
			}, closer, nil
		}
		rls := rlsv3.NewRateLimitServiceClient(conn)
		return func(ctx context.Context, key string) (bool, error) {
			resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: c.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: key}, {Key: "endpoint", Value: c.endpoint}, {Key: "method", Value: c.method}}}}})
			if err != nil {
				return false, err
			}
			return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
		}, closer, nil
	}
	return nil, nil, fmt.Errorf("unknown api %q", c.api)
}

// report is what a run measured.
type report struct {
	sent, allowed, denied, errors int64
	elapsed                       time.Duration
	latencies                     []time.Duration // sorted
	// lags are, with a rate, how late each request left against its due
	// time (sorted): the load generator's own share of the latency.
	lags       []time.Duration
	firstError string
}

func (r *report) percentile(p float64) time.Duration { return percentile(r.latencies, p) }

// percentile returns the p-th percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)))
	return sorted[min(i, len(sorted)-1)]
}

func (r *report) print(w io.Writer, c loadConfig) {
	keys := "uniform"
	if c.zipf > 0 {
		keys = fmt.Sprintf("zipf s=%g", c.zipf)
	}
	fmt.Fprintf(w, "api %s  target %s  keys %d (%s)  concurrency %d  duration %v  warmup %v", c.api, c.target, c.keys, keys, c.concurrency, c.duration, c.warmup)
	if c.rate > 0 {
		fmt.Fprintf(w, "  rate %.0f/s", c.rate)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "requests/s   %10.0f\n", float64(r.sent)/r.elapsed.Seconds())
	fmt.Fprintf(w, "requests     %10d  allowed %d  denied %d  errors %d\n", r.sent, r.allowed, r.denied, r.errors)
	fmt.Fprintf(w, "latency      %s\n", percentiles(r.latencies))
	if len(r.lags) > 0 {
		fmt.Fprintf(w, "send lag     %s  (late departures, included in latency)\n", percentiles(r.lags))
	}
	if r.firstError != "" {
		fmt.Fprintf(w, "first error  %s\n", r.firstError)
	}
}

// percentiles formats the percentiles a report prints of sorted durations.
func percentiles(sorted []time.Duration) string {
	p := func(q float64) time.Duration { return percentile(sorted, q).Round(time.Microsecond) }
	return fmt.Sprintf("p50 %v  p90 %v  p99 %v  p99.9 %v  max %v", p(50), p(90), p(99), p(99.9), p(100))
}

// runLoad sends load for the warm-up, then measures for the duration.
func runLoad(ctx context.Context, c loadConfig, log io.Writer) (*report, error) {
	call, closeCaller, err := newCaller(c)
	if err != nil {
		return nil, err
	}
	defer closeCaller()
	ctx, cancel := context.WithTimeout(ctx, c.warmup+c.duration+30*time.Second)
	defer cancel()
	start := time.Now()
	measureFrom, end := start.Add(c.warmup), start.Add(c.warmup+c.duration)
	var sent, allowed, denied, failed atomic.Int64
	var firstErr atomic.Value
	lat, lags := make([][]time.Duration, c.concurrency), make([][]time.Duration, c.concurrency)
	var wg sync.WaitGroup
	for w := range c.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w) + 1))
			var zipf *rand.Zipf
			if c.zipf > 0 {
				zipf = rand.NewZipf(rng, c.zipf, 1, uint64(c.keys-1))
			}
			// With a rate, each caller sends on its own schedule, offset
			// from the others, and latency counts from the due time.
			var interval time.Duration
			due := start
			if c.rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(c.concurrency) / c.rate)
				due = start.Add(interval * time.Duration(w) / time.Duration(c.concurrency))
			}
			for {
				if interval > 0 {
					if wait := time.Until(due); wait > 0 {
						time.Sleep(wait) // the open-loop schedule
					}
				} else {
					due = time.Now()
				}
				if !due.Before(end) || ctx.Err() != nil {
					return
				}
				var k uint64
				if zipf != nil {
					k = zipf.Uint64()
				} else {
					k = uint64(rng.Intn(c.keys))
				}
				key := fmt.Sprintf("%s%06d", c.keyPrefix, k)
				left := time.Now()
				ok, err := call(ctx, key)
				done := time.Now()
				if !due.Before(measureFrom) {
					sent.Add(1)
					lat[w] = append(lat[w], done.Sub(due))
					if interval > 0 {
						lags[w] = append(lags[w], left.Sub(due))
					}
					switch {
					case err != nil:
						failed.Add(1)
						firstErr.CompareAndSwap(nil, err.Error())
					case ok:
						allowed.Add(1)
					default:
						denied.Add(1)
					}
				}
				due = due.Add(interval)
			}
		}()
	}
	wg.Wait()
	r := &report{sent: sent.Load(), allowed: allowed.Load(), denied: denied.Load(), errors: failed.Load(), elapsed: c.duration}
	for w := range lat {
		r.latencies = append(r.latencies, lat[w]...)
		r.lags = append(r.lags, lags[w]...)
	}
	slices.Sort(r.latencies)
	slices.Sort(r.lags)
	if e, ok := firstErr.Load().(string); ok {
		r.firstError = e
	}
	if r.sent == 0 {
		return r, errors.New("no request was measured")
	}
	return r, nil
}
