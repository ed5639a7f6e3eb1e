package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/geoquota/geoquota/cmd/internal/daemon"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
	"github.com/geoquota/geoquota/transport/control"
	"github.com/geoquota/geoquota/transport/gossip"
)

// run serves until ctx ends, then shuts down gracefully: health reports
// not serving, in-flight requests finish, the audit log is flushed.
// wireTime is how long a message between two regions is taken to be on
// the wire: with a gossip round, how far behind the others' usage a
// region's copy runs (regional.GlobalConfig.Lag).
const wireTime = 250 * time.Millisecond

func run(ctx context.Context, c config, logw io.Writer) error {
	log := daemon.Logger(logw, c.logFormat, c.logLevel)
	metrics := transport.NewMetrics(nil)
	// The rules first: a mistake in them is reported before anything connects.
	rules, err := loadRules(c)
	if err != nil {
		return err
	}
	daemon.LogRuleWarnings(log, rules)

	var store regional.Store
	var violations regional.ViolationLog
	if c.redis != "" {
		rs, err := regional.NewRedisStore(ctx, c.redis, regional.RedisOptions{Region: c.region, Timeout: c.timeout, Observe: metrics.ObserveRedis, Auth: c.redisAuth})
		if err != nil {
			return err
		}
		defer rs.Close()
		store = rs
		violations = regional.NewRedisViolations(rs.Client(), c.region, c.violationsMaxLen)
	} else {
		violations = regional.NewMemoryViolations(int(c.violationsMaxLen))
	}

	var members atomic.Pointer[control.Members]
	engine := regional.New(regional.Config{Region: c.region, Replica: c.replicaName, Store: store, Timeout: c.timeout, Violations: violations, Logger: log, RedactKeys: c.redactKeys,
		Global: regional.GlobalConfig{Regions: c.regionList, UnknownPeers: !c.dev && c.nats != "", Lag: c.gossipInterval + wireTime},
		OnDenied: func(d regional.Denial) {
			if m := members.Load(); m != nil {
				m.TellDenial(d)
			}
		}}, rules)
	metrics.Attach(engine)
	var elected func() bool
	if c.memberlistAddr != "" {
		m, err := control.StartMembers(control.MembersConfig{Name: c.replicaName, Addr: c.memberlistAddr,
			Peers: c.peerList, SecretKey: c.memberKey, Logger: log}, engine)
		if err != nil {
			return err
		}
		defer m.Leave(time.Second)
		members.Store(m)
		elected = m.Elected
		log.Info("members: listening", "addr", m.Addr(), "peers", c.peerList)
	}

	natsURL := c.nats
	natsOpts, err := c.natsAuth.Options()
	if err != nil {
		return err
	}
	insecure := map[string]bool{}
	if c.dev && natsURL == "" {
		ns, err := startEmbeddedNATS()
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		natsURL = ns.ClientURL()
		natsOpts = append(natsOpts, nats.InProcessServer(ns))
		log.Info("embedded NATS started, in this process only")
	} else if natsURL != "" {
		insecure["nats"] = !c.natsAuth.Authenticated(natsURL)
		if insecure["nats"] {
			log.Warn(daemon.InsecureNATS)
		}
	}
	if c.memberlistAddr != "" {
		if insecure["memberlist"] = c.memberKey == nil; insecure["memberlist"] {
			log.Warn("members: unencrypted: anyone who can reach --memberlist-addr can join this region's replicas and deny its keys; " +
				"give --memberlist-key (the same on every replica), and --require-auth to refuse to start this way")
		}
	}
	daemon.Insecure(metrics.Registry, insecure)
	if natsURL != "" {
		// NATS down at start is no reason not to serve: the region
		// enforces alone on its floor and connects when it can.
		nc, err := nats.Connect(natsURL, append(natsOpts, nats.Name("regiond "+c.region), nats.MaxReconnects(-1),
			nats.RetryOnFailedConnect(true), nats.Timeout(5*time.Second), daemon.NewNATSErrors(log, metrics.Registry).Option(),
			nats.CustomInboxPrefix(c.names.Inbox(c.region)))...)
		if err != nil {
			return fmt.Errorf("--nats: %w", err)
		}
		defer nc.Close()
		resync := new(control.Resync)
		node, err := gossip.New(gossip.Config{Region: c.region, Replica: c.replicaName, Instance: control.NewInstance(), Names: c.names,
			Interval: c.gossipInterval, AntiEntropy: c.antiEntropy, Elected: elected, OnRejoin: func(string) { resync.Fire() },
			Counters: engine, Engine: engine}, time.Now())
		if err != nil {
			return fmt.Errorf("--region: %w", err)
		}
		g, err := control.StartGossip(nc, node, control.GossipOptions{Logger: log})
		if err != nil {
			return err
		}
		defer g.Close()
		metrics.AttachGossip(node.Stats(), engine)
		subjects := node.Names()
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("--nats: %w", err)
		}
		watchCtx, stopWatch := context.WithCancel(context.Background())
		watched := make(chan struct{})
		var watchers sync.WaitGroup
		watchers.Add(2)
		go func() { defer watchers.Done(); control.WatchBudgets(watchCtx, js, subjects, engine, log, resync) }()
		go func() { defer watchers.Done(); control.WatchRules(watchCtx, js, subjects, engine, log, resync) }()
		go func() { watchers.Wait(); close(watched) }()
		defer func() { stopWatch(); <-watched }()
	}

	srv := transport.NewServer(engine, transport.Options{Region: c.region, AdminToken: c.adminToken, RedactKeys: c.redactKeys,
		StrictRules: c.rulesStrict, Violations: violations, ProxyUpstream: c.proxyUpstreamURL, TrustedProxies: c.trustedPrefixes, Metrics: metrics, Logger: log})
	addrs := []daemon.Addr{{Flag: "grpc-addr", Addr: c.grpcAddr}, {Flag: "http-addr", Addr: c.httpAddr}}
	if c.debugAddr != "" {
		addrs = append(addrs, daemon.Addr{Flag: "debug-addr", Addr: c.debugAddr})
	}
	lis, err := daemon.Listen(addrs...)
	if err != nil {
		return err
	}
	limits := daemon.DefaultLimits()
	grpcLis, httpLis := limits.Listener(lis[0]), limits.Listener(lis[1])
	gopts := limits.GRPCOptions()
	grpcTLS, err := c.tls.GRPC()
	httpTLS, err2 := c.tls.HTTP()
	if err := errors.Join(err, err2); err != nil {
		for _, l := range lis {
			l.Close()
		}
		return err
	}
	if grpcTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(grpcTLS)))
	}
	if c.debugAddr != "" {
		dbg := lis[2]
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		ds := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go ds.Serve(dbg)
		defer ds.Close()
		log.Info("profiler serving", "addr", dbg.Addr().String())
	}
	g := grpc.NewServer(gopts...)
	srv.RegisterGRPC(g)
	hs := limits.HTTPServer(srv.Handler(), slog.NewLogLogger(log.Handler(), slog.LevelWarn))

	bg, stopBG := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	serveErr := make(chan error, 2)
	spawn := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	spawn(func() { engine.Run(bg, c.maintainEvery) })
	if c.rules != "" {
		reload := func(why string) {
			rs, err := regional.LoadFile(c.rules)
			if err == nil {
				err = daemon.CheckRules(rs, c.rulesStrict)
			}
			if err != nil {
				engine.Stats().RuleReloadErrors.Add(1)
				log.Error("rules rejected; the last good rules stay in force", "file", c.rules, "error", err)
				return
			}
			engine.SetRules(rs)
			log.Info("rules reloaded", "why", why, "file", c.rules, "rules", len(rs.Rules()))
			daemon.LogRuleWarnings(log, rs)
		}
		spawn(func() { watchRules(bg, c.rules, rules.YAML(), c.reloadDebounce, reload, log) })
		spawn(func() { onSIGHUP(bg, func() { reload("SIGHUP") }) })
	}
	spawn(func() {
		if err := g.Serve(grpcLis); err != nil {
			serveErr <- fmt.Errorf("gRPC: %w", err)
		}
	})
	spawn(func() {
		var err error
		if httpTLS != nil {
			hs.TLSConfig = httpTLS
			err = hs.ServeTLS(httpLis, "", "")
		} else {
			err = hs.Serve(httpLis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("HTTP: %w", err)
		}
	})
	srv.SetServing(true)
	log.Info("regiond serving", "region", c.region, "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(),
		"store", storeName(c), "rules", rules.Source, "rule_count", len(rules.Rules()), "admin", c.adminToken != "", "proxy", c.proxyUpstream,
		"vtprotobuf", transport.VTMarshals())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	}
	log.Info("shutting down", "grace", c.shutdownTimeout, "delay", c.shutdownDelay)
	srv.SetServing(false)
	if c.shutdownDelay > 0 && runErr == nil {
		// Still answering, while /readyz and gRPC health say not
		// serving: the time balancers take to stop sending here.
		delay := time.NewTimer(c.shutdownDelay)
		select {
		case <-delay.C:
		case runErr = <-serveErr:
		}
		delay.Stop()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	hs.Shutdown(shutdownCtx)
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-shutdownCtx.Done():
		g.Stop()
		<-stopped
	}
	stopBG()
	wg.Wait()
	if err := engine.Maintain(shutdownCtx); err != nil { // the last violations, leases back
		log.Warn("final maintenance", "error", err)
	}
	return runErr
}

func storeName(c config) string {
	if c.redis == "" {
		return "memory"
	}
	return "redis"
}

func loadRules(c config) (*regional.RuleSet, error) {
	if c.rules == "" {
		return regional.Parse("example-rules.yaml", regional.ExampleRules)
	}
	rs, err := regional.LoadFile(c.rules)
	if err != nil {
		return nil, err
	}
	return rs, daemon.CheckRules(rs, c.rulesStrict)
}

// watchRules reloads the rules file when it changes. It watches the
// directory, not the file: editors replace files, and Kubernetes swaps a
// ConfigMap's symlink. Any event in the directory leads, after a short
// wait, to reading the file; only a change of the file's content reloads.
func watchRules(ctx context.Context, path string, loaded []byte, debounce time.Duration, reload func(string), log *slog.Logger) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Error("cannot watch the rules file; reload with SIGHUP", "error", err)
		return
	}
	defer w.Close()
	dir := filepath.Dir(path)
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		dir = path // a directory of envoyproxy/ratelimit domain files
	}
	if err := w.Add(dir); err != nil {
		log.Error("cannot watch the rules file; reload with SIGHUP", "dir", dir, "error", err)
		return
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// The file as last read (loaded: at start): rules published since
	// (NATS, the admin API) stay in force until the file itself changes,
	// not whenever something else in its directory does.
	last := loaded
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-w.Errors:
			log.Warn("watching the rules file", "error", err)
		case <-w.Events:
			timer.Reset(debounce)
		case <-timer.C:
			b, err := regional.ReadRules(path)
			if err != nil {
				log.Warn("rules file unreadable; the last good rules stay", "file", path, "error", err)
				continue
			}
			if !bytes.Equal(b, last) {
				last = b
				reload("file changed")
			}
		}
	}
}

func onSIGHUP(ctx context.Context, f func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			f()
		}
	}
}

// startEmbeddedNATS runs a NATS server with JetStream in this process, on
// a free loopback port, for --dev.
func startEmbeddedNATS() (*natsserver.Server, error) {
	dir, err := os.MkdirTemp("", "regiond-dev-nats-*")
	if err != nil {
		return nil, err
	}
	ns, err := natsserver.NewServer(&natsserver.Options{DontListen: true, JetStream: true,
		StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not start")
	}
	return ns, nil
}
