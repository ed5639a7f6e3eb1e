package harness

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"
)

// StartTimeout bounds how long the test helpers wait for servers to start.
const StartTimeout = 60 * time.Second

// NewRedis starts a redis-server for a test, in the test's temporary
// directory unless opts says otherwise. It fails the test if the server
// cannot start, and stops it when the test ends.
func NewRedis(t testing.TB, opts RedisOptions) *Redis {
	t.Helper()
	opts.Dir = testDir(t, opts.Dir)
	return startForTest(t, func(ctx context.Context) (*Redis, error) { return StartRedis(ctx, opts) })
}

// NewRedisCluster starts a Redis Cluster for a test (see NewRedis).
func NewRedisCluster(t testing.TB, opts RedisClusterOptions) *RedisCluster {
	t.Helper()
	opts.Dir = testDir(t, opts.Dir)
	return startForTest(t, func(ctx context.Context) (*RedisCluster, error) { return StartRedisCluster(ctx, opts) })
}

// NewSentinel starts a Sentinel-managed primary for a test (see NewRedis).
func NewSentinel(t testing.TB, opts SentinelOptions) *Sentinel {
	t.Helper()
	opts.Dir = testDir(t, opts.Dir)
	return startForTest(t, func(ctx context.Context) (*Sentinel, error) { return StartSentinel(ctx, opts) })
}

// NewNATS starts a NATS server for a test (see NewRedis).
func NewNATS(t testing.TB, opts NATSOptions) *NATS {
	t.Helper()
	opts.Dir = testDir(t, opts.Dir)
	return startForTest(t, func(ctx context.Context) (*NATS, error) { return StartNATS(ctx, opts) })
}

// NewSupercluster starts a NATS supercluster for a test (see NewRedis).
func NewSupercluster(t testing.TB, opts SuperclusterOptions) *Supercluster {
	t.Helper()
	opts.Dir = testDir(t, opts.Dir)
	return startForTest(t, func(ctx context.Context) (*Supercluster, error) { return StartSupercluster(ctx, opts) })
}

func testDir(t testing.TB, dir string) string {
	if dir != "" {
		return dir
	}
	return t.TempDir()
}

func startForTest[S interface{ Stop() error }](t testing.TB, start func(context.Context) (S, error)) S {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	s, err := start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping: %v", err)
		}
	})
	return s
}

// WaitFor polls cond every 10ms until it holds, and fails the test if it
// does not within the given time: tests wait on conditions, never on
// sleeps.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond) // polling the condition, with a deadline
	}
}

// LogBuffer is a bytes.Buffer safe for a writer and a reader on two
// goroutines: a test's log, written by a logger called from a server's
// callback goroutine and read by the test.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
