package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/geoquota/geoquota/regional"
)

// maxBody bounds the JSON and YAML bodies the HTTP API reads.
const maxBody = 1 << 20

// Handler returns the HTTP side of the server: the JSON API, admin
// endpoints, health, readiness and metrics, and, with ProxyUpstream set,
// the reverse proxy for every other path.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(path string, methods map[string]http.HandlerFunc) {
		allow := slices.Sorted(maps.Keys(methods))
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			h := methods[r.Method]
			if h == nil && r.Method == http.MethodHead {
				h = methods[http.MethodGet]
			}
			if h == nil {
				w.Header().Set("Allow", strings.Join(allow, ", "))
				writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", r.Method+" "+path+": use "+strings.Join(allow, " or "), nil)
				return
			}
			h(w, r)
		})
	}
	route("/v1/check", map[string]http.HandlerFunc{"POST": s.handleCheck})
	route("/v1/report", map[string]http.HandlerFunc{"POST": s.handleReport})
	route("/v1/reserve", map[string]http.HandlerFunc{"POST": s.handleReserve})
	route("/v1/commit", map[string]http.HandlerFunc{"POST": s.handleCommit})
	route("/v1/release", map[string]http.HandlerFunc{"POST": s.handleRelease})
	route("/v1/usage", map[string]http.HandlerFunc{"GET": s.handleUsage})
	route("/v1/admin/reset", map[string]http.HandlerFunc{"POST": s.admin(s.handleReset)})
	route("/v1/admin/grant", map[string]http.HandlerFunc{"POST": s.admin(s.handleGrant)})
	route("/v1/admin/block", map[string]http.HandlerFunc{"POST": s.admin(s.handleBlock)})
	route("/v1/admin/unblock", map[string]http.HandlerFunc{"POST": s.admin(s.handleUnblock)})
	route("/v1/admin/blocks", map[string]http.HandlerFunc{"GET": s.admin(s.handleBlocks)})
	route("/v1/admin/rules", map[string]http.HandlerFunc{"GET": s.admin(s.handleGetRules), "PUT": s.admin(s.handlePutRules)})
	route("/v1/admin/violations", map[string]http.HandlerFunc{"GET": s.admin(s.handleViolations)})
	route("/healthz", map[string]http.HandlerFunc{"GET": func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}})
	route("/readyz", map[string]http.HandlerFunc{"GET": func(w http.ResponseWriter, r *http.Request) {
		if !s.serving.Load() {
			writeError(w, http.StatusServiceUnavailable, "NOT_READY", "not serving (starting or shutting down)", nil)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}})
	route("/metrics", map[string]http.HandlerFunc{"GET": promhttp.HandlerFor(s.opts.Metrics.Registry, promhttp.HandlerOpts{}).ServeHTTP})
	if s.opts.ProxyUpstream != nil {
		mux.Handle("/", s.proxy(s.opts.ProxyUpstream))
	} else {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotFound, "NOT_FOUND", "no such endpoint: "+r.Method+" "+r.URL.Path, nil)
		})
	}
	return mux
}

// errorBody is every error's JSON body.
type errorBody struct {
	Error struct {
		Code    string         `json:"code"`
		Message string         `json:"message"`
		Details map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

// WriteError answers an error as every geoquota HTTP API does:
// {"error":{"code":…,"message":…}} (docs/api.md#errors).
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	writeError(w, status, code, msg, nil)
}

func writeError(w http.ResponseWriter, status int, code, msg string, details map[string]any) {
	var b errorBody
	b.Error.Code, b.Error.Message, b.Error.Details = code, msg, details
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeInputError answers 400 naming the field at fault, or 500 for an
// error that is not about input.
func (s *Server) writeInputError(w http.ResponseWriter, err error) {
	if me := (*mediaTypeError)(nil); errors.As(err, &me) {
		writeError(w, http.StatusUnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE", err.Error(), map[string]any{"field": "Content-Type"})
		return
	}
	if field, ok := invalidField(err); ok {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", err.Error(), map[string]any{"field": field})
		return
	}
	if errors.Is(err, regional.ErrUnknownRule) {
		writeError(w, http.StatusNotFound, "NOT_FOUND", err.Error(), map[string]any{"field": "rule"})
		return
	}
	if errors.Is(err, regional.ErrInvalidRules) {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", err.Error(), map[string]any{"field": "rules"})
		return
	}
	if we := (*regional.WindowExpiredError)(nil); errors.As(err, &we) {
		writeError(w, http.StatusNotFound, "WINDOW_EXPIRED", err.Error(), map[string]any{"field": "window_start",
			"window_start": we.Start.UTC().Format(time.RFC3339Nano), "kept_seconds": ceilSeconds(we.Kept)})
		return
	}
	s.log.Warn("request failed", "error", err)
	writeError(w, http.StatusServiceUnavailable, "RATE_LIMITER_UNAVAILABLE", err.Error(), nil)
}

// mediaTypeError is a body declared as something other than JSON: 415.
type mediaTypeError struct{ contentType string }

func (e *mediaTypeError) Error() string {
	return fmt.Sprintf("Content-Type %q: want application/json", e.contentType)
}

// jsonBody refuses a body declared as something other than JSON. No
// Content-Type, application/json and the +json types are JSON; so is
// application/x-www-form-urlencoded, which is what curl -d declares
// whatever it sends (the README's examples): a form would fail as JSON,
// with a 400 naming the body.
func jsonBody(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "application/x-www-form-urlencoded") {
		return nil
	}
	return &mediaTypeError{ct}
}

// decodeJSON reads a JSON object into v: at most maxBody bytes, no unknown
// fields, nothing after it. Errors name the field they are about.
func decodeJSON(r *http.Request, v any) error {
	if err := jsonBody(r); err != nil {
		return err
	}
	body, err := readBody(nil, r)
	if err != nil {
		return err
	}
	return decodeJSONBytes(body, v)
}

// readBody reads a request's body, at most maxBody bytes; w, if not nil,
// is told to close the connection of a body too large.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return nil, &FieldError{Field: "body", Msg: fmt.Sprintf("unreadable or larger than %d bytes", maxBody)}
	}
	return body, nil
}

func decodeJSONBytes(body []byte, v any) error {
	// JSON is UTF-8 (RFC 8259); the decoder would turn other bytes into
	// U+FFFD, and two different keys into one.
	if !utf8.Valid(body) {
		return &FieldError{Field: "body", Msg: "not valid UTF-8"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			field := te.Field
			if field == "" {
				field = "body"
			}
			return &FieldError{Field: field, Msg: fmt.Sprintf("want a %s, not a JSON %s", te.Type, te.Value)}
		case errors.As(err, &se):
			return &FieldError{Field: "body", Msg: fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, err)}
		case errors.Is(err, io.EOF):
			return &FieldError{Field: "body", Msg: "empty; want a JSON object"}
		}
		if name, ok := cutUnknownField(err.Error()); ok {
			if name == "" {
				name = "body"
			}
			return &FieldError{Field: name, Msg: "unknown field"}
		}
		return &FieldError{Field: "body", Msg: err.Error()}
	}
	if dec.More() {
		return &FieldError{Field: "body", Msg: "more than one JSON value"}
	}
	return nil
}

// cutUnknownField finds the field of encoding/json's unknown-field error.
func cutUnknownField(msg string) (string, bool) {
	const prefix = `json: unknown field "`
	if len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		return msg[len(prefix) : len(msg)-1], true
	}
	return "", false
}

// checkBody is POST /v1/check. Descriptor values are decoded
// one by one, so that a value of the wrong type is named.
type checkBody struct {
	Domain      string                     `json:"domain"`
	Descriptors map[string]json.RawMessage `json:"descriptors"`
	Cost        *int64                     `json:"cost"`
}

// stringValues decodes a map of JSON values that must all be strings.
func stringValues(raw map[string]json.RawMessage, prefix string) (map[string]string, error) {
	out := make(map[string]string, len(raw))
	for name, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, &FieldError{Field: prefix + "." + name, Msg: "want a string, not " + string(v)}
		}
		out[name] = s
	}
	return out, nil
}

// parseCheck decodes and checks a /v1/check body.
func parseCheck(body []byte) (regional.Request, error) {
	var b checkBody
	if err := decodeJSONBytes(body, &b); err != nil {
		return regional.Request{}, err
	}
	return b.request()
}

// request is the request a check's body asks about.
func (b *checkBody) request() (regional.Request, error) {
	if b.Cost != nil && *b.Cost <= 0 {
		return regional.Request{}, &FieldError{Field: "cost", Msg: "must be positive"}
	}
	var cost int64
	if b.Cost != nil {
		cost = *b.Cost
	}
	if len(b.Descriptors) == 0 {
		return regional.Request{}, &FieldError{Field: "descriptors", Msg: "required"}
	}
	descriptors, err := stringValues(b.Descriptors, "descriptors")
	if err != nil {
		return regional.Request{}, err
	}
	return requestFrom(b.Domain, descriptors, cost, "descriptors")
}

// decisionBody is the 200 answer of /v1/check, with every limit
// that applied added.
type decisionBody struct {
	Allowed           bool        `json:"allowed"`
	Rule              string      `json:"rule,omitempty"`
	Limit             *int64      `json:"limit,omitempty"`
	Remaining         *int64      `json:"remaining,omitempty"`
	ResetAt           string      `json:"reset_at,omitempty"`
	RetryAfterSeconds int64       `json:"retry_after_seconds"`
	Degraded          bool        `json:"degraded"`
	Limits            []limitBody `json:"limits,omitempty"`
	// Reservation is what the request holds until it is released or
	// committed (/v1/release, /v1/commit): a reservation's estimate, or a
	// check's slots in concurrency limits; ExpiresAt, when it frees itself.
	Reservation string `json:"reservation,omitempty"`
	ExpiresAt   string `json:"expires_at,omitempty"`
}

type limitBody struct {
	Rule          string `json:"rule"`
	Allowed       bool   `json:"allowed"`
	Shadow        bool   `json:"shadow,omitempty"`
	Limit         int64  `json:"limit"`
	Remaining     int64  `json:"remaining"`
	WindowSeconds int64  `json:"window_seconds"`
	ResetAt       string `json:"reset_at"`
}

// rfc3339 writes a time in whole seconds, rounded up as X-RateLimit-Reset
// is: a reset a moment before a window's end, as the store's clock turns
// into this replica's, is the window's end.
func rfc3339(t time.Time) string {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		t = s.Add(time.Second)
	}
	return t.UTC().Format(time.RFC3339)
}

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	var d regional.Decision
	if s.decide(w, r, &d, false) {
		writeDecision(w, &d, time.Now())
	}
}

// decide reads a /v1/check body (or /v1/report's, whose cost is required)
// and decides it into d; it reports false when it answered an error.
func (s *Server) decide(w http.ResponseWriter, r *http.Request, d *regional.Decision, report bool) bool {
	var b checkBody
	if !s.readJSON(w, r, &b) {
		return false
	}
	req, err := b.request()
	req.Report = report
	if err == nil && report && req.Cost == 0 {
		err = errCostRequired()
	}
	if err != nil {
		s.writeInputError(w, err)
		return false
	}
	start := time.Now()
	if err := s.engine.Check(r.Context(), &req, d); err != nil {
		s.writeInputError(w, err)
		return false
	}
	s.metrics.http.observe(d, time.Since(start))
	return true
}

// reportBody is the 200 answer of /v1/report: what the limit that speaks
// for the report counted of it (a rule with count_over_limit first), and
// where that limit stands after.
type reportBody struct {
	Charged   int64  `json:"charged"`
	Allowed   bool   `json:"allowed"`
	Rule      string `json:"rule,omitempty"`
	Limit     *int64 `json:"limit,omitempty"`
	Remaining *int64 `json:"remaining,omitempty"`
	Debt      *int64 `json:"debt,omitempty"`
	ResetAt   string `json:"reset_at,omitempty"`
}

// handleReport is POST /v1/report: usage known after the response (a
// cost such as tokens), counted as a check of that cost is, and by a rule
// with count_over_limit past its limit, as debt. Its answer is 200
// whether the report went past the limit or not (the rate-limit headers
// say where the key stands); 403, 429 and 503 as a check's for a blocked
// key, a key over its rule's cap and a store that cannot answer.
func (s *Server) handleReport(w http.ResponseWriter, r *http.Request) {
	var d regional.Decision
	if !s.decide(w, r, &d, true) {
		return
	}
	if !d.Allowed && d.Code != regional.CodeOverLimit {
		writeDecision(w, &d, time.Now())
		return
	}
	setHeaders(w.Header(), rateLimitHeaders(&d, time.Now()))
	b := reportBody{Allowed: d.Allowed}
	l := speaking(&d)
	for i := range d.Limits {
		if x := &d.Limits[i]; x.Rule.CountOverLimit && !x.Shadow {
			l = x
			break
		}
	}
	if l != nil {
		b.Charged, b.Rule, b.Limit, b.Remaining, b.Debt = l.Charged, l.Rule.ID, &l.Limit, &l.Remaining, &l.Debt
		b.ResetAt = rfc3339(l.ResetAt)
	}
	writeJSON(w, http.StatusOK, b)
}

// allowedBody is the body of an allowed decision.
func allowedBody(d *regional.Decision) decisionBody {
	b := decisionBody{Allowed: true, Degraded: d.Degraded}
	if l := speaking(d); l != nil {
		b.Rule, b.Limit, b.Remaining, b.ResetAt = l.Rule.ID, &l.Limit, &l.Remaining, rfc3339(l.ResetAt)
	}
	for i := range d.Limits {
		x := &d.Limits[i]
		b.Limits = append(b.Limits, limitBody{Rule: x.Rule.ID, Allowed: x.Allowed, Shadow: x.Shadow, Limit: x.Limit,
			Remaining: x.Remaining, WindowSeconds: ceilSeconds(x.Window), ResetAt: rfc3339(x.ResetAt)})
	}
	b.held(d.Held)
	return b
}

// held sets what the request holds.
func (b *decisionBody) held(r regional.Reserved) {
	if r.ID != "" {
		b.Reservation, b.ExpiresAt = r.ID, r.Expires.UTC().Format(time.RFC3339Nano)
	}
}

// writeDecision answers with a decision: 200 and its body when allowed;
// 429, 403 or 503 with an error body otherwise; the rate-limit headers
// always.
func writeDecision(w http.ResponseWriter, d *regional.Decision, now time.Time) {
	setHeaders(w.Header(), rateLimitHeaders(d, now))
	l := speaking(d)
	if d.Allowed {
		writeJSON(w, http.StatusOK, allowedBody(d))
		return
	}
	switch d.Code {
	case regional.CodeBlocked:
		writeError(w, http.StatusForbidden, "KEY_BLOCKED", "the API key is blocked", nil)
	case regional.CodeKeyLimit:
		for i := range d.Limits {
			if d.Limits[i].KeyRefused {
				l = &d.Limits[i] // the limit that refused the key, not another over its limit
				break
			}
		}
		retry := max(1, ceilSeconds(l.RetryAfter))
		writeError(w, http.StatusTooManyRequests, "KEY_LIMIT",
			fmt.Sprintf("rule %q tracks its maximum of %d keys and this key is not among them; retry in %ds", l.Rule.ID, l.Rule.MaxKeys, retry),
			map[string]any{"rule": l.Rule.ID, "max_keys": l.Rule.MaxKeys, "retry_after_seconds": retry})
	case regional.CodeUnavailable:
		details := map[string]any{}
		if l != nil {
			details["rule"] = l.Rule.ID
			details["retry_after_seconds"] = max(1, ceilSeconds(l.RetryAfter))
		}
		writeError(w, http.StatusServiceUnavailable, "RATE_LIMITER_UNAVAILABLE",
			"the rate limiter's store is unavailable and this rule fails closed", details)
	default:
		retry := max(1, ceilSeconds(l.RetryAfter))
		scope := ""
		if l.Rule.Scope == regional.ScopeGlobal {
			// The region may have spent its share while the limit has room
			// elsewhere: say whose limit it is.
			scope = " worldwide, of which this region admits its share"
		}
		msg := fmt.Sprintf("rate limit of rule %q exceeded: %d per %ds%s; retry in %ds", l.Rule.ID, l.Limit, ceilSeconds(l.Window), scope, retry)
		if l.Rule.Base.Algorithm == regional.Concurrency {
			msg = fmt.Sprintf("concurrency limit of rule %q reached: %d requests in flight at once; retry in %ds", l.Rule.ID, l.Limit, retry)
		}
		writeError(w, http.StatusTooManyRequests, "RATE_LIMIT_EXCEEDED", msg,
			map[string]any{"rule": l.Rule.ID, "limit": l.Limit, "window_seconds": ceilSeconds(l.Window),
				"retry_after_seconds": retry, "reset_at": rfc3339(l.ResetAt)})
	}
}

// usageBody is GET /v1/usage.
type usageBody struct {
	Rule          string       `json:"rule"`
	Key           string       `json:"key"`
	Algorithm     string       `json:"algorithm"`
	WindowStart   string       `json:"window_start,omitempty"`
	WindowSeconds int64        `json:"window_seconds"`
	Limit         int64        `json:"limit"`
	Remaining     int64        `json:"remaining"`
	Used          int64        `json:"used"`
	Debt          int64        `json:"debt,omitempty"`
	ResetAt       string       `json:"reset_at"`
	GlobalUsed    int64        `json:"global_used"`
	Regions       []regionBody `json:"regions"`
}

// regionBody is a region's part of a global counter. Share is null when
// no budget is known, LastHeardMS when the region was never heard from.
type regionBody struct {
	Region      string   `json:"region"`
	Used        int64    `json:"used"`
	Share       *float64 `json:"share"`
	LastHeardMS *int64   `json:"last_heard_ms"`
	Stale       bool     `json:"stale"`
}

// queryRequest reads rule and descriptors from a query string: rule=,
// domain= and window_start= are themselves, every other parameter a
// descriptor.
func queryRequest(r *http.Request) (string, regional.Request, error) {
	q := r.URL.Query()
	descriptors := map[string]string{}
	for name, values := range q {
		if name == "rule" || name == "domain" || name == "window_start" {
			continue
		}
		if len(values) != 1 {
			return "", regional.Request{}, &FieldError{Field: name, Msg: "given more than once"}
		}
		descriptors[name] = values[0]
	}
	rule := q.Get("rule")
	if rule == "" {
		return "", regional.Request{}, &FieldError{Field: "rule", Msg: "required"}
	}
	req, err := requestFrom(q.Get("domain"), descriptors, 0, "descriptors")
	return rule, req, err
}

func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	rule, req, err := queryRequest(r)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	var u regional.Usage
	if at := r.URL.Query().Get("window_start"); at != "" {
		t, perr := time.Parse(time.RFC3339, at)
		if perr != nil {
			s.writeInputError(w, &FieldError{Field: "window_start", Msg: fmt.Sprintf("%q: want an RFC 3339 time, such as 2026-01-01T00:00:00Z", at)})
			return
		}
		u, err = s.engine.UsageAt(r.Context(), rule, &req, t)
	} else {
		u, err = s.engine.Usage(r.Context(), rule, &req)
	}
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.usageBody(rule, u))
}

func (s *Server) usageBody(rule string, u regional.Usage) usageBody {
	used := u.Limit - u.Remaining + u.Debt
	b := usageBody{Rule: rule, Key: u.Key, Algorithm: u.Algorithm.String(), WindowSeconds: ceilSeconds(u.Window),
		Limit: u.Limit, Remaining: u.Remaining, Used: used, Debt: u.Debt, ResetAt: rfc3339(u.ResetAt), GlobalUsed: used,
		Regions: []regionBody{{Region: s.opts.Region, Used: used, Share: proto.Float64(1), LastHeardMS: proto.Int64(0)}}}
	if !u.WindowStart.IsZero() {
		// A window's start exactly (whole seconds for windows of whole
		// seconds), as window_start= takes it back.
		b.WindowStart = u.WindowStart.UTC().Format(time.RFC3339Nano)
	}
	if u.Global {
		b.GlobalUsed, b.Regions = u.GlobalUsed, b.Regions[:0]
		for _, r := range u.Regions {
			rb := regionBody{Region: r.Region, Used: r.Used}
			if r.Share >= 0 {
				rb.Share = proto.Float64(math.Round(r.Share*1e6) / 1e6) // 0.95, not 0.9499999991
			}
			if r.Region == s.opts.Region {
				b.Used, rb.LastHeardMS = r.Used, proto.Int64(0)
			} else if at, ok := s.engine.LastHeard(r.Region); ok {
				rb.LastHeardMS = proto.Int64(time.Since(at).Milliseconds())
				rb.Stale = time.Since(at) > s.engine.StaleAfter()
			} else {
				rb.Stale = true // never heard: no last_heard_ms
			}
			b.Regions = append(b.Regions, rb)
		}
	}
	return b
}

// admin guards an admin endpoint with the bearer token.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch s.checkAdmin(r.Header.Get("Authorization")) {
		case adminDisabled:
			writeError(w, http.StatusForbidden, "PERMISSION_DENIED", "admin calls are disabled: start regiond with --admin-token", nil)
		case adminDenied:
			w.Header().Set("WWW-Authenticate", `Bearer realm="geoquota"`)
			writeError(w, http.StatusUnauthorized, "UNAUTHENTICATED", "admin calls need Authorization: Bearer <admin token>", nil)
		default:
			h(w, r)
		}
	}
}

// counterBody names a counter in admin calls.
type counterBody struct {
	Rule        string                     `json:"rule"`
	Domain      string                     `json:"domain"`
	Descriptors map[string]json.RawMessage `json:"descriptors"`
	Amount      int64                      `json:"amount"`
}

func (s *Server) readCounter(r *http.Request) (counterBody, regional.Request, error) {
	var b counterBody
	if err := decodeJSON(r, &b); err != nil {
		return b, regional.Request{}, err
	}
	if b.Rule == "" {
		return b, regional.Request{}, &FieldError{Field: "rule", Msg: "required"}
	}
	descriptors, err := stringValues(b.Descriptors, "descriptors")
	if err != nil {
		return b, regional.Request{}, err
	}
	req, err := requestFrom(b.Domain, descriptors, 0, "descriptors")
	return b, req, err
}

func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	b, req, err := s.readCounter(r)
	if err == nil {
		err = s.engine.Reset(r.Context(), b.Rule, &req)
	}
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	s.log.Info("counter reset", "rule", b.Rule, "api_key", s.logKey(req.APIKey))
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (s *Server) handleGrant(w http.ResponseWriter, r *http.Request) {
	b, req, err := s.readCounter(r)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	st, err := s.engine.Grant(r.Context(), b.Rule, &req, b.Amount)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	s.log.Info("quota granted", "rule", b.Rule, "api_key", s.logKey(req.APIKey), "amount", b.Amount)
	writeJSON(w, http.StatusOK, limitBody{Rule: b.Rule, Allowed: true, Limit: st.Limit, Remaining: st.Remaining,
		WindowSeconds: ceilSeconds(st.Window), ResetAt: rfc3339(st.ResetAt)})
}

// blockBody is a runtime block: until is RFC 3339, or ttl_seconds from
// now; neither means until unblocked.
type blockBody struct {
	Pattern    string `json:"pattern"`
	Until      string `json:"until,omitempty"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty"`
}

func (s *Server) handleBlock(w http.ResponseWriter, r *http.Request) {
	var b blockBody
	if err := decodeJSON(r, &b); err != nil {
		s.writeInputError(w, err)
		return
	}
	blk := regional.Block{Pattern: b.Pattern}
	switch {
	case b.Until != "" && b.TTLSeconds != 0:
		s.writeInputError(w, &FieldError{Field: "until", Msg: "give until or ttl_seconds, not both"})
		return
	case b.Until != "":
		t, err := time.Parse(time.RFC3339, b.Until)
		if err != nil {
			s.writeInputError(w, &FieldError{Field: "until", Msg: "want an RFC 3339 time"})
			return
		}
		blk.Until = t
	case b.TTLSeconds < 0:
		s.writeInputError(w, &FieldError{Field: "ttl_seconds", Msg: "must be positive"})
		return
	case b.TTLSeconds > 0:
		blk.Until = time.Now().Add(time.Duration(b.TTLSeconds) * time.Second)
	}
	if err := s.engine.Block(r.Context(), blk); err != nil {
		s.writeInputError(w, err)
		return
	}
	s.log.Info("key pattern blocked", "pattern", s.logKey(b.Pattern), "until", blk.Until)
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (s *Server) handleUnblock(w http.ResponseWriter, r *http.Request) {
	var b blockBody
	if err := decodeJSON(r, &b); err != nil {
		s.writeInputError(w, err)
		return
	}
	if b.Pattern == "" {
		s.writeInputError(w, &FieldError{Field: "pattern", Msg: "required"})
		return
	}
	if err := s.engine.Unblock(r.Context(), b.Pattern); err != nil {
		s.writeInputError(w, err)
		return
	}
	s.log.Info("key pattern unblocked", "pattern", s.logKey(b.Pattern))
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (s *Server) handleBlocks(w http.ResponseWriter, r *http.Request) {
	out := []blockBody{}
	for _, b := range s.engine.Blocks() {
		bb := blockBody{Pattern: b.Pattern}
		if !b.Until.IsZero() {
			bb.Until = rfc3339(b.Until)
		}
		out = append(out, bb)
	}
	writeJSON(w, http.StatusOK, map[string]any{"blocks": out})
}

func (s *Server) handleGetRules(w http.ResponseWriter, r *http.Request) {
	rs := s.engine.Rules()
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("X-Geoquota-Rules-Source", rs.Source)
	w.Write(rs.YAML())
}

func (s *Server) handlePutRules(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	rs, err := s.putRules(body)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	out := map[string]any{"rules": len(rs.Rules())}
	if ws := rs.Warnings(); ws != nil {
		out["warnings"] = ws
	}
	writeJSON(w, http.StatusOK, out)
}

// putRules puts rules given through an admin call in force. Invalid rules,
// or rules with warnings when StrictRules, change nothing and count as a
// rejected reload.
func (s *Server) putRules(yaml []byte) (*regional.RuleSet, error) {
	rs, err := regional.Parse("admin", yaml)
	if err == nil && s.opts.StrictRules {
		err = rs.Strict()
	}
	if err != nil {
		s.engine.Stats().RuleReloadErrors.Add(1)
		return nil, err
	}
	s.engine.SetRules(rs)
	s.log.Info("rules put in force by an admin call", "rules", len(rs.Rules()), "warnings", len(rs.Warnings()))
	for _, w := range rs.Warnings() {
		s.log.Warn("rules: read and not enforced", "warning", w)
	}
	return rs, nil
}

func (s *Server) handleViolations(w http.ResponseWriter, r *http.Request) {
	n := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 10_000 {
			s.writeInputError(w, &FieldError{Field: "limit", Msg: "want 1 to 10000"})
			return
		}
	}
	vs, err := s.recentViolations(r.Context(), n)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	body := make([]violationBody, len(vs))
	for i, v := range vs {
		body[i] = violationBody{ID: v.ID, Time: v.Time.UTC().Format(time.RFC3339Nano), Region: v.Region, Rule: v.Rule,
			Key: v.Key, Code: v.Code, APIKey: v.APIKey, IP: v.IP, Endpoint: v.Endpoint, Limit: v.Limit, Cost: v.Cost,
			RetryAfterMS: v.RetryAfter.Milliseconds(), Count: v.Count}
	}
	writeJSON(w, http.StatusOK, map[string]any{"violations": body})
}

// violationBody is a violation as the API speaks: gRPC's Violation, with
// the time in RFC 3339.
type violationBody struct {
	ID           string `json:"id"`
	Time         string `json:"time"`
	Region       string `json:"region"`
	Rule         string `json:"rule"`
	Key          string `json:"key"`
	Code         string `json:"code"`
	APIKey       string `json:"api_key"`
	IP           string `json:"ip"`
	Endpoint     string `json:"endpoint"`
	Limit        int64  `json:"limit"`
	Cost         int64  `json:"cost"`
	RetryAfterMS int64  `json:"retry_after_ms"`
	Count        int64  `json:"count"`
}

func (s *Server) recentViolations(ctx context.Context, n int) ([]regional.Violation, error) {
	if s.opts.Violations == nil {
		return []regional.Violation{}, nil
	}
	return s.opts.Violations.Recent(ctx, n)
}
