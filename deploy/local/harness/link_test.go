package harness

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with itself.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(addr string) (time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

func TestLinkCutHealAndLatency(t *testing.T) {
	l := NewLink(t, echoServer(t))
	if _, err := roundTrip(l.Addr()); err != nil {
		t.Fatalf("through the link: %v", err)
	}
	l.Cut()
	if _, err := roundTrip(l.Addr()); err == nil {
		t.Fatal("a cut link let a round trip through")
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(l.Addr()); err != nil {
		t.Fatalf("after healing: %v", err)
	}
	if err := l.SetLatency(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took, err := roundTrip(l.Addr()); err != nil || took < 200*time.Millisecond {
		t.Fatalf("with 100ms each way: round trip %v (%v), want at least 200ms", took, err)
	}
}
