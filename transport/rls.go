package transport

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
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
// the cost, the request's 0 meaning the rule's (1 by default) and the
// descriptor's own 0 a check that counts nothing. The response has one
// status per descriptor, in order, and the rate-limit headers of all of
// them. A fail_closed rule without its store answers OVER_LIMIT: the
// protocol has no way to say 503. As in Envoy's reference service, a
// descriptor no rule knows is OK, limited by nothing, and one whose cost
// is more than a rule that matches it can ever allow is OVER_LIMIT; both
// count nothing. A descriptor whose limit is in quota mode (an
// envoyproxy/ratelimit configuration's quota_mode) is OVER_LIMIT on its
// own, and makes the call OVER_LIMIT only if every such descriptor of the
// call is: Envoy then goes on, and a gateway reads which quotas are left
// from the statuses.

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
	var one [1]regional.Request // most calls carry one descriptor
	var oneAnswer [1]answer
	reqs, answers := one[:], oneAnswer[:]
	if len(in.Descriptors) > 1 {
		reqs, answers = make([]regional.Request, len(in.Descriptors)), make([]answer, len(in.Descriptors))
	}
	rs := s.engine.Rules()
	var placed []*regional.Rule // by descriptor: where a domain's descriptor tree put it
	if rs.Placing(in.Domain) {
		placed = make([]*regional.Rule, len(reqs))
	}
	for i, desc := range in.Descriptors {
		req, err := descriptorRequest(in, desc, rs, placed, i)
		if err == nil {
			err = s.engine.Validate(&req)
		}
		if answers[i] = answerOf(err); answers[i] == check && err != nil {
			// Bad input costs its descriptor, not the call: an error
			// would let Envoy pass every descriptor of it.
			answers[i] = invalid
			s.metrics.envoy.count("", decInvalid)
			continue
		}
		if placed != nil && placed[i] != nil && placed[i].Unlimited() && answers[i] == check {
			answers[i] = unlimitedEntry
		}
		reqs[i] = req
	}
	if len(reqs) > 1 && placed != nil {
		replaceLimits(placed, answers)
	}
	// The response, its statuses and their durations, its headers and
	// the decision's limits in one allocation, for one descriptor.
	type status struct {
		st    rlsv3.RateLimitResponse_DescriptorStatus
		reset durationpb.Duration
	}
	type response struct {
		out     rlsv3.RateLimitResponse
		one     [1]*rlsv3.RateLimitResponse_DescriptorStatus
		st      [1]status
		headers [maxHeaders]*corev3.HeaderValue
		values  [maxHeaders]corev3.HeaderValue
		limits  [4]regional.LimitStatus
	}
	resp := new(response)
	out, sts := &resp.out, resp.st[:]
	out.OverallCode, out.Statuses = rlsv3.RateLimitResponse_OK, resp.one[:]
	if len(reqs) > 1 {
		sts, out.Statuses = make([]status, len(reqs)), make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(reqs))
	}
	// The headers speak for the limits of every descriptor together.
	all := regional.Decision{Allowed: true}
	now := time.Now()
	d := regional.Decision{Limits: resp.limits[:0]}
	// Descriptors whose limit is in quota mode (envoyproxy/ratelimit's
	// quota_mode) answer OVER_LIMIT on their own; the call is OVER_LIMIT
	// for them only if every one of them is. Until then their limits
	// are held out of the headers.
	var quotas, quotasOver int
	var held []regional.LimitStatus
	for i := range reqs {
		st := &sts[i].st
		out.Statuses[i] = st
		quota := placed != nil && placed[i] != nil && placed[i].Quota
		if answers[i] == check {
			start := time.Now()
			err := s.engine.Check(ctx, &reqs[i], &d)
			if answers[i] = answerOf(err); answers[i] == check && err != nil {
				return nil, grpcError(fieldPath(fmt.Sprintf("descriptors[%d]", i), err))
			}
			if err == nil {
				s.metrics.envoy.observe(&d, time.Since(start))
			}
		}
		switch answers[i] {
		case unlimited:
			st.Code = rlsv3.RateLimitResponse_OK
			continue
		case unlimitedEntry:
			// As envoyproxy/ratelimit answers its unlimited entries.
			st.Code, st.LimitRemaining = rlsv3.RateLimitResponse_OK, math.MaxUint32
			continue
		case overLimit, invalid:
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if quota && answers[i] == overLimit {
				quotas, quotasOver = quotas+1, quotasOver+1
				continue
			}
			out.OverallCode, all.Allowed = rlsv3.RateLimitResponse_OVER_LIMIT, false
			continue
		}
		st.Code = rlsv3.RateLimitResponse_OK
		if quota {
			quotas++
		}
		if !d.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if quota {
				quotasOver++
			} else {
				out.OverallCode, all.Allowed = rlsv3.RateLimitResponse_OVER_LIMIT, false
			}
		}
		if l := speaking(&d); l != nil {
			st.CurrentLimit = s.envoyLimits.of(l)
			st.LimitRemaining = uint32(min(max(l.Remaining, 0), math.MaxUint32))
			reset := max(0, l.ResetAt.Sub(now))
			sts[i].reset.Seconds, sts[i].reset.Nanos = int64(reset/time.Second), int32(reset%time.Second)
			st.DurationUntilReset = &sts[i].reset
		}
		if len(reqs) > 1 {
			all.Degraded = all.Degraded || d.Degraded
			if quota && !d.Allowed {
				held = append(held, d.Limits...)
			} else {
				all.Limits = append(all.Limits, d.Limits...)
			}
		}
	}
	if quotas > 0 && quotasOver == quotas {
		out.OverallCode, all.Allowed = rlsv3.RateLimitResponse_OVER_LIMIT, false
		all.Limits = append(all.Limits, held...)
	}
	headersOf := &d // one descriptor: its decision, in the engine's order
	if len(reqs) > 1 {
		// Tightest first, the denying one with the longest wait
		// first when denied.
		slices.SortStableFunc(all.Limits, func(a, b regional.LimitStatus) int { return regional.SpeaksBefore(a, b, all.Allowed) })
		headersOf = &all
	}
	var hbuf [maxHeaders]header
	hs := appendRateLimitHeaders(hbuf[:0], headersOf, now)
	if len(hs) > 0 {
		out.ResponseHeadersToAdd = resp.headers[:len(hs)]
		for i, h := range hs {
			resp.values[i].Key, resp.values[i].Value = h.name, h.value
			out.ResponseHeadersToAdd[i] = &resp.values[i]
		}
	}
	return out, nil
}

// replaceLimits answers OK, counting nothing, each descriptor whose limit
// is replaced by the limit another descriptor of the request meets: the
// replaces of an envoyproxy/ratelimit configuration. placed are the
// limits the descriptors met, answered or not.
func replaceLimits(placed []*regional.Rule, answers []answer) {
	for i, r := range placed {
		if r == nil || r.Name == "" || answers[i] == invalid {
			continue
		}
		for j, o := range placed {
			if j != i && o != nil && answers[j] != invalid && slices.Contains(o.Replaces, r.Name) {
				answers[i] = unlimited
			}
		}
	}
}

// descriptorRequest is the engine's request of the i-th descriptor, placed
// in its domain's descriptor tree by its entries' order when the domain has
// one (placed non-nil).
func descriptorRequest(in *rlsv3.RateLimitRequest, desc *ratelimitv3.RateLimitDescriptor, rs *regional.RuleSet, placed []*regional.Rule, i int) (regional.Request, error) {
	prefix := func() string { return fmt.Sprintf("descriptors[%d]", i) }
	entries := make(map[string]string, len(desc.GetEntries()))
	var keys, values []string
	for j, e := range desc.GetEntries() {
		key := e.GetKey()
		if alias, ok := descriptorAliases[key]; ok {
			key = alias
		}
		if _, dup := entries[key]; dup {
			return regional.Request{}, &FieldError{Field: fmt.Sprintf("%s.entries[%d]", prefix(), j), Msg: "key " + e.GetKey() + " given twice"}
		}
		entries[key] = e.GetValue()
		if placed != nil {
			keys, values = append(keys, key), append(values, e.GetValue())
		}
	}
	if len(entries) == 0 {
		return regional.Request{}, &FieldError{Field: prefix() + ".entries", Msg: "required"}
	}
	cost, nothing := uint64(in.HitsAddend), false
	if h := desc.GetHitsAddend(); h != nil {
		// A descriptor's own 0 is a check that counts nothing, as
		// envoyproxy/ratelimit reads it; the request's 0 is a cost of 1.
		cost, nothing = h.GetValue(), h.GetValue() == 0
	}
	if cost > math.MaxInt32 {
		return regional.Request{}, &FieldError{Field: prefix() + ".hits_addend", Msg: "too large"}
	}
	req, err := requestFrom(in.Domain, entries, int64(cost), "entries")
	req.CountNothing = nothing
	if err == nil && placed != nil {
		placed[i], _ = rs.Place(&req, keys, values)
	}
	return req, err
}

// answer is what the protocol answers a descriptor: the engine's decision,
// or without one (see ShouldRateLimit).
type answer uint8

const (
	check          answer = iota // the engine decides
	unlimited                    // no rule knows it, or its limit is replaced: OK
	overLimit                    // its cost is more than a rule can ever allow
	invalid                      // bad input: OVER_LIMIT, counting nothing
	unlimitedEntry               // an unlimited entry of an envoyproxy/ratelimit tree: OK, MaxUint32 remaining
)

// answerOf is the answer to a descriptor whose request met err in the
// engine: check if err is nil or an error to return.
func answerOf(err error) answer {
	switch {
	case errors.Is(err, regional.ErrUnknownDescriptor):
		return unlimited
	case errors.Is(err, regional.ErrCostAboveLimit):
		return overLimit
	}
	return check
}

// envoyLimits keeps the RateLimit message of each limit as Envoy reads it
// (a rule, its limit and window), made once and shared by every response
// that names it: a response only reads it, as gRPC marshals it.
type envoyLimits struct {
	m sync.Map // envoyLimitKey -> *rlsv3.RateLimitResponse_RateLimit
	n atomic.Int64
}

type envoyLimitKey struct {
	rule   string
	limit  int64
	window time.Duration
}

// maxEnvoyLimits bounds the messages kept; past it they are made anew.
// Rules, tiers and windows are few; reloads may add some.
const maxEnvoyLimits = 4096

// of returns the message of a limit.
func (e *envoyLimits) of(l *regional.LimitStatus) *rlsv3.RateLimitResponse_RateLimit {
	k := envoyLimitKey{l.Rule.ID, l.Limit, l.Window}
	if v, ok := e.m.Load(k); ok {
		return v.(*rlsv3.RateLimitResponse_RateLimit)
	}
	rl := envoyLimit(l)
	if e.n.Load() < maxEnvoyLimits {
		if _, loaded := e.m.LoadOrStore(k, rl); !loaded {
			e.n.Add(1)
		}
	}
	return rl
}

// envoyLimit expresses a limit as Envoy's requests per unit: the unit
// that divides the window, times a multiplier.
func envoyLimit(l *regional.LimitStatus) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: l.Rule.ID, RequestsPerUnit: uint32(min(l.Limit, math.MaxUint32))}
	w := l.Window
	// envoyproxy/ratelimit's own units, as it counts them, first.
	switch w {
	case 7 * 24 * time.Hour:
		rl.Unit = rlsv3.RateLimitResponse_RateLimit_WEEK
		return rl
	case 30 * 24 * time.Hour:
		rl.Unit = rlsv3.RateLimitResponse_RateLimit_MONTH
		return rl
	case 365 * 24 * time.Hour:
		rl.Unit = rlsv3.RateLimitResponse_RateLimit_YEAR
		return rl
	}
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
