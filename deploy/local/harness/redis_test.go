package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRedisKillAndRestartKeepsPort(t *testing.T) {
	ctx := testContext(t)
	for _, persist := range []bool{false, true} {
		t.Run(fmt.Sprintf("persist=%v", persist), func(t *testing.T) {
			r := NewRedis(t, RedisOptions{Persist: persist})
			c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
			defer c.Close()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
			port := r.Port()
			if err := r.Kill(); err != nil {
				t.Fatal(err)
			}
			if r.Running() {
				t.Fatal("still running after Kill")
			}
			if err := c.Ping(ctx).Err(); err == nil {
				t.Fatal("PING answered after SIGKILL")
			}
			if err := r.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			if r.Port() != port {
				t.Fatalf("restarted on port %d, was %d", r.Port(), port)
			}
			got, err := c.Get(ctx, "k").Result()
			switch {
			case persist && got != "v":
				t.Fatalf("persistent server lost its data: %q, %v", got, err)
			case !persist && !errors.Is(err, redis.Nil):
				t.Fatalf("non-persistent server kept data across SIGKILL: %q, %v", got, err)
			}
		})
	}
}

func TestRedisStopRemovesOwnDir(t *testing.T) {
	r, err := StartRedis(testContext(t), RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := r.Dir()
	if _, err := os.Stat(filepath.Join(dir, "redis-server.log")); err != nil {
		t.Fatalf("no log in %s: %v", dir, err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dir %s still there after Stop: %v", dir, err)
	}
}

func TestRedisStartFailureShowsLog(t *testing.T) {
	_, err := StartRedis(testContext(t), RedisOptions{Dir: t.TempDir(), Args: []string{"--no-such-option", "1"}})
	if err == nil || !strings.Contains(err.Error(), "no-such-option") {
		t.Fatalf("StartRedis with a bad option: %v, want an error quoting the server's complaint", err)
	}
}

func TestRedisOnATakenPortIsNotReady(t *testing.T) {
	ctx := testContext(t)
	other := NewRedis(t, RedisOptions{})
	dir := t.TempDir()
	r, err := newRedis("redis-server", other.Port(), dir, redisArgs(other.Port(), dir, false))
	if err != nil {
		t.Fatal(err)
	}
	// The other server answers PING on the port; ours must not pass for it.
	if err := r.start(ctx, nil); !errors.Is(err, errPortTaken) {
		t.Fatalf("start on a taken port: %v, want errPortTaken", err)
	}
}

func TestOldLogLinesDoNotMislead(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "redis-server.log"), []byte("bind: Address already in use\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := StartRedis(testContext(t), RedisOptions{Dir: dir, Args: []string{"--no-such-option", "1"}})
	if errors.Is(err, errPortTaken) || err == nil || !strings.Contains(err.Error(), "no-such-option") {
		t.Fatalf("a bad option after an old port clash in the log: %v", err)
	}
}

func TestBinaryFoundInSbin(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "nats-server")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	defer func(old []string) { sbinDirs = old }(sbinDirs)
	sbinDirs = []string{dir}
	if got, err := lookPath("nats-server"); err != nil || got != fake {
		t.Fatalf("lookPath = %q, %v; want %s", got, err, fake)
	}
}

func TestMissingBinaryNamesDebianPackage(t *testing.T) {
	ctx := testContext(t)
	t.Setenv("PATH", t.TempDir())
	defer func(old []string) { sbinDirs = old }(sbinDirs)
	sbinDirs = nil
	for name, start := range map[string]func() error{
		"redis-server": func() error { _, err := StartRedis(ctx, RedisOptions{Dir: t.TempDir()}); return err },
		"redis-tools":  func() error { _, err := StartRedisCluster(ctx, RedisClusterOptions{Dir: t.TempDir()}); return err },
		"nats-server": func() error {
			_, err := StartNATS(ctx, NATSOptions{Dir: t.TempDir(), Binary: true})
			return err
		},
	} {
		err := start()
		if !errors.Is(err, ErrMissingBinary) || !strings.Contains(err.Error(), "apt-get install "+name) {
			t.Errorf("with an empty PATH: %v, want ErrMissingBinary naming package %s", err, name)
		}
	}
}

func TestRedisCluster(t *testing.T) {
	ctx := testContext(t)
	rc := NewRedisCluster(t, RedisClusterOptions{})
	if len(rc.Nodes) != 3 || strings.Count(rc.Spec(), ",") != 2 {
		t.Fatalf("nodes %v, spec %q", rc.Addrs(), rc.Spec())
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs()})
	defer c.Close()

	// Keys spread over the slots land on all three primaries.
	for i := range 100 {
		if err := c.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex // ForEachMaster calls concurrently
	owners := map[string]bool{}
	err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		defer mu.Unlock()
		if n > 0 {
			owners[m.Options().Addr] = true
		}
		return err
	})
	if err != nil || len(owners) != 3 {
		t.Fatalf("keys on %d primaries (%v), want 3", len(owners), err)
	}

	// A node killed and restarted rejoins with its slots.
	node := rc.Nodes[1]
	if err := node.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := node.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rc.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := c.Set(ctx, fmt.Sprintf("key-%d", i), i, 0).Err(); err != nil {
			t.Fatalf("after restart: %v", err)
		}
	}
}

func TestSentinelFailover(t *testing.T) {
	ctx := testContext(t)
	s := NewSentinel(t, SentinelOptions{})
	if !strings.HasPrefix(s.URL(), "redis-sentinel://127.0.0.1:") || !strings.HasSuffix(s.URL(), "/mymaster") {
		t.Fatalf("URL %q", s.URL())
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName(), SentinelAddrs: s.SentinelAddrs()})
	defer c.Close()
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old := s.Primary.Addr()
	if err := s.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	// The sentinels promote the replica; the client follows them.
	err := poll(ctx, func(ctx context.Context) error {
		p, err := s.CurrentPrimary(ctx)
		if err != nil {
			return err
		}
		if p != s.Replicas[0].Addr() {
			return fmt.Errorf("primary still %s (was %s)", p, old)
		}
		return c.Set(ctx, "after", "1", 0).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "before").Result(); got != "1" {
		t.Fatalf("data written before the failover: %q, %v", got, err)
	}
	// The old primary, restarted, comes back as it was last configured,
	// and the sentinels make it a replica of the new one. On a slow machine
	// a sentinel may think the new primary down too, just after the switch
	// (down-after is one second), and fail over once more, back to the
	// restarted server: either way the two settle as a primary and its
	// replica, which is what the harness promises.
	if err := s.Primary.Restart(ctx); err != nil {
		t.Fatalf("restarting the old primary: %v", err)
	}
	err = poll(ctx, func(ctx context.Context) error {
		p, err := s.CurrentPrimary(ctx)
		if err != nil {
			return err
		}
		primary, other := s.Primary, s.Replicas[0]
		switch p {
		case primary.Addr():
		case other.Addr():
			primary, other = other, primary
		default:
			return fmt.Errorf("the sentinels name %s, neither of the servers", p)
		}
		for field, want := range map[string]string{"role": "slave", "master_port": strconv.Itoa(primary.Port()), "master_link_status": "up"} {
			got, err := redisInfo(ctx, other.Addr(), []any{"INFO", "replication"}, field)
			if err != nil || got != want {
				return fmt.Errorf("%s: %s %q (%v), want %q", other.Addr(), field, got, err, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
