package transport

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/geoquota/geoquota/regional"
)

// MiddlewareOptions configure Middleware.
type MiddlewareOptions struct {
	// Request builds the engine request from an HTTP request; nil means
	// DefaultRequest.
	Request func(*http.Request) regional.Request
	// Metrics records decisions under the API label "middleware" (or
	// API); nil means none.
	Metrics *Metrics
	API     string
}

// DefaultRequest describes an HTTP request the way regiond's reverse proxy
// does: the API key from X-API-Key, else from Authorization: Bearer; the
// client IP from the connection; endpoint and method from the request.
func DefaultRequest(r *http.Request) regional.Request { return describe(r, nil) }

// RequestBehind is DefaultRequest behind proxies of the trusted ranges (a
// load balancer, a CDN): when the connection comes from one of them, the
// client IP is the last address of X-Forwarded-For that is not, read from
// the right, as each proxy appends the address it heard from.
func RequestBehind(trusted []netip.Prefix) func(*http.Request) regional.Request {
	return func(r *http.Request) regional.Request { return describe(r, trusted) }
}

func describe(r *http.Request, trusted []netip.Prefix) regional.Request {
	req := regional.Request{Endpoint: r.URL.Path, Method: r.Method}
	if k := r.Header.Get("X-API-Key"); k != "" {
		req.APIKey = k
	} else if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		req.APIKey = strings.TrimSpace(tok) // the scheme in any case, as RFC 9110 has it
	}
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.IP = host
	}
	if len(trusted) > 0 {
		req.IP = clientIP(req.IP, r.Header.Values("X-Forwarded-For"), trusted)
	}
	return req
}

// trustedPeer reports whether the address is in one of the ranges.
func trustedPeer(addr string, trusted []netip.Prefix) bool {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientIP walks back from the connection's address through the
// X-Forwarded-For hops while they are trusted proxies, and returns the
// first that is not (or the last trusted one, if all are). A hop that is
// not an address ends the walk at the one before it: nothing further left
// can be believed.
func clientIP(peer string, forwarded []string, trusted []netip.Prefix) string {
	ip := peer
	for i := len(forwarded) - 1; i >= 0 && trustedPeer(ip, trusted); i-- {
		hops := strings.Split(forwarded[i], ",")
		for j := len(hops) - 1; j >= 0 && trustedPeer(ip, trusted); j-- {
			hop := strings.TrimSpace(hops[j])
			if _, err := netip.ParseAddr(hop); err != nil {
				return ip
			}
			ip = hop
		}
	}
	return ip
}

// Middleware checks every request against the engine before next sees it.
// A request allowed goes on with the rate-limit headers set on its
// response, and the slots it takes in concurrency limits are released
// when next returns (the response written, or its client gone); one denied gets 429 (or 403 for a blocked key, 503 when a
// fail_closed rule cannot reach its store) with the JSON error body of the
// HTTP API; a malformed one gets 400.
func Middleware(e *regional.Engine, opts MiddlewareOptions) func(http.Handler) http.Handler {
	describe := opts.Request
	if describe == nil {
		describe = DefaultRequest
	}
	api := opts.API
	if api == "" {
		api = "middleware"
	}
	var metrics *apiMetrics
	if opts.Metrics != nil {
		m := opts.Metrics.forAPI(api)
		metrics = &m
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req := describe(r)
			start := time.Now()
			var d regional.Decision
			if err := e.Check(r.Context(), &req, &d); err != nil {
				field, _ := invalidField(err)
				writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", err.Error(), map[string]any{"field": field})
				return
			}
			if metrics != nil {
				metrics.observe(&d, time.Since(start))
			}
			if !d.Allowed {
				writeDecision(w, &d, time.Now())
				return
			}
			setHeaders(w.Header(), rateLimitHeaders(&d, time.Now()))
			if d.Held.ID != "" {
				// Over when next returns: answered, streamed to its end, or
				// its client gone.
				defer releaseHeld(e, opts.Metrics, r, d.Held.ID)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// releaseTimeout bounds a release at the end of a request: the slots free
// themselves at their ttl if the store cannot be told sooner.
const releaseTimeout = 2 * time.Second

// releaseHeld frees the slots in concurrency limits a request held, once
// it is over, whether or not its client is still there.
func releaseHeld(e *regional.Engine, m *Metrics, r *http.Request, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
	defer cancel()
	st, err := e.Settle(ctx, id, -1)
	switch {
	case m == nil:
	case err == nil:
		m.settlement(false, st.Again)
	case errors.Is(err, regional.ErrReservationNotFound):
		m.reservation("not_found") // its slots freed themselves already
	default:
		m.reservation("refused")
	}
}

// proxy is the reverse proxy of --proxy-upstream: every request checked,
// the allowed ones forwarded, the rate-limit headers on the upstream's
// response.
func (s *Server) proxy(upstream *url.URL) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			if host, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil && trustedPeer(host, s.opts.TrustedProxies) {
				// A trusted proxy's chain goes on, this hop appended.
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Warn("upstream failed", "upstream", upstream.String(), "error", err)
			writeError(w, http.StatusBadGateway, "UPSTREAM_UNAVAILABLE", "the upstream did not answer", nil)
		},
	}
	if !s.engine.Rules().AppliesWithoutKey() {
		// Such requests are still counted: geoquota_checks_total's
		// decision="unlimited".
		s.log.Warn("requests without an API key (X-API-Key or Authorization: Bearer) go through unlimited: no rule applies to a request carrying only its endpoint, method and IP address; add one (by: [ip], say) to limit them")
	}
	mo := MiddlewareOptions{Metrics: s.opts.Metrics, API: "proxy"}
	if len(s.opts.TrustedProxies) > 0 {
		mo.Request = RequestBehind(s.opts.TrustedProxies)
	}
	return Middleware(s.engine, mo)(rp)
}
