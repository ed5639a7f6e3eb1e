package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
)

// TestFloorAnswersOK drives sim floor with sim load over Envoy RLS: every
// request is answered OK, none denied, none failed; and the server stops
// with its context.
func TestFloorAnswersOK(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	addr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- runFloor(ctx, floorConfig{addr: "127.0.0.1:0"}, func(a net.Addr) { addr <- a }) }()
	target := (<-addr).String()
	cfg, err := parseLoadFlags([]string{"-api", "envoy", "-target", target, "-keys", "5", "-concurrency", "4",
		"-duration", "300ms", "-warmup", "100ms"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := runLoad(t.Context(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if rep.sent == 0 || rep.allowed != rep.sent || rep.denied != 0 || rep.errors != 0 {
		t.Fatalf("report %+v (first error %q)", rep, rep.firstError)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("floor stopped with %v", err)
	}
}

func TestFloorFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-grpc-addr", "0.0.0.0:1"}, "loopback"},
		{[]string{"-grpc-addr", "nope"}, "-grpc-addr"},
		{[]string{"-h"}, "usage: sim floor"},
		{[]string{"extra"}, "unexpected"},
	} {
		if _, err := parseFloorFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}
