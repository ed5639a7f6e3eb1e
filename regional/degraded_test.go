package regional

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/redis/go-redis/v9"
)

// stallRedis makes the server stall for d (DEBUG SLEEP) and returns once
// it does: a PING goes unanswered.
func stallRedis(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { admin.Close() })
	go admin.Do(context.Background(), "DEBUG", "SLEEP", fmt.Sprintf("%.3f", d.Seconds()))
	probe := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 20 * time.Millisecond})
	defer probe.Close()
	for deadline := time.Now().Add(5 * time.Second); probe.Ping(context.Background()).Err() == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the server did not stall")
		}
	}
}

// TestGlobalLimitNeverFailsOpen stalls the region's Redis, past the
// store's timeout, under two replicas whose callers send one key far over
// its global limit: while the store cannot answer, each replica admits in
// memory its half of what the region may still admit, never more; once
// the store answers again, what they admitted so is counted in the
// region's slot, once (the calls that ran late counted nothing, those the
// server ran as it stalled are given back). In elastic mode as in strict:
// a store's fault adds nothing.
func TestGlobalLimitNeverFailsOpen(t *testing.T) {
	for _, mode := range []string{"strict", "elastic"} {
		t.Run(mode, func(t *testing.T) { testGlobalLimitNeverFailsOpen(t, mode) })
	}
}

func testGlobalLimitNeverFailsOpen(t *testing.T, mode string) {
	ctx := t.Context()
	_, srv := newTestRedisStore(t, RedisOptions{Region: "us"})
	rules := mustParse(t, `
rules:
  - { id: g, by: [api_key], scope: global, mode: `+mode+`, algorithm: fixed_window, limit: 3000, window: 1h }
`)
	// Three regions: before any lease, the region keeps to its floor,
	// 10% / 3 of 3,000: 100.
	const allowance = 100
	var engines []*Engine
	for _, name := range []string{"us-1", "us-2"} {
		store := openTestRedisStore(t, srv.URL(), RedisOptions{Region: "us"})
		engines = append(engines, New(Config{Region: "us", Replica: name, Store: store, Timeout: 50 * time.Millisecond,
			Global: GlobalConfig{Regions: []string{"us", "eu", "ap"}}}, rules))
	}
	var admitted, degraded atomic.Int64
	check := func(e *Engine) Decision {
		var d Decision
		if err := e.Check(ctx, &Request{APIKey: "tenant"}, &d); err != nil {
			t.Error(err)
		}
		if d.Allowed {
			admitted.Add(1)
			if d.Degraded {
				degraded.Add(1)
			}
		}
		return d
	}
	// Some of the allowance is used through the store: the replicas learn
	// the store's clock and the region's count.
	for i := range 20 {
		if d := check(engines[i%2]); !d.Allowed || d.Degraded {
			t.Fatalf("check %d with the store up: %+v", i, d)
		}
	}
	// The replicas hear of each other through the store.
	for range 2 {
		for _, e := range engines {
			if err := e.Maintain(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := engines[0].global.degraded.replicas.Load(); n != 2 {
		t.Fatalf("replicas heard of: %d, want 2", n)
	}
	// Load on both replicas, far over the limit, through two stalls; the
	// replicas tell each other what they see of the region's slot, as
	// their gossip does.
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Add(1)
	go func() {
		defer load.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for i, e := range engines {
				for _, d := range e.OwnDeltas(0, 1000) {
					engines[1-i].ObserveOwn(d)
				}
			}
		}
	}()
	for g := range 8 {
		load.Add(1)
		go func() {
			defer load.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				check(engines[g%2])
			}
		}()
	}
	for range 2 {
		stallRedis(t, srv.Addr(), 1500*time.Millisecond)
		// Wait for the server to answer again.
		probe := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 5 * time.Second})
		if err := probe.Ping(ctx).Err(); err != nil {
			t.Fatalf("the server did not answer after its stall: %v", err)
		}
		probe.Close()
	}
	// Once the breakers let calls through again, the replicas write what
	// they admitted in memory to the store, and after a grace go back to
	// it; the load goes on meanwhile.
	deadline := time.Now().Add(15 * time.Second)
	for {
		busy := false
		for _, e := range engines {
			e.Maintain(ctx) // fails while the store does
			busy = busy || e.global.degraded.episode.Load()
		}
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replicas did not go back to the store within 15s")
		}
		time.Sleep(10 * time.Millisecond) // Maintain's rounds, in real time
	}
	close(stop)
	load.Wait()
	// Through the store again, which knows the allowance is spent.
	for i := 0; ; i++ {
		d := check(engines[i%2])
		if !d.Degraded {
			if d.Allowed {
				t.Fatalf("admitted by the store after it came back: %+v", d)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still deciding without the store: %+v", d)
		}
	}
	if degraded.Load() == 0 {
		t.Fatal("no check was admitted without the store: the stalls tested nothing")
	}
	if n := admitted.Load(); n > allowance {
		t.Fatalf("the region admitted %d of an allowance of %d (%d without the store)", n, allowance, degraded.Load())
	}
	var slot crdt.Slot
	slots, err := engines[0].store.(GlobalStore).ReadGlobal(ctx, []byte(CounterKey("g", "tenant")), time.Now().Truncate(time.Hour).UnixMilli())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		if s.Region == "us" {
			slot = s
		}
	}
	// Every admission is counted in the region's slot, once: a call the
	// server ran just as it stalled, its reply held with it, is given
	// back when its reply comes, its caller having decided without it.
	if got := int64(slot.P - slot.N); got != admitted.Load() {
		t.Fatalf("the store counts %d for the region; its replicas admitted %d (%d without the store)", got, admitted.Load(), degraded.Load())
	}
	var written int64
	for _, e := range engines {
		written += e.Stats().GlobalWrittenBack.Load()
		if e.Stats().GlobalDegradedLost.Load() != 0 {
			t.Fatal("admissions lost")
		}
	}
	if written != degraded.Load() {
		t.Fatalf("written back %d, admitted without the store %d", written, degraded.Load())
	}
	t.Logf("admitted %d of %d, %d of them without the store", admitted.Load(), allowance, degraded.Load())
}
