package regional

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig configures the circuit breaker in front of the shared store.
type BreakerConfig struct {
	// Failures is how many failed calls in a row open the breaker; 0 means 5.
	Failures int
	// Cooldown is how long the breaker stays open before it lets one call
	// through to probe the store; 0 means one second.
	Cooldown time.Duration
}

// BreakerState is the state of the circuit breaker.
type BreakerState int32

// Breaker states.
const (
	// BreakerClosed: calls go to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fall back at once, without trying the store.
	BreakerOpen
	// BreakerHalfOpen: one call probes the store; the others fall back.
	BreakerHalfOpen
)

var breakerNames = [...]string{"closed", "open", "half_open"}

func (s BreakerState) String() string { return breakerNames[s] }

// breaker opens after consecutive store failures (errors and timeouts) and
// closes again when a probe succeeds. Safe for concurrent use; the closed,
// healthy path is one atomic load.
type breaker struct {
	cfg      BreakerConfig
	now      func() time.Time
	state    atomic.Int32
	failures atomic.Int32
	// recoveries counts the times the breaker closed after opening: the
	// store came back, and may have lost what it held.
	recoveries atomic.Int64

	mu       sync.Mutex
	openedAt time.Time
	probing  bool
}

func newBreaker(cfg BreakerConfig, now func() time.Time) *breaker {
	return &breaker{cfg: cfg, now: now}
}

// State returns the breaker's state.
func (b *breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// allow reports whether a call may go to the store, and whether it is the
// probe of a half-open breaker: the one call let through, which must end
// in success, failure or release.
func (b *breaker) allow() (ok, probe bool) {
	if BreakerState(b.state.Load()) == BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch BreakerState(b.state.Load()) {
	case BreakerClosed:
		return true, false
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.cfg.Cooldown {
			return false, false
		}
		b.state.Store(int32(BreakerHalfOpen))
		b.probing = true
		return true, true
	default: // half-open
		if b.probing {
			return false, false
		}
		b.probing = true
		return true, true
	}
}

// release ends a call that told nothing about the store (its caller gave
// up first): a probe's place goes to the next call.
func (b *breaker) release(probe bool) {
	if !probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// success records a call that worked: the breaker closes.
func (b *breaker) success() {
	if BreakerState(b.state.Load()) == BreakerClosed {
		if b.failures.Load() != 0 {
			b.failures.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if BreakerState(b.state.Load()) != BreakerClosed {
		b.recoveries.Add(1)
	}
	b.state.Store(int32(BreakerClosed))
	b.failures.Store(0)
	b.probing = false
}

// failure records a call that failed: enough in a row, or a failed probe,
// open the breaker.
func (b *breaker) failure() {
	n := b.failures.Add(1)
	state := BreakerState(b.state.Load())
	if state == BreakerClosed && int(n) < b.cfg.Failures {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if BreakerState(b.state.Load()) == BreakerOpen {
		return
	}
	b.state.Store(int32(BreakerOpen))
	b.openedAt = b.now()
	b.probing = false
}
