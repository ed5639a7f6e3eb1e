package transport

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/regional"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

// maxBatch bounds the requests of one Check call.
const maxBatch = 1000

// RegisterGRPC registers, on g, geoquota.v1 (RateLimiter and Admin),
// Envoy's RateLimitService v3, the standard health service and reflection.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	pb.RegisterRateLimiterServer(g, rateLimiter{Server: s})
	pb.RegisterAdminServer(g, adminServer{Server: s})
	rlsv3.RegisterRateLimitServiceServer(g, rlsServer{Server: s})
	healthpb.RegisterHealthServer(g, s.health)
	reflection.Register(g)
}

// grpcError turns an error into a gRPC status: InvalidArgument naming the
// field (with a BadRequest detail) for bad input, NotFound for an unknown
// rule, Unavailable otherwise.
func grpcError(err error) error {
	if field, ok := invalidField(err); ok {
		st := status.New(codes.InvalidArgument, err.Error())
		if d, derr := st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: field, Description: err.Error()}}}); derr == nil {
			st = d
		}
		return st.Err()
	}
	switch {
	case errors.Is(err, regional.ErrUnknownRule):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, regional.ErrInvalidRules):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, regional.ErrWindowExpired):
		st := status.New(codes.NotFound, err.Error())
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: "WINDOW_EXPIRED", Domain: "geoquota"}); derr == nil {
			st = d
		}
		return st.Err()
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

type rateLimiter struct {
	*Server
	pb.UnimplementedRateLimiterServer
}

func (s rateLimiter) Check(ctx context.Context, in *pb.CheckRequest) (*pb.CheckResponse, error) {
	return s.check(ctx, in, false)
}

// Report is Check of usage known after the response: every request names
// its cost.
func (s rateLimiter) Report(ctx context.Context, in *pb.CheckRequest) (*pb.CheckResponse, error) {
	return s.check(ctx, in, true)
}

func (s rateLimiter) check(ctx context.Context, in *pb.CheckRequest, report bool) (*pb.CheckResponse, error) {
	if len(in.Requests) == 0 || len(in.Requests) > maxBatch {
		return nil, grpcError(&FieldError{Field: "requests", Msg: fmt.Sprintf("want 1 to %d requests, not %d", maxBatch, len(in.Requests))})
	}
	// Check the whole batch first: a malformed request counts nothing.
	reqs := make([]regional.Request, len(in.Requests))
	for i, r := range in.Requests {
		req, err := requestFrom(r.Domain, r.Descriptors, r.Cost, "descriptors")
		req.CountNothing, req.Report = r.CountNothing, report
		switch {
		case err != nil:
		case report && r.CountNothing:
			err = &FieldError{Field: "count_nothing", Msg: "a report counts its cost"}
		case report && r.Cost == 0:
			err = errCostRequired()
		}
		if err == nil {
			err = s.engine.Validate(&req)
		}
		if err != nil {
			return nil, grpcError(fieldPath(fmt.Sprintf("requests[%d]", i), err))
		}
		reqs[i] = req
	}
	out := &pb.CheckResponse{Decisions: make([]*pb.Decision, len(reqs))}
	var d regional.Decision
	deadline, bounded := ctx.Deadline()
	var slowest time.Duration
	for i := range reqs {
		if i > 0 && bounded && time.Until(deadline) < 2*slowest+batchMargin {
			// Too little time left to count another request (twice the
			// slowest so far) and still answer before the caller gives
			// up: the rest count nothing, and say so, so that what was
			// counted is answered. The first is always checked.
			for j := i; j < len(reqs); j++ {
				out.Decisions[j] = &pb.Decision{Code: pb.Code_RATE_LIMITER_UNAVAILABLE, NotCounted: true}
			}
			s.metrics.grpc.uncounted(len(reqs) - i)
			break
		}
		start := time.Now()
		if err := s.engine.Check(ctx, &reqs[i], &d); err != nil {
			return nil, grpcError(fieldPath(fmt.Sprintf("requests[%d]", i), err))
		}
		took := time.Since(start)
		slowest = max(slowest, took)
		s.metrics.grpc.observe(&d, took)
		out.Decisions[i] = decisionProto(&d)
	}
	return out, nil
}

// Reserve implements RateLimiter.Reserve.
func (s rateLimiter) Reserve(ctx context.Context, in *pb.ReserveRequest) (*pb.ReserveResponse, error) {
	if in.Request == nil {
		return nil, grpcError(&FieldError{Field: "request", Msg: "required"})
	}
	req, err := requestFrom(in.Request.Domain, in.Request.Descriptors, in.Request.Cost, "request.descriptors")
	req.CountNothing = in.Request.CountNothing // refused by the engine: an estimate counts
	if err == nil && (in.TtlMs <= 0 || in.TtlMs > regional.MaxReservationTTL.Milliseconds()) {
		err = &FieldError{Field: "ttl_ms", Msg: fmt.Sprintf("%d: must be more than 0 and at most %d", in.TtlMs, regional.MaxReservationTTL.Milliseconds())}
	}
	if err != nil {
		return nil, grpcError(err)
	}
	var d regional.Decision
	start := time.Now()
	res, err := s.engine.Reserve(ctx, &req, time.Duration(in.TtlMs)*time.Millisecond, &d)
	if err != nil {
		return nil, grpcError(renameField(err, "cost", "request.cost"))
	}
	s.metrics.grpc.observe(&d, time.Since(start))
	if res.ID != "" {
		s.opts.Metrics.reservation("reserved")
	} else if !d.Allowed {
		s.opts.Metrics.reservation("denied")
	}
	out := &pb.ReserveResponse{Decision: decisionProto(&d), Reservation: res.ID}
	if res.ID != "" {
		out.ExpiresAtUnixMs = res.Expires.UnixMilli()
	}
	return out, nil
}

// Commit implements RateLimiter.Commit.
func (s rateLimiter) Commit(ctx context.Context, in *pb.SettleRequest) (*pb.SettleResponse, error) {
	if in.Cost <= 0 {
		return nil, grpcError(&FieldError{Field: "cost", Msg: "must be positive (release a reservation that cost nothing)"})
	}
	return s.settle(ctx, in.Reservation, in.Cost)
}

// Release implements RateLimiter.Release.
func (s rateLimiter) Release(ctx context.Context, in *pb.SettleRequest) (*pb.SettleResponse, error) {
	if in.Cost != 0 {
		return nil, grpcError(&FieldError{Field: "cost", Msg: "a release takes no cost (commit one)"})
	}
	return s.settle(ctx, in.Reservation, -1)
}

func (s rateLimiter) settle(ctx context.Context, id string, actual int64) (*pb.SettleResponse, error) {
	if id == "" {
		return nil, grpcError(&FieldError{Field: "reservation", Msg: "required"})
	}
	res, err := s.engine.Settle(ctx, id, actual)
	if errors.Is(err, regional.ErrTooManySettlements) {
		s.opts.Metrics.reservation("refused")
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	if errors.Is(err, regional.ErrReservationNotFound) {
		s.opts.Metrics.reservation("not_found")
		return nil, status.Error(codes.NotFound, err.Error())
	}
	if err != nil {
		return nil, grpcError(err)
	}
	s.opts.Metrics.settlement(actual >= 0, res.Again)
	out := &pb.SettleResponse{Charged: res.Charged, Again: res.Again}
	for _, l := range res.Limits {
		out.Limits = append(out.Limits, &pb.LimitStatus{Rule: l.Rule, Allowed: l.Debt == 0 && l.Remaining > 0, Limit: l.Limit,
			Remaining: l.Remaining, Debt: l.Debt, ResetAtUnixMs: l.ResetAt.UnixMilli()})
	}
	return out, nil
}

// batchMargin is what a batch keeps, beyond twice its slowest check, to
// send its answer before the caller's deadline.
const batchMargin = 5 * time.Millisecond

func decisionProto(d *regional.Decision) *pb.Decision {
	out := &pb.Decision{Allowed: d.Allowed, Degraded: d.Degraded, Bypassed: d.Bypassed,
		Code: [...]pb.Code{pb.Code_OK, pb.Code_RATE_LIMIT_EXCEEDED, pb.Code_KEY_BLOCKED, pb.Code_RATE_LIMITER_UNAVAILABLE, pb.Code_KEY_LIMIT}[d.Code]}
	for i := range d.Limits {
		out.Limits = append(out.Limits, limitProto(&d.Limits[i]))
	}
	if d.Held.ID != "" {
		out.Reservation, out.ExpiresAtUnixMs = d.Held.ID, d.Held.Expires.UnixMilli()
	}
	return out
}

func limitProto(l *regional.LimitStatus) *pb.LimitStatus {
	return &pb.LimitStatus{Rule: l.Rule.ID, Allowed: l.Allowed, Shadow: l.Shadow, Limit: l.Limit, Remaining: l.Remaining,
		WindowMs: l.Window.Milliseconds(), ResetAtUnixMs: l.ResetAt.UnixMilli(), RetryAfterMs: ceilMillis(l.RetryAfter),
		Degraded: l.Degraded, Charged: l.Charged, Debt: l.Debt}
}

func ceilMillis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// counterRequest reads the counter an RPC names.
func counterRequest(rule string, r *pb.Request) (regional.Request, error) {
	if rule == "" {
		return regional.Request{}, &FieldError{Field: "rule", Msg: "required"}
	}
	if r == nil {
		return regional.Request{}, &FieldError{Field: "request", Msg: "required"}
	}
	return requestFrom(r.Domain, r.Descriptors, 0, "request.descriptors")
}

func (s rateLimiter) GetUsage(ctx context.Context, in *pb.GetUsageRequest) (*pb.GetUsageResponse, error) {
	req, err := counterRequest(in.Rule, in.Request)
	if err != nil {
		return nil, grpcError(err)
	}
	var u regional.Usage
	if ms := in.WindowStartUnixMs; ms != 0 {
		u, err = s.engine.UsageAt(ctx, in.Rule, &req, time.UnixMilli(ms))
		err = renameField(err, "window_start", "window_start_unix_ms")
	} else {
		u, err = s.engine.Usage(ctx, in.Rule, &req)
	}
	if err != nil {
		return nil, grpcError(err)
	}
	b := s.usageBody(in.Rule, u)
	out := &pb.GetUsageResponse{Rule: b.Rule, Key: b.Key, Algorithm: b.Algorithm, Limit: b.Limit, Remaining: b.Remaining,
		Used: b.Used, WindowMs: u.Window.Milliseconds(), ResetAtUnixMs: u.ResetAt.UnixMilli(), GlobalUsed: b.GlobalUsed,
		Region: s.opts.Region}
	if !u.WindowStart.IsZero() {
		out.WindowStartUnixMs = u.WindowStart.UnixMilli()
	}
	for _, r := range b.Regions {
		out.Regions = append(out.Regions, &pb.RegionUsage{Region: r.Region, Used: r.Used, Share: r.Share, LastHeardMs: r.LastHeardMS, Stale: r.Stale})
	}
	return out, nil
}

type adminServer struct {
	*Server
	pb.UnimplementedAdminServer
}

// authorize checks the bearer token in the call's metadata.
func (s adminServer) authorize(ctx context.Context) error {
	var auth string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 {
			auth = v[0]
		}
	}
	switch s.checkAdmin(auth) {
	case adminDisabled:
		return status.Error(codes.PermissionDenied, "admin calls are disabled: start regiond with --admin-token")
	case adminDenied:
		return status.Error(codes.Unauthenticated, "admin calls need metadata authorization: Bearer <admin token>")
	}
	return nil
}

func (s adminServer) ResetKey(ctx context.Context, in *pb.ResetKeyRequest) (*pb.ResetKeyResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	req, err := counterRequest(in.Rule, in.Request)
	if err == nil {
		err = s.engine.Reset(ctx, in.Rule, &req)
	}
	if err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("counter reset", "rule", in.Rule, "api_key", s.logKey(req.APIKey))
	return &pb.ResetKeyResponse{}, nil
}

func (s adminServer) Grant(ctx context.Context, in *pb.GrantRequest) (*pb.GrantResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	req, err := counterRequest(in.Rule, in.Request)
	if err != nil {
		return nil, grpcError(err)
	}
	st, err := s.engine.Grant(ctx, in.Rule, &req, in.Amount)
	if err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("quota granted", "rule", in.Rule, "api_key", s.logKey(req.APIKey), "amount", in.Amount)
	return &pb.GrantResponse{Status: limitProto(&st)}, nil
}

func (s adminServer) Block(ctx context.Context, in *pb.BlockRequest) (*pb.BlockResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	b := regional.Block{Pattern: in.Pattern}
	if in.UntilUnixMs < 0 {
		return nil, grpcError(&FieldError{Field: "until_unix_ms", Msg: "must not be negative"})
	}
	if in.UntilUnixMs > 0 {
		b.Until = time.UnixMilli(in.UntilUnixMs)
	}
	if err := s.engine.Block(ctx, b); err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("key pattern blocked", "pattern", s.logKey(in.Pattern), "until", b.Until)
	return &pb.BlockResponse{}, nil
}

func (s adminServer) Unblock(ctx context.Context, in *pb.UnblockRequest) (*pb.UnblockResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	if in.Pattern == "" {
		return nil, grpcError(&FieldError{Field: "pattern", Msg: "required"})
	}
	if err := s.engine.Unblock(ctx, in.Pattern); err != nil {
		return nil, grpcError(err)
	}
	s.log.Info("key pattern unblocked", "pattern", s.logKey(in.Pattern))
	return &pb.UnblockResponse{}, nil
}

func (s adminServer) ListBlocks(ctx context.Context, _ *pb.ListBlocksRequest) (*pb.ListBlocksResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	out := &pb.ListBlocksResponse{}
	for _, b := range s.engine.Blocks() {
		var until int64
		if !b.Until.IsZero() {
			until = b.Until.UnixMilli()
		}
		out.Blocks = append(out.Blocks, &pb.BlockRequest{Pattern: b.Pattern, UntilUnixMs: until})
	}
	return out, nil
}

func (s adminServer) PutRules(ctx context.Context, in *pb.PutRulesRequest) (*pb.PutRulesResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	rs, err := s.putRules([]byte(in.Yaml))
	if err != nil {
		return nil, grpcError(err)
	}
	return &pb.PutRulesResponse{Rules: int32(len(rs.Rules())), Warnings: rs.Warnings()}, nil
}

func (s adminServer) GetRules(ctx context.Context, _ *pb.GetRulesRequest) (*pb.GetRulesResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	rs := s.engine.Rules()
	return &pb.GetRulesResponse{Yaml: string(rs.YAML()), Source: rs.Source}, nil
}

func (s adminServer) ListViolations(ctx context.Context, in *pb.ListViolationsRequest) (*pb.ListViolationsResponse, error) {
	if err := s.authorize(ctx); err != nil {
		return nil, err
	}
	n := int(in.Limit)
	if n == 0 {
		n = 100
	}
	if n < 0 || n > 10_000 {
		return nil, grpcError(&FieldError{Field: "limit", Msg: "want 0 to 10000"})
	}
	vs, err := s.recentViolations(ctx, n)
	if err != nil {
		return nil, grpcError(err)
	}
	out := &pb.ListViolationsResponse{}
	for _, v := range vs {
		out.Violations = append(out.Violations, &pb.Violation{Id: v.ID, TimeUnixMs: v.Time.UnixMilli(), Region: v.Region,
			Rule: v.Rule, Key: v.Key, Code: v.Code, ApiKey: v.APIKey, Ip: v.IP, Endpoint: v.Endpoint, Limit: v.Limit,
			Cost: v.Cost, RetryAfterMs: v.RetryAfter.Milliseconds(), Count: v.Count})
	}
	return out, nil
}

// ListRegions reports every region as this one sees it.
func (s rateLimiter) ListRegions(context.Context, *pb.ListRegionsRequest) (*pb.ListRegionsResponse, error) {
	return s.regionList(), nil
}

// regionList is ListRegions' answer: every known region, when the gossip
// last heard it, and this region's own leases.
func (s *Server) regionList() *pb.ListRegionsResponse {
	out := &pb.ListRegionsResponse{AnsweredBy: s.opts.Region}
	now := time.Now()
	for _, r := range s.engine.GlobalRegions() {
		st := &pb.RegionStatus{Region: r, PartitionSuspected: true} // never heard: no last_heard_ms
		if r == s.opts.Region {
			st.LastHeardMs, st.PartitionSuspected = proto.Int64(0), false
			for _, rule := range s.engine.GlobalRules() {
				if l, _, ok := s.engine.Lease(rule.ID); ok {
					st.Leases = append(st.Leases, LeaseProto(l, now))
				}
			}
		} else if at, ok := s.engine.LastHeard(r); ok {
			st.LastHeardMs, st.PartitionSuspected = proto.Int64(now.Sub(at).Milliseconds()), now.Sub(at) > s.engine.StaleAfter()
		}
		out.Regions = append(out.Regions, st)
	}
	return out
}

// LeaseProto is a budget lease in geoquota.v1 terms.
func LeaseProto(l budget.Lease, now time.Time) *pb.Lease {
	return &pb.Lease{Rule: l.Rule, Region: l.Region, Seq: l.Seq, Floor: l.Floor, Share: l.Share, Debt: l.Debt,
		ExpiresUnixMs: l.Expires.UnixMilli(), Valid: l.Holds(now)}
}
