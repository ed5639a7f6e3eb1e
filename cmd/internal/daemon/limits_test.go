package daemon

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// serveHTTP serves a handler that answers "ok" with limits l on loopback,
// and returns its address.
func serveHTTP(t *testing.T, l Limits) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := l.HTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}), nil)
	go srv.Serve(l.Listener(lis))
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// closedByServer reads from c until the server closes it, or fails after
// a deadline.
func closedByServer(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the server kept the connection open", what)
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestHTTPLimits: a connection that sends nothing, one that sends its body
// too slowly and one left idle after a request are closed by the server;
// beyond the cap, a new connection waits until one closes, while a client
// already connected keeps getting answers.
func TestHTTPLimits(t *testing.T) {
	l := DefaultLimits()
	l.ReadHeader, l.Read, l.Idle, l.MaxConns = 200*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond, 3
	addr := serveHTTP(t, l)

	silent := dial(t, addr)
	closedByServer(t, silent, "a connection that sends nothing")

	slow := dial(t, addr)
	io.WriteString(slow, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	closedByServer(t, slow, "a body that never ends")

	idle := dial(t, addr)
	io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a request before idling: %v %v", resp, err)
	}
	resp.Body.Close()
	closedByServer(t, idle, "a keep-alive connection left idle")

	// A client connected before the flood, whose connection stays busy.
	l.Idle = time.Minute
	l.ReadHeader, l.Read = time.Minute, time.Minute
	addr = serveHTTP(t, l)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(c *http.Client) error {
		resp, err := c.Get("http://" + addr + "/")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "ok" {
			return errors.New("answered " + string(b))
		}
		return nil
	}
	if err := get(client); err != nil {
		t.Fatal(err)
	}
	var flood []net.Conn
	for range 2 {
		flood = append(flood, dial(t, addr))
	}
	// The cap is reached: a newcomer waits...
	newcomer := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{}}
	if err := get(newcomer); err == nil {
		t.Fatal("a connection beyond the cap was served at once")
	}
	// ...while the client already connected is answered.
	for range 10 {
		if err := get(client); err != nil {
			t.Fatalf("the connected client, during the flood: %v", err)
		}
	}
	for _, c := range flood {
		c.Close()
	}
	newcomer.Timeout = 10 * time.Second
	if err := get(newcomer); err != nil {
		t.Fatalf("a newcomer once the flood is gone: %v", err)
	}
}

// TestGRPCLimits: a connection opens no more streams at once than the cap:
// the next call waits for one to end.
func TestGRPCLimits(t *testing.T) {
	l := DefaultLimits()
	l.MaxStreams = 1
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(l.GRPCOptions()...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	go g.Serve(l.Listener(lis))
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	// A watch holds the one stream open.
	wctx, stopWatch := context.WithCancel(ctx)
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = hc.Check(short, &healthpb.HealthCheckRequest{})
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "DeadlineExceeded") {
		t.Fatalf("a second stream beside the watch: %v, want it to wait past its deadline", err)
	}
	stopWatch()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("once the watch ended: %v", err)
	}
}
