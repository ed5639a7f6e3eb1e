package transport

import (
	"math"
	"net/http"
	"strconv"
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
	return appendRateLimitHeaders(nil, d, now)
}

// maxHeaders is the most headers a decision has.
const maxHeaders = 7

// appendRateLimitHeaders appends the headers of a decision, at now, to
// hs. Their values are written into one buffer and made one string, which
// they share: one allocation for all of them.
func appendRateLimitHeaders(hs []header, d *regional.Decision, now time.Time) []header {
	var names [maxHeaders]string
	var ends [maxHeaders]int
	var buf [256]byte
	b, n := buf[:0], 0
	value := func(name string) { names[n], ends[n], n = name, len(b), n+1 } // the value written since the last
	if l := speaking(d); l != nil {
		reset := l.ResetAt.Unix()
		if l.ResetAt.Nanosecond() > 0 {
			reset++ // rounded up to the next whole second
		}
		b = strconv.AppendInt(b, l.Limit, 10)
		value("X-RateLimit-Limit")
		b = strconv.AppendInt(b, l.Remaining, 10)
		value("X-RateLimit-Remaining")
		b = strconv.AppendInt(b, reset, 10)
		value("X-RateLimit-Reset")
		for pass := range 2 { // RateLimit-Policy, then RateLimit
			first := true
			for i := range d.Limits {
				x := &d.Limits[i]
				if x.Shadow {
					continue
				}
				if !first {
					b = append(b, ", "...)
				}
				first = false
				b = strconv.AppendQuote(b, x.Rule.ID)
				switch {
				case pass == 0 && x.Rule.Base.Algorithm == regional.Concurrency:
					// Requests in flight, not in a window.
					b = strconv.AppendInt(append(b, ";q="...), x.Limit, 10)
					b = append(b, `;qu="concurrent-requests"`...)
				case pass == 0:
					b = strconv.AppendInt(append(b, ";q="...), x.Limit, 10)
					b = strconv.AppendInt(append(b, ";w="...), ceilSeconds(x.Window), 10)
				default:
					b = strconv.AppendInt(append(b, ";r="...), x.Remaining, 10)
					b = strconv.AppendInt(append(b, ";t="...), ceilSeconds(x.ResetAt.Sub(now)), 10)
				}
			}
			value([2]string{"RateLimit-Policy", "RateLimit"}[pass])
		}
		if !d.Allowed {
			b = strconv.AppendInt(b, max(1, ceilSeconds(l.RetryAfter)), 10)
			value("Retry-After")
		}
	}
	if d.Degraded {
		b = append(b, "true"...)
		value("X-RateLimit-Degraded")
	}
	s, start := string(b), 0
	for i := range n {
		hs = append(hs, header{names[i], s[start:ends[i]]})
		start = ends[i]
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
