package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/geoquota/geoquota/cmd/internal/daemon"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/namespace"
)

// config is regiond's configuration: the flags of the fixed contract (docs/operations.md) and a few more,
// each also settable as GEOQUOTA_<NAME> (upper case, - as _). A flag on the
// command line wins over its variable.
type config struct {
	region         string
	redis          string
	nats           string
	rules          string
	rulesStrict    bool
	grpcAddr       string
	httpAddr       string
	adminToken     string
	regions        string
	peers          string
	memberlistAddr string
	proxyUpstream  string
	dev            bool

	tls              daemon.TLS
	redisAuth        regional.RedisAuth
	redactKeys       bool
	logFormat        string
	logLevel         string
	timeout          time.Duration
	shutdownTimeout  time.Duration
	shutdownDelay    time.Duration
	trustedProxies   string
	trustedPrefixes  []netip.Prefix
	maintainEvery    time.Duration
	violationsMaxLen int64
	reloadDebounce   time.Duration
	debugAddr        string
	proxyUpstreamURL *url.URL
	regionList       []string
	memberlistKey    string
	replicaName      string
	peerList         []string
	memberKey        []byte
	gossipInterval   time.Duration
	antiEntropy      time.Duration
	natsAuth         daemon.NATSAuth
	requireAuth      bool
	deployment       string
	names            namespace.Names
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("regiond", flag.ContinueOnError)
	fs.StringVar(&c.region, "region", "local", "name of this region")
	fs.StringVar(&c.redis, "redis", "", "the region's Redis: redis://host:port/db, rediss://…, unix:///path/redis.sock?db=N, redis-sentinel://host:port,…/mastername, or host:port,host:port for a Cluster")
	fs.StringVar(&c.nats, "nats", "", "NATS URL(s) for gossip with the other regions and globalsync")
	fs.StringVar(&c.rules, "rules", "", "rules file (YAML), or a directory of envoyproxy/ratelimit domain files (converted); watched and reloaded when it changes, and on SIGHUP")
	daemon.StrictRulesFlag(fs, &c.rulesStrict)
	fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:8081", "address of the gRPC API (geoquota.v1 and Envoy RLS v3)")
	fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:8080", "address of the HTTP API, metrics and health")
	fs.StringVar(&c.adminToken, "admin-token", "", "bearer token for admin calls; without one they are refused")
	fs.StringVar(&c.regions, "regions", "", "every region, comma-separated, this one included")
	fs.StringVar(&c.peers, "peers", "", "host:port of sibling replicas in this region, comma-separated")
	fs.StringVar(&c.memberlistAddr, "memberlist-addr", "", "address for membership among this region's replicas")
	fs.StringVar(&c.proxyUpstream, "proxy-upstream", "", "make the HTTP API a reverse proxy to this URL for every other path")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", "", "with --proxy-upstream: the proxies in front (CIDRs or addresses, comma-separated) whose X-Forwarded-For gives the client's IP")
	fs.BoolVar(&c.dev, "dev", false, "run with nothing else: embedded NATS, in-memory store, the example rules")
	c.tls.AddFlags(fs)
	redaction := daemon.KeyRedaction(fs)
	fs.StringVar(&c.redisAuth.Username, "redis-username", "", "Redis ACL user, for every form of --redis (with --redis-password)")
	fs.StringVar(&c.redisAuth.Password, "redis-password", "", "Redis password (AUTH), for every form of --redis; prefer GEOQUOTA_REDIS_PASSWORD to the command line")
	fs.StringVar(&c.redisAuth.SentinelPassword, "redis-sentinel-password", "", "the sentinels' own password, for redis-sentinel://")
	fs.BoolVar(&c.redisAuth.TLS, "redis-tls", false, "connect to Redis over TLS, for every form of --redis (rediss:// does for a single server)")
	fs.StringVar(&c.redisAuth.CA, "redis-ca", "", "PEM file of the CAs that sign the Redis servers' certificates (turns TLS on)")
	fs.StringVar(&c.redisAuth.Cert, "redis-cert", "", "PEM file of a client certificate for Redis servers that ask for one (with --redis-key; turns TLS on)")
	fs.StringVar(&c.redisAuth.Key, "redis-key", "", "PEM file of the Redis client certificate's private key")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&c.timeout, "timeout", 50*time.Millisecond, "bound on each call to Redis; slower calls count as failures")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on shutdown")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, how long to go on serving with /readyz and gRPC health saying not serving, before closing the listeners: the time load balancers take to stop sending (a few seconds behind Kubernetes)")
	fs.DurationVar(&c.maintainEvery, "maintain-every", 250*time.Millisecond, "how often leases, caches, blocks and the audit log are tended")
	fs.Int64Var(&c.violationsMaxLen, "violations-maxlen", 10000, "about how many violations the audit stream keeps")
	fs.DurationVar(&c.reloadDebounce, "reload-debounce", 100*time.Millisecond, "wait after a change to the rules file before reloading it")
	fs.StringVar(&c.debugAddr, "debug-addr", "", "serve Go's profiler (net/http/pprof) on this address; off by default")
	fs.StringVar(&c.memberlistKey, "memberlist-key", "", "encrypts membership traffic among the region's replicas: 16, 24 or 32 bytes, hex-encoded")
	fs.StringVar(&c.replicaName, "replica-name", "", "this replica's name among its siblings (default: the host name and a random suffix)")
	fs.DurationVar(&c.gossipInterval, "gossip-interval", 250*time.Millisecond, "how often this region publishes its global usage")
	fs.DurationVar(&c.antiEntropy, "anti-entropy", 10*time.Second, "how often each replica says how far its gossip has run, so that a region that missed some asks for it")

	c.natsAuth.AddFlags(fs)
	fs.StringVar(&c.deployment, "deployment", "", "this deployment's name: its NATS subjects and buckets are its own, apart from other deployments on the same NATS")
	fs.BoolVar(&c.requireAuth, "require-auth", false, "refuse to start with NATS unauthenticated or memberlist unencrypted")

	if err := daemon.Parse("regiond", fs, args, getenv, "README.md, docs/operations.md, docs/features.md"); err != nil {
		return c, err
	}
	var err error
	if c.redactKeys, err = redaction(); err != nil {
		return c, err
	}
	return c, c.check()
}

func (c *config) check() error {
	if !c.dev && c.redis == "" {
		return errors.New("--redis is required (or --dev, for an in-memory store)")
	}
	if !c.dev && c.rules == "" {
		return errors.New("--rules is required (or --dev, for the example rules)")
	}
	if err := c.tls.Check(); err != nil {
		return err
	}
	if c.proxyUpstream != "" {
		u, err := url.Parse(c.proxyUpstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--proxy-upstream %q: want an http:// or https:// URL", c.proxyUpstream)
		}
		c.proxyUpstreamURL = u
	}
	if c.trustedProxies != "" {
		if c.proxyUpstream == "" {
			return errors.New("--trusted-proxies: only with --proxy-upstream")
		}
		for _, f := range strings.Split(c.trustedProxies, ",") {
			f = strings.TrimSpace(f)
			p, err := netip.ParsePrefix(f)
			if err != nil {
				a, aerr := netip.ParseAddr(f)
				if aerr != nil {
					return fmt.Errorf("--trusted-proxies: %q: want a CIDR such as 10.0.0.0/8 or an address", f)
				}
				p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
			}
			c.trustedPrefixes = append(c.trustedPrefixes, p.Masked())
		}
	}
	switch c.logFormat {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format %q: want text or json", c.logFormat)
	}
	if c.shutdownDelay < 0 {
		return errors.New("--shutdown-delay must not be negative")
	}
	if c.timeout <= 0 || c.shutdownTimeout <= 0 || c.maintainEvery <= 0 || c.reloadDebounce < 0 {
		return errors.New("--timeout, --shutdown-timeout and --maintain-every must be positive")
	}
	if c.gossipInterval <= 0 || c.antiEntropy <= 0 {
		return errors.New("--gossip-interval and --anti-entropy must be positive")
	}
	if !validRegionName(c.region) {
		return fmt.Errorf("--region %q: want letters, digits, - and _ only", c.region)
	}
	c.regionList = nil
	for _, r := range strings.Split(c.regions, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		if !validRegionName(r) {
			return fmt.Errorf("--regions: %q: want letters, digits, - and _ only", r)
		}
		c.regionList = append(c.regionList, r)
	}
	if len(c.regionList) > 0 {
		if err := (regional.GlobalConfig{Regions: c.regionList}).Validate(c.region); err != nil {
			return fmt.Errorf("--regions: %w", err)
		}
	}
	c.peerList = nil
	for _, p := range strings.Split(c.peers, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if _, _, err := net.SplitHostPort(p); err != nil {
				return fmt.Errorf("--peers: %q: want host:port", p)
			}
			c.peerList = append(c.peerList, p)
		}
	}
	if len(c.peerList) > 0 && c.memberlistAddr == "" {
		return errors.New("--peers needs --memberlist-addr: the address this replica listens on for its siblings")
	}
	if c.memberlistAddr != "" {
		if _, _, err := net.SplitHostPort(c.memberlistAddr); err != nil {
			return fmt.Errorf("--memberlist-addr %q: want host:port", c.memberlistAddr)
		}
	}
	if c.memberlistKey != "" {
		k, err := hex.DecodeString(c.memberlistKey)
		if err != nil || (len(k) != 16 && len(k) != 24 && len(k) != 32) {
			return errors.New("--memberlist-key: want 16, 24 or 32 bytes, hex-encoded (32, 48 or 64 hex digits)")
		}
		c.memberKey = k
	}
	names, err := namespace.New(c.deployment)
	if err != nil {
		return fmt.Errorf("--deployment: %w", err)
	}
	c.names = names
	if err := c.natsAuth.Check(); err != nil {
		return err
	}
	if err := c.redisAuth.Check(); err != nil {
		return err
	}
	if c.requireAuth {
		if c.nats != "" && !c.natsAuth.Authenticated(c.nats) {
			return errors.New("--require-auth: the NATS connection would not authenticate: give --nats-creds, --nats-nkey, --nats-user or --nats-token")
		}
		if c.memberlistAddr != "" && c.memberlistKey == "" {
			return errors.New("--require-auth: membership among the region's replicas would be unencrypted: give --memberlist-key")
		}
	}
	if c.replicaName == "" {
		host, _ := os.Hostname()
		var b [3]byte
		rand.Read(b[:])
		c.replicaName = host + "-" + hex.EncodeToString(b[:])
	}
	return nil
}

// validRegionName accepts names that are safe in NATS subjects and Redis
// hash fields.
func validRegionName(r string) bool {
	if r == "" || len(r) > 64 {
		return false
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return r[0] != '-'
}
