package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

// grpcServer serves geoquota.v1.GlobalSync from a Service.
type grpcServer struct {
	pb.UnimplementedGlobalSyncServer
	s *Service
}

func (g grpcServer) GetGlobalUsage(_ context.Context, in *pb.GetGlobalUsageRequest) (*pb.GetGlobalUsageResponse, error) {
	switch {
	case in.GetRule() == "":
		return nil, status.Error(codes.InvalidArgument, "rule: required")
	case in.GetKey() == "":
		return nil, status.Error(codes.InvalidArgument, "key: required (the counter's descriptor values, as GetUsage reports them)")
	}
	start := in.GetWindowStartUnixMs()
	now := g.s.cfg.Clock()
	var doc budget.Document
	var window, kept time.Duration
	var known bool
	g.s.with(func(c *coord.Coordinator) {
		window, known = c.Window(in.GetRule())
		doc, kept = c.Budget(in.GetRule()), c.KeptFor(in.GetRule())
	})
	switch w := window.Milliseconds(); {
	case start == 0 && !known:
		return nil, status.Errorf(codes.NotFound, "rule %q: no region has reported it as global; name window_start_unix_ms", in.GetRule())
	case start == 0:
		start = now.UnixMilli() / w * w
	default:
		if known && start > 0 {
			start = start / w * w // the window that holds it
		}
		if err := keptWindow(in.GetRule(), start, kept, known, now); err != nil {
			return nil, err
		}
	}
	used := g.s.GlobalUsage(regional.CounterKey(in.GetRule(), in.GetKey()), time.UnixMilli(start))
	out := &pb.GetGlobalUsageResponse{Rule: in.GetRule(), Key: in.GetKey(), WindowStartUnixMs: start}
	for _, st := range g.s.Regions() {
		// share absent: no budget known.
		ru := &pb.RegionUsage{Region: st.Region, Used: used[st.Region], LastHeardMs: st.LastHeardMS, Stale: st.Suspect}
		if l, ok := doc.Lease(st.Region); ok && doc.Seq > 0 {
			share := l.Allowance()
			if !l.Holds(now) {
				share = l.Floor
			}
			ru.Share = &share
		}
		out.GlobalUsed += ru.Used
		out.Regions = append(out.Regions, ru)
	}
	return out, nil
}

// keptWindow refuses a window that has not begun (InvalidArgument) and
// one that globalsync no longer keeps (NotFound, reason WINDOW_EXPIRED):
// not a window nobody used.
func keptWindow(rule string, startMillis int64, kept time.Duration, known bool, now time.Time) error {
	start := time.UnixMilli(startMillis)
	if start.After(now) {
		return status.Errorf(codes.InvalidArgument, "window_start_unix_ms: %s: that window has not begun", start.UTC().Format(time.RFC3339Nano))
	}
	if now.Sub(start) <= kept {
		return nil
	}
	until := "until ten minutes after its books close"
	if !known {
		until = "as no region reports it as global"
	}
	st := status.New(codes.NotFound, fmt.Sprintf("rule %q: the window that started at %s is no longer kept: globalsync keeps a window of this rule "+
		"for %s from its start, %s; keeping the usage of past windows for longer is usage history, a separate feature",
		rule, start.UTC().Format(time.RFC3339Nano), kept, until))
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: "WINDOW_EXPIRED", Domain: "geoquota"}); err == nil {
		st = d
	}
	return st.Err()
}

func (g grpcServer) GetBudgets(context.Context, *pb.GetBudgetsRequest) (*pb.GetBudgetsResponse, error) {
	now := g.s.cfg.Clock()
	out := &pb.GetBudgetsResponse{}
	for _, d := range g.s.Budgets() {
		b := &pb.Budget{Rule: d.Rule, Seq: d.Seq, Leader: d.Leader, IssuedUnixMs: d.Issued.UnixMilli()}
		for _, l := range d.All() {
			b.Leases = append(b.Leases, transport.LeaseProto(l, now))
		}
		out.Budgets = append(out.Budgets, b)
	}
	return out, nil
}

func (g grpcServer) ListRegions(context.Context, *pb.ListRegionsRequest) (*pb.ListRegionsResponse, error) {
	now := g.s.cfg.Clock()
	out := &pb.ListRegionsResponse{AnsweredBy: g.s.cfg.ID, Leader: g.s.Leader()}
	docs := g.s.Budgets()
	for _, st := range g.s.Regions() {
		rs := &pb.RegionStatus{Region: st.Region, LastHeardMs: st.LastHeardMS, PartitionSuspected: st.Suspect, Replicas: int32(st.Replicas)}
		for _, d := range docs {
			if l, ok := d.Lease(st.Region); ok {
				rs.Leases = append(rs.Leases, transport.LeaseProto(l, now))
			}
		}
		out.Regions = append(out.Regions, rs)
	}
	return out, nil
}
