package transport

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/geoquota/geoquota/regional"
)

// Envoy's RateLimitService v3. Each descriptor of a request is one request
// to the engine, decided on its own, as Envoy's reference service does:
// its entries are the descriptors (remote_address, which Envoy's
// remote_address action sends, is the ip), the request's domain is the
// domain, and hits_addend — the descriptor's own, else the request's — is
// the cost, 0 meaning the rule's (1 by default). The response has one
// status per descriptor, in order, and the rate-limit headers of all of
// them. A fail_closed rule without its store answers OVER_LIMIT: the
// protocol has no way to say 503.

type rlsServer struct {
	*Server
	rlsv3.UnimplementedRateLimitServiceServer
}

// descriptorAliases maps Envoy's descriptor keys to geoquota's.
var descriptorAliases = map[string]string{"remote_address": "ip"}

func (s rlsServer) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if len(in.Descriptors) == 0 || len(in.Descriptors) > maxBatch {
		return nil, grpcError(&FieldError{Field: "descriptors", Msg: fmt.Sprintf("want 1 to %d descriptors, not %d", maxBatch, len(in.Descriptors))})
	}
	reqs := make([]regional.Request, len(in.Descriptors))
	for i, desc := range in.Descriptors {
		prefix := func() string { return fmt.Sprintf("descriptors[%d]", i) }
		entries := make(map[string]string, len(desc.GetEntries()))
		for j, e := range desc.GetEntries() {
			key := e.GetKey()
			if alias, ok := descriptorAliases[key]; ok {
				key = alias
			}
			if _, dup := entries[key]; dup {
				return nil, grpcError(&FieldError{Field: fmt.Sprintf("%s.entries[%d]", prefix(), j), Msg: "key " + e.GetKey() + " given twice"})
			}
			entries[key] = e.GetValue()
		}
		if len(entries) == 0 {
			return nil, grpcError(&FieldError{Field: prefix() + ".entries", Msg: "required"})
		}
		cost := uint64(in.HitsAddend)
		if h := desc.GetHitsAddend(); h != nil {
			cost = h.GetValue()
		}
		if cost > math.MaxInt32 {
			return nil, grpcError(&FieldError{Field: prefix() + ".hits_addend", Msg: "too large"})
		}
		req, err := requestFrom(in.Domain, entries, int64(cost), "entries")
		if err == nil {
			err = s.engine.Validate(&req)
		}
		if err != nil {
			return nil, grpcError(fieldPath(prefix(), renameField(err, "descriptors.", "entries.")))
		}
		reqs[i] = req
	}
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	// The headers speak for the limits of every descriptor together.
	all := regional.Decision{Allowed: true}
	now := time.Now()
	var d regional.Decision
	for i := range reqs {
		start := time.Now()
		if err := s.engine.Check(ctx, &reqs[i], &d); err != nil {
			return nil, grpcError(fieldPath(fmt.Sprintf("descriptors[%d]", i), err))
		}
		s.metrics.envoy.observe(&d, time.Since(start))
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if !d.Allowed {
			st.Code, out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
			all.Allowed = false
		}
		if l := speaking(&d); l != nil {
			st.CurrentLimit = envoyLimit(l)
			st.LimitRemaining = uint32(min(max(l.Remaining, 0), math.MaxUint32))
			st.DurationUntilReset = durationpb.New(max(0, l.ResetAt.Sub(now)))
		}
		out.Statuses = append(out.Statuses, st)
		if len(reqs) > 1 {
			all.Degraded = all.Degraded || d.Degraded
			all.Limits = append(all.Limits, d.Limits...)
		}
	}
	headersOf := &d // one descriptor: its decision, in the engine's order
	if len(reqs) > 1 {
		// Tightest first, the denying one with the longest wait
		// first when denied.
		slices.SortStableFunc(all.Limits, func(a, b regional.LimitStatus) int { return regional.SpeaksBefore(a, b, all.Allowed) })
		headersOf = &all
	}
	for _, h := range rateLimitHeaders(headersOf, now) {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: h.name, Value: h.value})
	}
	return out, nil
}

// envoyLimit expresses a limit as Envoy's requests per unit: the unit
// that divides the window, times a multiplier.
func envoyLimit(l *regional.LimitStatus) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.Rule.ID, RequestsPerUnit: uint32(min(l.Limit, math.MaxUint32))}
	w := l.Window
	for _, u := range []struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if w >= u.d && w%u.d == 0 || u.unit == rlsv3.RateLimitResponse_RateLimit_SECOND {
			rl.Unit = u.unit
			if n := (w + u.d - 1) / u.d; n > 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(n), math.MaxUint32)))
			}
			break
		}
	}
	return rl
}
