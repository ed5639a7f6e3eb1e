package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/geoquota/geoquota/cmd/internal/daemon"
)

// sim floor serves Envoy's rate-limit protocol and answers OK to every
// request, doing nothing else: the protocol's floor on this machine, with
// the gRPC server and options regiond serves it with. A benchmark of
// regiond against it (deploy/bench/sidebyside.sh) tells what deciding
// costs beyond the transport.

type floorConfig struct {
	addr string
}

func parseFloorFlags(args []string) (floorConfig, error) {
	var c floorConfig
	fs := flag.NewFlagSet("sim floor", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.addr, "grpc-addr", "127.0.0.1:18091", "host:port to serve Envoy RLS v3 on (a loopback address)")
	if err := fs.Parse(args); err != nil {
		return c, usageError(fs, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	host, _, err := net.SplitHostPort(c.addr)
	if err != nil {
		return c, fmt.Errorf("-grpc-addr %q: %v", c.addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return c, fmt.Errorf("-grpc-addr %q: want a loopback address", c.addr)
	}
	return c, nil
}

// runFloor serves until ctx ends; ready, if set, hears the address it
// listens on.
func runFloor(ctx context.Context, c floorConfig, ready func(net.Addr)) error {
	lis, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	limits := daemon.DefaultLimits()
	g := grpc.NewServer(limits.GRPCOptions()...)
	rlsv3.RegisterRateLimitServiceServer(g, floorServer{})
	if ready != nil {
		ready(lis.Addr())
	}
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	if err := g.Serve(limits.Listener(lis)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

type floorServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

// ShouldRateLimit answers OK, with a status per descriptor, as a service
// that limits nothing would.
func (floorServer) ShouldRateLimit(_ context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(in.GetDescriptors()))}
	for i := range out.Statuses {
		out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return out, nil
}
