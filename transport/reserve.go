package transport

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/geoquota/geoquota/regional"
)

// Reservations over HTTP (docs/api.md): POST /v1/reserve holds an
// estimated cost, /v1/commit charges the actual cost, /v1/release gives
// the estimate back. The engine keeps them in the region's store
// (regional/reserve.go).

// reserveBody is /v1/reserve's body: a check's, with the estimate as its
// cost and how long the reservation holds.
type reserveBody struct {
	checkBody
	TTLSeconds *float64 `json:"ttl_seconds"`
}

func (s *Server) handleReserve(w http.ResponseWriter, r *http.Request) {
	var b reserveBody
	if !s.readJSON(w, r, &b) {
		return
	}
	ttl, err := ttlOf(b.TTLSeconds) // the estimate's cost: the engine's to check
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	req, err := b.request()
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	var d regional.Decision
	start := time.Now()
	res, err := s.engine.Reserve(r.Context(), &req, ttl, &d)
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	s.metrics.http.observe(&d, time.Since(start))
	if res.ID != "" {
		s.opts.Metrics.reservation("reserved")
	} else if !d.Allowed {
		s.opts.Metrics.reservation("denied")
	}
	if !d.Allowed {
		if d.Code == regional.CodeUnavailable {
			setHeaders(w.Header(), rateLimitHeaders(&d, time.Now()))
			writeError(w, http.StatusServiceUnavailable, "RATE_LIMITER_UNAVAILABLE",
				"the rate limiter's store is unavailable: reservations live there, and none was made", nil)
			return
		}
		writeDecision(w, &d, time.Now())
		return
	}
	setHeaders(w.Header(), rateLimitHeaders(&d, time.Now()))
	out := allowedBody(&d) // the reservation (none when no limit applied) and when it ends
	out.held(res)
	writeJSON(w, http.StatusOK, out)
}

// readJSON reads a JSON body into v; it reports false when it answered an
// error.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	err := jsonBody(r)
	var body []byte
	if err == nil {
		body, err = readBody(w, r)
	}
	if err == nil {
		err = decodeJSONBytes(body, v)
	}
	if err != nil {
		s.writeInputError(w, err)
	}
	return err == nil
}

// ttlOf reads ttl_seconds: required, more than 0, at most
// MaxReservationTTL.
func ttlOf(secs *float64) (time.Duration, error) {
	max := regional.MaxReservationTTL
	switch {
	case secs == nil:
		return 0, &FieldError{Field: "ttl_seconds", Msg: "required: how long the reservation holds"}
	case !(*secs > 0) || math.IsInf(*secs, 0) || *secs > max.Seconds():
		return 0, &FieldError{Field: "ttl_seconds", Msg: fmt.Sprintf("%v: must be more than 0 and at most %v", *secs, max.Seconds())}
	case *secs < 1e-6:
		return 0, &FieldError{Field: "ttl_seconds", Msg: "must be at least a microsecond"}
	}
	return time.Duration(*secs * float64(time.Second)), nil
}

// settleBody is /v1/commit's and /v1/release's body.
type settleBody struct {
	Reservation string `json:"reservation"`
	Cost        *int64 `json:"cost"`
}

// settledBody is /v1/commit's 200 answer: what the reservation charged,
// and where the tightest of its limits stands after (none, if the rules
// have changed every limit that held it since).
type settledBody struct {
	Charged   int64  `json:"charged"`
	Rule      string `json:"rule,omitempty"`
	Limit     *int64 `json:"limit,omitempty"`
	Remaining *int64 `json:"remaining,omitempty"`
	Debt      *int64 `json:"debt,omitempty"`
	ResetAt   string `json:"reset_at,omitempty"`
	// Again says the reservation was settled before: this changed
	// nothing.
	Again bool `json:"again,omitempty"`
}

func (s *Server) handleCommit(w http.ResponseWriter, r *http.Request) { s.settle(w, r, true) }

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) { s.settle(w, r, false) }

// settle reads a /v1/commit (commit) or /v1/release body and settles the
// reservation: 200, 404 RESERVATION_NOT_FOUND, or 400 naming the field.
func (s *Server) settle(w http.ResponseWriter, r *http.Request, commit bool) {
	var b settleBody
	if !s.readJSON(w, r, &b) {
		return
	}
	var err error
	actual := int64(-1)
	switch {
	case b.Reservation == "":
		err = &FieldError{Field: "reservation", Msg: "required"}
	case commit && b.Cost == nil:
		err = &FieldError{Field: "cost", Msg: "required: the actual cost (release a reservation that cost nothing)"}
	case commit && *b.Cost <= 0:
		err = &FieldError{Field: "cost", Msg: "must be positive (release a reservation that cost nothing)"}
	case !commit && b.Cost != nil:
		err = &FieldError{Field: "cost", Msg: "a release takes no cost (commit one)"}
	case commit:
		actual = *b.Cost
	}
	if err != nil {
		s.writeInputError(w, err)
		return
	}
	res, err := s.engine.Settle(r.Context(), b.Reservation, actual)
	switch {
	case errors.Is(err, regional.ErrTooManySettlements):
		s.opts.Metrics.reservation("refused")
		writeError(w, http.StatusTooManyRequests, "TOO_MANY_SETTLEMENTS",
			"a counter of this reservation keeps as many settlements of reservations ending this minute as it may; nothing was settled, and the estimate stays taken",
			map[string]any{"field": "reservation"})
		return
	case errors.Is(err, regional.ErrReservationNotFound):
		s.opts.Metrics.reservation("not_found")
		writeError(w, http.StatusNotFound, "RESERVATION_NOT_FOUND", "no such reservation: not made here, or ended (unsettled, it was charged its estimate, or refunded where its rule says on_expiry: refund)",
			map[string]any{"field": "reservation"})
		return
	case err != nil:
		s.writeInputError(w, err)
		return
	}
	s.opts.Metrics.settlement(commit, res.Again)
	if !commit {
		writeJSON(w, http.StatusOK, map[string]any{"released": res.Charged == 0, "charged": res.Charged, "again": res.Again})
		return
	}
	out := settledBody{Charged: res.Charged, Again: res.Again}
	if len(res.Limits) > 0 {
		l := res.Limits[0]
		out.Rule, out.Limit, out.Remaining, out.Debt, out.ResetAt = l.Rule, &l.Limit, &l.Remaining, &l.Debt, rfc3339(l.ResetAt)
	}
	writeJSON(w, http.StatusOK, out)
}
