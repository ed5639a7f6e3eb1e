package budget

import (
	"fmt"
	"time"
)

// Config holds the allocator's settings. Every field is documented with
// its default (DefaultConfig).
type Config struct {
	// Reserve is the fraction of each limit never handed out by demand:
	// it is split evenly into the regions' floors. 0.10.
	Reserve float64
	// LeaseTTL is how long a lease holds after it is issued, at most
	// MaxLeaseTTL. 10s.
	LeaseTTL time.Duration
	// Skew is the clock-skew allowance: a lease counts for this long after
	// its expiry, in case the region's clock runs behind. 500ms.
	Skew time.Duration
	// Hysteresis is the smallest change of a region's share, as a fraction
	// of the limit, that the allocator makes: smaller moves wait, so that
	// shares do not flap with noise in the demand. 0.01.
	Hysteresis float64
	// Smoothing is the weight of the newest report when demand falls,
	// in an exponentially weighted moving average; demand that rises is
	// believed at once, so that a region short of budget does not wait.
	// 1: regions report demand already averaged over a second, and a
	// region whose traffic left must hand back its share at once for the
	// others to use the limit (strict mode frees a share only after the
	// region has acknowledged the lower one).
	Smoothing float64
	// Headroom is the fraction of the limit an elastic region leaves
	// unborrowed when it borrows observed global slack. 0.01.
	Headroom float64
	// Counters is how many counters of a rule may have budgets of their
	// own (see ReportCounter); 0 gives none: every counter is served by
	// its rule's shares. 12,000 (DefaultMaxCounters).
	Counters int
}

// MaxLeaseTTL bounds Config.LeaseTTL: a region that does not know the
// lease time globalsync runs with takes no lease for longer, so that a
// lease forged to expire far ahead holds no longer than a real one could.
const MaxLeaseTTL = 5 * time.Minute

// DefaultConfig returns the defaults the daemons use (docs/design.md).
func DefaultConfig() Config {
	return Config{
		Reserve:    0.10,
		LeaseTTL:   10 * time.Second,
		Skew:       500 * time.Millisecond,
		Hysteresis: 0.01,
		Smoothing:  1,
		Headroom:   0.01,
		Counters:   DefaultMaxCounters,
	}
}

// Validate reports the first unusable field.
func (c Config) Validate() error {
	switch {
	case !(c.Reserve >= 0 && c.Reserve <= 1):
		return fmt.Errorf("%w: reserve %v: want 0 to 1", ErrInvalidConfig, c.Reserve)
	case c.LeaseTTL <= 0 || c.LeaseTTL > MaxLeaseTTL:
		return fmt.Errorf("%w: lease_ttl %v: want more than 0, at most %v", ErrInvalidConfig, c.LeaseTTL, MaxLeaseTTL)
	case c.Skew < 0:
		return fmt.Errorf("%w: skew %v: want 0 or more", ErrInvalidConfig, c.Skew)
	case !(c.Hysteresis >= 0 && c.Hysteresis < 1):
		return fmt.Errorf("%w: hysteresis %v: want 0 to 1", ErrInvalidConfig, c.Hysteresis)
	case !(c.Smoothing > 0 && c.Smoothing <= 1):
		return fmt.Errorf("%w: smoothing %v: want more than 0, at most 1", ErrInvalidConfig, c.Smoothing)
	case !(c.Headroom >= 0 && c.Headroom < 1):
		return fmt.Errorf("%w: headroom %v: want 0 to 1", ErrInvalidConfig, c.Headroom)
	case c.Counters < 0 || c.Counters > MaxCounters:
		return fmt.Errorf("%w: counters %d: want 0 to %d", ErrInvalidConfig, c.Counters, MaxCounters)
	}
	return nil
}

// Floor is each region's floor when n regions are known: the reserve split
// evenly. A region that knows of no other (n ≤ 1) may use the whole
// reserve; one that is configured alone uses the whole limit (see
// Allowance), which is not this function's business.
func (c Config) Floor(n int) float64 {
	if n <= 1 {
		return c.Reserve
	}
	return c.Reserve / float64(n)
}
