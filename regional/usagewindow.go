package regional

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// A global rule's past windows are kept, in the region's store and in the
// engine's copy, until gossip and reconciliation are done with them: one
// window and one more window or a minute, whichever is longer, after
// they end (globalUntil). UsageAt answers for those windows only: an older
// window is an error of its own (ErrWindowExpired), not a window that
// nobody used, and a window not yet begun is bad input. Keeping the usage
// of closed windows for longer is usage history, a separate feature.

// ErrWindowExpired is wrapped by UsageAt's error for a window that the
// region no longer keeps.
var ErrWindowExpired = errors.New("regional: window no longer kept")

// WindowExpiredError is UsageAt's error for a window that the region no
// longer keeps.
type WindowExpiredError struct {
	Rule string
	// Start is the window's start, or the time asked for if that is
	// too far in the past to reckon with.
	Start time.Time
	// Kept is how long from its start a window of the rule is kept.
	Kept time.Duration
}

func (e *WindowExpiredError) Error() string {
	return fmt.Sprintf("rule %q: the window that started at %s is no longer kept: a region keeps a window of this rule for %s from its start, "+
		"until every region has settled it; keeping the usage of past windows for longer is usage history, a separate feature",
		e.Rule, e.Start.UTC().Format(time.RFC3339Nano), ShortDuration(e.Kept))
}

func (e *WindowExpiredError) Unwrap() error { return ErrWindowExpired }

// keptWindow reports whether the region still keeps, at now, the window
// of a global rule with params p that holds at: nil if it does, a
// WindowExpiredError if it is older, a RequestError naming window_start if
// it has not begun.
func keptWindow(r *Rule, p *Params, at, now time.Time) error {
	w := p.Window
	keep := int64(globalUntil(p, 0)) // from a window's start
	cur := now.UnixMicro() / w * w
	if !at.Before(time.UnixMicro(cur + w)) {
		return &RequestError{Field: "window_start", Msg: fmt.Sprintf("%s: that window has not begun (the window in course started at %s)",
			at.UTC().Format(time.RFC3339Nano), time.UnixMicro(cur).UTC().Format(time.RFC3339Nano))}
	}
	expired := &WindowExpiredError{Rule: r.ID, Start: at, Kept: time.Duration(keep) * time.Microsecond}
	if at.Before(time.UnixMicro(math.MinInt64 / 2)) {
		return expired // its µs would not fit
	}
	start := at.UnixMicro()
	start -= ((start % w) + w) % w // floored, before 1970 too
	if start+keep <= now.UnixMicro() {
		expired.Start = time.UnixMicro(start)
		return expired
	}
	return nil
}

// ShortDuration writes d as time.Duration does, without its zero
// minutes and seconds: 2m, 48h, 1m1s.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
