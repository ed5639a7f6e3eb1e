package daemon

import (
	"log"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/geoquota/geoquota/transport"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what clients can hold of a server: how long a request may
// take to arrive, an answer to leave, a connection to stay idle; how big
// headers may be; how many connections a listener keeps open; and, for
// gRPC, streams per connection, how long a connection lives and how often
// a client may ping.
type Limits struct {
	// HTTP: the time to read a request's headers, the whole request
	// (body included), to write the answer, and the longest a keep-alive
	// connection may wait for its next request.
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int
	// MaxConns caps the connections a listener holds open; beyond it a
	// new connection waits to be accepted until one closes.
	MaxConns int
	// gRPC: concurrent streams per connection; a connection idle that long
	// is closed; one older than MaxConnAge is asked to go (GOAWAY), with
	// MaxConnAgeGrace for its calls in flight to finish, so that clients
	// spread over the replicas as they come and go; a client pinging more
	// often than PingMin is sent away.
	MaxStreams                            uint32
	MaxConnIdle, MaxConnAge, MaxConnGrace time.Duration
	PingMin                               time.Duration
	// StreamWorkers is how many goroutines serve gRPC calls in turn: a
	// call finding one idle runs on it, whose stack has grown already,
	// instead of on a new goroutine that grows its own (7% of regiond's
	// CPU on Redis; docs/benchmarks.md#grpc-stream-workers). Calls beyond
	// them get goroutines of their own, as without workers.
	StreamWorkers uint32
}

// DefaultLimits are the daemons' limits: generous for a gateway's calls
// (a proxied request has a minute), tight for clients that hold
// connections without using them. Connections are capped at a quarter of
// the descriptors the process may open (at least 64, at most 16,384), so
// that a flood of them leaves room for the stores, NATS and the other
// listener.
func DefaultLimits() Limits {
	return Limits{
		ReadHeader: 10 * time.Second, Read: time.Minute, Write: time.Minute, Idle: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		MaxConns:       max(64, min(16384, openFiles()/4)),
		MaxStreams:     1024,
		MaxConnIdle:    15 * time.Minute, MaxConnAge: 30 * time.Minute, MaxConnGrace: 30 * time.Second,
		PingMin: 10 * time.Second, StreamWorkers: 256,
	}
}

// openFiles is how many descriptors the process may open.
func openFiles() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<30 {
		return 1 << 16
	}
	return int(l.Cur)
}

// HTTPServer returns a server of h with the limits' timeouts and header
// cap; errorLog, if not nil, takes what the server logs.
func (l Limits) HTTPServer(h http.Handler, errorLog *log.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write,
		IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes, ErrorLog: errorLog}
}

// GRPCOptions returns the gRPC server options of the limits, and the
// codec every daemon serves with (transport.Codec: vtprotobuf's
// marshalling for Envoy's messages in a binary built with -tags
// vtprotobuf).
func (l Limits) GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.ConnectionTimeout(l.ReadHeader),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.MaxConnIdle, MaxConnectionAge: l.MaxConnAge,
			MaxConnectionAgeGrace: l.MaxConnGrace}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.PingMin, PermitWithoutStream: true}),
		grpc.NumStreamWorkers(l.StreamWorkers),
		grpc.ForceServerCodecV2(transport.Codec()),
	}
}

// Listener caps the connections lis holds open at MaxConns.
func (l Limits) Listener(lis net.Listener) net.Listener {
	return netutil.LimitListener(lis, l.MaxConns)
}
