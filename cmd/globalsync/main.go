package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/cmd/internal/daemon"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
	"github.com/geoquota/geoquota/transport/namespace"
)

func main() {
	c, err := parseFlags(os.Args[1:], os.Getenv)
	if err != nil {
		os.Exit(daemon.ParseFailed(os.Stdout, os.Stderr, "globalsync", err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, os.Stderr); err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "globalsync:") {
			msg = "globalsync: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

type config struct {
	nats, grpcAddr, httpAddr, rules, adminToken, regions, id, logFormat string
	dashboardURL                                                        string
	rebalance, leaderTTL, leaseTTL                                      time.Duration
	reserve                                                             float64
	counters, shard, shards                                             int
	regionList                                                          []string
	deployment                                                          string
	names                                                               namespace.Names
	tls                                                                 daemon.TLS
	redactKeys, rulesStrict                                             bool
	natsAuth                                                            daemon.NATSAuth
	requireAuth                                                         bool
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("globalsync", flag.ContinueOnError)
	fs.StringVar(&c.nats, "nats", "", "NATS URL(s), with JetStream (required)")
	fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:9081", "address of the gRPC API: geoquota.v1.GlobalSync, health, reflection")
	fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:9080", "address of the HTTP API and dashboard: /, /healthz, /readyz, /v1/budgets, /v1/regions")
	fs.StringVar(&c.dashboardURL, "dashboard-url", "", "this instance's dashboard as operators reach it, named to the other instances so that a follower's links to the leader's; default: from --http-addr")
	fs.StringVar(&c.rules, "rules", "", "rules file (YAML), or a directory of envoyproxy/ratelimit domain files: with it, each window's books are closed (over-admission, carry_debt)")
	daemon.StrictRulesFlag(fs, &c.rulesStrict)
	fs.StringVar(&c.adminToken, "admin-token", "", "bearer token every /v1 read and geoquota.v1.GlobalSync call must carry; empty: open")
	fs.StringVar(&c.regions, "regions", "", "every region, comma-separated; empty: the regions heard from")
	fs.StringVar(&c.id, "id", "", "this instance's name among the globalsync instances; default: the host name and a random suffix")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.DurationVar(&c.rebalance, "rebalance", time.Second, "how often budgets are recomputed and published")
	fs.DurationVar(&c.leaderTTL, "leader-ttl", 3*time.Second, "how long the leader's lease lasts unless renewed")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 10*time.Second, "how long a region's budget lease holds, at most 5m")
	fs.Float64Var(&c.reserve, "reserve", 0.10, "fraction of each global limit kept as the regions' floors")
	fs.IntVar(&c.counters, "counters", budget.DefaultMaxCounters, fmt.Sprintf("most counters (tenants) of a rule with budgets of their own, following their own demand (at most %d; 0: none); each takes some 60 to 170 bytes of the rule's budget document, which holds no more than fit in a NATS message", budget.MaxCounters))
	fs.IntVar(&c.shards, "shards", 1, fmt.Sprintf("run globalsync as this many instances (at most %d), each the leader of the slice of the counters whose keys hash to its --shard (its own leader claim and budget documents); run every slice, with a standby each if you like; every regiond must know slices first, and changing it wants every instance stopped first (docs/operations.md)", budget.MaxShards))
	fs.IntVar(&c.shard, "shard", 0, "the slice of the counters this instance leads, 0 to --shards-1; slice 0's leader publishes the rules")
	c.natsAuth.AddFlags(fs)
	c.tls.AddFlags(fs)
	redaction := daemon.KeyRedaction(fs)
	fs.StringVar(&c.deployment, "deployment", "", "the deployment's name, as its regiond have it: its NATS subjects and buckets are its own")
	fs.BoolVar(&c.requireAuth, "require-auth", false, "refuse to start with NATS unauthenticated")
	if err := daemon.Parse("globalsync", fs, args, getenv, "README.md, docs/operations.md, docs/design.md"); err != nil {
		return c, err
	}
	var err error
	if c.redactKeys, err = redaction(); err != nil {
		return c, err
	}
	if c.nats == "" {
		return c, errors.New("--nats is required")
	}
	if c.names, err = namespace.New(c.deployment); err != nil {
		return c, fmt.Errorf("--deployment: %w", err)
	}
	if err := c.tls.Check(); err != nil {
		return c, err
	}
	if err := c.natsAuth.Check(); err != nil {
		return c, err
	}
	if c.requireAuth && !c.natsAuth.Authenticated(c.nats) {
		return c, errors.New("--require-auth: the NATS connection would not authenticate: give --nats-creds, --nats-nkey, --nats-user or --nats-token")
	}
	if c.rebalance <= 0 || c.leaderTTL <= 0 || c.leaseTTL <= 0 {
		return c, errors.New("--rebalance, --leader-ttl and --lease-ttl must be positive")
	}
	if c.shards < 1 || c.shards > budget.MaxShards {
		return c, fmt.Errorf("--shards %d: want 1 to %d", c.shards, budget.MaxShards)
	}
	if c.shard < 0 || c.shard >= c.shards {
		return c, fmt.Errorf("--shard %d: want 0 to --shards-1 (%d)", c.shard, c.shards-1)
	}
	if c.leaseTTL > budget.MaxLeaseTTL {
		return c, fmt.Errorf("--lease-ttl %v: at most %v (a region takes no lease for longer)", c.leaseTTL, budget.MaxLeaseTTL)
	}
	for _, r := range strings.Split(c.regions, ",") {
		if r = strings.TrimSpace(r); r != "" {
			c.regionList = append(c.regionList, r)
		}
	}
	if c.id == "" {
		host, _ := os.Hostname()
		var b [3]byte
		rand.Read(b[:])
		c.id = host + "-" + hex.EncodeToString(b[:])
	}
	return c, nil
}

func run(ctx context.Context, c config, logw io.Writer) error {
	log := daemon.Logger(logw, c.logFormat, "info")
	var rules *regional.RuleSet
	if c.rules != "" {
		var err error
		if rules, err = regional.LoadFile(c.rules); err != nil {
			return err
		}
		if err := daemon.CheckRules(rules, c.rulesStrict); err != nil {
			return err
		}
		daemon.LogRuleWarnings(log, rules)
	}
	reg := prometheus.NewRegistry()
	bc := budget.DefaultConfig()
	bc.LeaseTTL, bc.Reserve, bc.Counters = c.leaseTTL, c.reserve, c.counters
	if err := bc.Validate(); err != nil {
		return err
	}
	natsOpts, err := c.natsAuth.Options()
	if err != nil {
		return err
	}
	insecure := !c.natsAuth.Authenticated(c.nats)
	if insecure {
		log.Warn(daemon.InsecureNATS)
	}
	daemon.Insecure(reg, map[string]bool{"nats": insecure})
	natsErrors := daemon.NewNATSErrors(log, reg)
	nc, err := nats.Connect(c.nats, append(natsOpts, nats.Name("globalsync "+c.id), nats.MaxReconnects(-1), nats.Timeout(5*time.Second),
		natsErrors.Option(), nats.CustomInboxPrefix(c.names.Inbox(namespace.GlobalSync)))...)
	if err != nil {
		return fmt.Errorf("--nats: %w", err)
	}
	defer nc.Close()
	svc, err := Start(ctx, nc, Config{ID: c.id, Names: c.names, RedactKeys: c.redactKeys, Regions: c.regionList, Rebalance: c.rebalance, LeaderTTL: c.leaderTTL,
		Budget: bc, Rules: rules, Registry: reg, Logger: log, RulesYAML: rulesReader(c.rules), StrictRules: c.rulesStrict,
		Shard: c.shard, Shards: c.shards})
	if err != nil {
		if last := natsErrors.Last(); last != nil {
			return fmt.Errorf("%w (NATS said: %v)", err, last)
		}
		return err
	}
	defer svc.Close()

	lis, err := daemon.Listen(daemon.Addr{Flag: "grpc-addr", Addr: c.grpcAddr}, daemon.Addr{Flag: "http-addr", Addr: c.httpAddr})
	if err != nil {
		return err
	}
	limits := daemon.DefaultLimits()
	grpcLis, httpLis := limits.Listener(lis[0]), limits.Listener(lis[1])
	grpcTLS, err := c.tls.GRPC()
	httpTLS, err2 := c.tls.HTTP()
	if err := errors.Join(err, err2); err != nil {
		lis[0].Close()
		lis[1].Close()
		return err
	}
	gopts := append(limits.GRPCOptions(), grpc.UnaryInterceptor(requireToken(c.adminToken)))
	if grpcTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(grpcTLS)))
	}
	g := grpc.NewServer(gopts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	healthCtx, stopHealth := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() { defer close(healthDone); followReadiness(healthCtx, hs, svc.Readiness, time.Second) }()
	defer func() { stopHealth(); <-healthDone }()
	pb.RegisterGlobalSyncServer(g, grpcServer{s: svc})
	reflection.Register(g)
	go g.Serve(grpcLis)
	defer g.Stop()
	srv := limits.HTTPServer(httpHandler(svc, reg, c.id, c.adminToken), slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	if httpTLS != nil {
		srv.TLSConfig = httpTLS
		go srv.ServeTLS(httpLis, "", "")
	} else {
		go srv.Serve(httpLis)
	}
	defer srv.Close()
	svc.SetURL(dashboardURL(c.dashboardURL, httpLis.Addr(), httpTLS != nil))
	log.Info("globalsync serving", "id", c.id, "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String())
	<-ctx.Done()
	log.Info("shutting down")
	return nil
}

// followReadiness keeps gRPC health's overall status ("") as /readyz says,
// checked every period, until ctx is done: SERVING when ready, NOT_SERVING
// else.
func followReadiness(ctx context.Context, hs *health.Server, ready func() Readiness, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready().Ready {
			st = healthpb.HealthCheckResponse_SERVING
		}
		hs.SetServingStatus("", st)
		select {
		case <-ctx.Done():
			hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
			return
		case <-t.C:
		}
	}
}

// httpHandler is globalsync's HTTP API and dashboard. With a token, every
// /v1 read needs it (Authorization: Bearer); the dashboard's page, health
// and metrics, which name no key, stay open.
func httpHandler(svc *Service, reg *prometheus.Registry, id, token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", serveDashboard)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		rd := svc.Readiness()
		if !rd.Ready {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "NOT_READY", "message": rd.Reason}})
			return
		}
		writeJSON(w, map[string]string{"status": "ready", "role": rd.Role, "leader": rd.Leader})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	read := func(pattern string, f func() any) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if token != "" && !transport.BearerMatches(r.Header.Get("Authorization"), token) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="geoquota"`)
				transport.WriteError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "globalsync's API needs Authorization: Bearer <admin token>")
				return
			}
			writeJSON(w, f())
		})
	}
	read("GET /v1/over-admissions", func() any { return svc.OverAdmissions() })
	read("GET /v1/budgets", func() any { return svc.Budgets() })
	read("GET /v1/regions", func() any { return map[string]any{"leader": svc.Leader(), "id": id, "regions": svc.Regions()} })
	read("GET /v1/dashboard", func() any { return svc.Dashboard() })
	// Errors as JSON, as every geoquota API answers them (SPEC §12): a
	// path served with another method, and any other path.
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/over-admissions", "/v1/budgets", "/v1/regions", "/v1/dashboard"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "GET, HEAD")
			transport.WriteError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", r.Method+" "+path+": use GET")
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			w.Header().Set("Allow", "GET, HEAD")
			transport.WriteError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", r.Method+" /: use GET")
			return
		}
		transport.WriteError(w, http.StatusNotFound, "NOT_FOUND", "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// dashboardURL is where operators reach the dashboard: flag, if given,
// else the address the HTTP API listens on, named by the host's name if
// that address is every interface's.
func dashboardURL(flag string, addr net.Addr, tls bool) string {
	if flag != "" {
		return flag
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if host, err = os.Hostname(); err != nil {
			return ""
		}
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/"
}

// requireToken makes every geoquota.v1.GlobalSync call carry the token in
// its metadata (authorization: Bearer); health and reflection stay open.
func requireToken(token string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if token != "" && strings.HasPrefix(info.FullMethod, "/geoquota.v1.GlobalSync/") {
			var auth string
			if md, ok := metadata.FromIncomingContext(ctx); ok {
				if v := md.Get("authorization"); len(v) > 0 {
					auth = v[0]
				}
			}
			if !transport.BearerMatches(auth, token) {
				return nil, status.Error(codes.Unauthenticated, "globalsync's API needs metadata authorization: Bearer <admin token>")
			}
		}
		return h(ctx, req)
	}
}

// rulesReader reads the rules file for publishing, or nil without one.
func rulesReader(path string) func() ([]byte, error) {
	if path == "" {
		return nil
	}
	return func() ([]byte, error) { return regional.ReadRules(path) }
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
