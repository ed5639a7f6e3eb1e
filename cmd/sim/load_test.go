package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
)

// startServer serves an in-memory engine over gRPC and HTTP on loopback.
func startServer(t *testing.T) (grpcAddr, httpAddr string) {
	t.Helper()
	rules, err := regional.Parse("", []byte(`
rules:
  - { id: search, match: { endpoint: /search }, by: [api_key], algorithm: fixed_window, limit: 20, window: 1h }
`))
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer(regional.New(regional.Config{}, rules), transport.Options{})
	srv.SetServing(true)
	h := httptest.NewServer(srv.Handler())
	t.Cleanup(h.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.RegisterGRPC(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String(), strings.TrimPrefix(h.URL, "http://")
}

func TestLoadEachAPI(t *testing.T) {
	grpcAddr, httpAddr := startServer(t)
	for _, tc := range []struct{ api, target string }{{"envoy", grpcAddr}, {"grpc", grpcAddr}, {"http", httpAddr}} {
		t.Run(tc.api, func(t *testing.T) {
			cfg, err := parseLoadFlags([]string{"-api", tc.api, "-target", tc.target, "-keys", "5", "-concurrency", "4",
				"-duration", "400ms", "-warmup", "100ms", "-key-prefix", tc.api + "_"})
			if err != nil {
				t.Fatal(err)
			}
			rep, err := runLoad(context.Background(), cfg, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			// 5 keys, 20 each an hour: at most 100 allowed in all, and
			// some allowed during the warm-up are not counted.
			if rep.errors != 0 || rep.allowed+rep.denied != rep.sent || rep.allowed > 100 || rep.denied == 0 || len(rep.latencies) != int(rep.sent) {
				t.Fatalf("report %+v (first error %q)", rep, rep.firstError)
			}
			if p := rep.percentile; !(p(50) <= p(90) && p(90) <= p(99) && p(99) <= p(99.9) && p(99.9) <= p(100) && p(50) > 0) {
				t.Fatalf("percentiles out of order: %v %v %v %v %v", p(50), p(90), p(99), p(99.9), p(100))
			}
			var out bytes.Buffer
			rep.print(&out, cfg)
			for _, want := range []string{"requests/s", "allowed", "p99.9"} {
				if !strings.Contains(out.String(), want) {
					t.Fatalf("output lacks %q:\n%s", want, out.String())
				}
			}
			if len(rep.lags) != 0 || strings.Contains(out.String(), "send lag") {
				t.Fatalf("a closed-loop run has no schedule to lag behind, yet %d lags:\n%s", len(rep.lags), out.String())
			}
		})
	}
}

func TestLoadAtARate(t *testing.T) {
	grpcAddr, _ := startServer(t)
	cfg, err := parseLoadFlags([]string{"-target", grpcAddr, "-concurrency", "4", "-rate", "400", "-duration", "1s", "-warmup", "0s", "-zipf", "1.2"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := runLoad(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.sent < 300 || rep.sent > 420 || time.Since(start) > 3*time.Second {
		t.Fatalf("%d requests in %v at 400/s for 1s", rep.sent, time.Since(start))
	}
	// Each request's lateness in leaving is measured, is never negative
	// (a caller waits for the due time) and is part of its latency.
	if len(rep.lags) != int(rep.sent) || rep.lags[0] < 0 || percentile(rep.lags, 100) > rep.percentile(100) {
		t.Fatalf("%d lags for %d requests, min %v, max %v (latency max %v)", len(rep.lags), rep.sent, rep.lags[0], percentile(rep.lags, 100), rep.percentile(100))
	}
	var out strings.Builder
	rep.print(&out, cfg)
	if !strings.Contains(out.String(), "\nsend lag     p50 ") {
		t.Fatalf("report without the send lag:\n%s", out.String())
	}
}

func TestLoadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-target", "192.0.2.1:8081"}, "not a loopback address"},
		{[]string{"-api", "soap"}, "-api"},
		{[]string{"-zipf", "0.5"}, "-zipf"},
		{[]string{"-duration", "11m"}, "-duration"},
		{[]string{"-concurrency", "0"}, "-concurrency"},
	} {
		if _, err := parseLoadFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
}
