package transport

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/geoquota/geoquota/regional"
)

// TestRedisStoppedUnderLoad stops Redis while clients keep checking:
// fail_open answers 200 marked degraded, fail_closed 503; once Redis is
// back, decisions are whole again without a restart.
func TestRedisStoppedUnderLoad(t *testing.T) {
	v := newEnv(t, envOptions{breaker: regional.BreakerConfig{Failures: 3, Cooldown: 200 * time.Millisecond}})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Post(v.http.URL+"/v1/check", "application/json",
					stringsReader(`{"descriptors":{"api_key":"load`+string(rune('a'+g))+`","endpoint":"/open"}}`))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("fail_open under load: %s", resp.Status)
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	if resp := v.check("k", "/open"); resp.Header.Get("X-RateLimit-Degraded") != "" {
		t.Fatal("degraded with Redis up")
	}
	if err := v.redis.Kill(); err != nil {
		t.Fatal(err)
	}
	resp := v.check("k", "/open")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Degraded") != "true" || decodeBody(t, resp)["degraded"] != true {
		t.Fatalf("fail_open without Redis: %s %v", resp.Status, resp.Header)
	}
	resp = v.check("k", "/closed")
	if b := decodeBody(t, resp); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		b["error"].(map[string]any)["code"] != "RATE_LIMITER_UNAVAILABLE" {
		t.Fatalf("fail_closed without Redis: %s %v", resp.Status, b)
	}
	if err := v.redis.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "whole decisions after Redis came back", func() bool {
		resp := v.check("k", "/closed")
		return resp.StatusCode == http.StatusOK && resp.Header.Get("X-RateLimit-Degraded") == ""
	})
	if resp := v.check("k2", "/open"); resp.Header.Get("X-RateLimit-Degraded") != "" {
		t.Fatal("fail_open still degraded after recovery")
	}
}
