package transport

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/geoquota/geoquota/regional"
)

// Rate-limit headers (docs/design.md): the X-RateLimit-* fields of the
// limit that speaks for the decision, the structured RateLimit and
// RateLimit-Policy fields of draft-ietf-httpapi-ratelimit-headers-11 for
// every limit that applied (tightest first; shadow limits, which never
// deny, are left out), Retry-After on a denial, and X-RateLimit-Degraded.

// speaking returns the limit that speaks for the decision in headers, or
// nil if only shadow limits applied (they come last, and never speak).
func speaking(d *regional.Decision) *regional.LimitStatus {
	if l := d.Limit(); l != nil && !l.Shadow {
		return l
	}
	return nil
}

// ceilSeconds rounds a duration up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}

// header is one field to set.
type header struct{ name, value string }

// rateLimitHeaders returns the headers of a decision, at now.
func rateLimitHeaders(d *regional.Decision, now time.Time) []header {
	var hs []header
	if l := speaking(d); l != nil {
		reset := l.ResetAt.Unix()
		if l.ResetAt.Nanosecond() > 0 {
			reset++ // rounded up to the next whole second
		}
		hs = append(hs,
			header{"X-RateLimit-Limit", strconv.FormatInt(l.Limit, 10)},
			header{"X-RateLimit-Remaining", strconv.FormatInt(l.Remaining, 10)},
			header{"X-RateLimit-Reset", strconv.FormatInt(reset, 10)})
		var policy, state strings.Builder
		for i := range d.Limits {
			x := &d.Limits[i]
			if x.Shadow {
				continue
			}
			if policy.Len() > 0 {
				policy.WriteString(", ")
				state.WriteString(", ")
			}
			name := strconv.Quote(x.Rule.ID)
			policy.WriteString(name + ";q=" + strconv.FormatInt(x.Limit, 10) + ";w=" + strconv.FormatInt(ceilSeconds(x.Window), 10))
			state.WriteString(name + ";r=" + strconv.FormatInt(x.Remaining, 10) + ";t=" + strconv.FormatInt(ceilSeconds(x.ResetAt.Sub(now)), 10))
		}
		hs = append(hs, header{"RateLimit-Policy", policy.String()}, header{"RateLimit", state.String()})
		if !d.Allowed {
			hs = append(hs, header{"Retry-After", strconv.FormatInt(max(1, ceilSeconds(l.RetryAfter)), 10)})
		}
	}
	if d.Degraded {
		hs = append(hs, header{"X-RateLimit-Degraded", "true"})
	}
	return hs
}

// setHeaders sets the fields. Go writes them in its canonical spelling
// (X-Ratelimit-Limit); names are case-insensitive, and a canonical key is
// what Header.Get finds in handlers after a middleware.
func setHeaders(h http.Header, hs []header) {
	for _, x := range hs {
		h.Set(x.name, x.value)
	}
}
