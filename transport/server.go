package transport

import (
	"crypto/subtle"
	"log/slog"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/geoquota/geoquota/regional"
)

// Options configure a Server.
type Options struct {
	// Region names the region that answers, in usage reports.
	Region string
	// AdminToken is the bearer token admin calls must carry. Empty: admin
	// calls are refused.
	AdminToken string
	// RedactKeys logs regional.RedactKey's hash in place of API keys.
	RedactKeys bool
	// StrictRules refuses rules put through the admin API that load with
	// warnings (regional.RuleSet.Strict), as regiond's --rules-strict.
	StrictRules bool
	// Violations is where admin calls read the audit trail of denials.
	Violations regional.ViolationLog
	// ProxyUpstream, if set, makes the HTTP handler a reverse proxy to it
	// for every path that is not regiond's own.
	ProxyUpstream *url.URL
	// TrustedProxies are the proxies in front of the reverse proxy whose
	// X-Forwarded-For is believed (see RequestBehind).
	TrustedProxies []netip.Prefix
	// Metrics records what the server does; nil means none.
	Metrics *Metrics
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// Server serves a regional engine over gRPC (geoquota.v1 and Envoy's
// RateLimitService v3) and HTTP. Its methods are safe for concurrent use.
type Server struct {
	engine  *regional.Engine
	opts    Options
	log     *slog.Logger
	health  *health.Server
	serving atomic.Bool
	// metrics are opts.Metrics bound to each API's label.
	metrics struct{ grpc, envoy, http apiMetrics }
	// envoyLimits are the RLS answers' RateLimit messages, shared.
	envoyLimits envoyLimits
}

// NewServer returns a server for the engine. It reports itself not ready
// until SetServing(true).
func NewServer(e *regional.Engine, opts Options) *Server {
	s := &Server{engine: e, opts: opts, log: opts.Logger, health: health.NewServer()}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.Metrics == nil {
		s.opts.Metrics = NewMetrics(e)
	}
	m := s.opts.Metrics
	s.metrics.grpc, s.metrics.envoy, s.metrics.http = m.forAPI("grpc"), m.forAPI("envoy"), m.forAPI("http")
	s.SetServing(false)
	return s
}

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.opts.Metrics }

// SetServing sets what health checks report: serving, or not (at start and
// while shutting down), so that load balancers stop sending first.
func (s *Server) SetServing(ok bool) {
	s.serving.Store(ok)
	status := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		status = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range []string{"", "geoquota.v1.RateLimiter", "geoquota.v1.Admin", "envoy.service.ratelimit.v3.RateLimitService"} {
		s.health.SetServingStatus(name, status)
	}
}

// adminStatus says whether a presented credential may make admin calls.
type adminStatus int

const (
	adminOK       adminStatus = iota
	adminDisabled             // no token configured: refused
	adminDenied               // missing or wrong token
)

func (s *Server) checkAdmin(authorization string) adminStatus {
	if s.opts.AdminToken == "" {
		return adminDisabled
	}
	if !BearerMatches(authorization, s.opts.AdminToken) {
		return adminDenied
	}
	return adminOK
}

// logKey is an API key as the log shows it.
func (s *Server) logKey(k string) string {
	if s.opts.RedactKeys {
		return regional.RedactKey(k)
	}
	return k
}

// BearerMatches reports whether an Authorization value carries token as
// its bearer token: the scheme in any case (RFC 9110, 11.1), the token
// compared in constant time. An empty token matches nothing.
func BearerMatches(authorization, token string) bool {
	scheme, got, ok := strings.Cut(strings.TrimSpace(authorization), " ")
	return ok && token != "" && strings.EqualFold(scheme, "Bearer") &&
		subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}
