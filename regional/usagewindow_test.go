package regional

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestUsageAtKeptWindows: UsageAt answers for a global rule's windows as
// long as the region keeps them (a window, then one more or a minute), an
// older window is ErrWindowExpired saying how long windows are kept, and
// a window not begun is bad input naming window_start.
func TestUsageAtKeptWindows(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 30, 500e6, time.UTC)
	e := New(Config{Region: "eu", Clock: func() time.Time { return now }, Global: GlobalConfig{Regions: []string{"eu"}}}, mustParse(t, `
rules:
  - { id: second, match: { api_key: "s*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 10, window: 1s }
  - { id: minute, match: { api_key: "m*" }, by: [api_key], scope: global, algorithm: fixed_window, limit: 10, window: 1m }
  - { id: sliding, match: { api_key: "w*" }, by: [api_key], scope: global, algorithm: sliding_window_counter, limit: 10, window: 1m }
`))
	at := func(s string) time.Time {
		ts, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	for _, c := range []struct {
		rule, at string
		want     string // the window answered, "expired …" or "not begun"
	}{
		{"second", "2026-11-26T12:00:30.7Z", "2026-11-26T12:00:30Z"},
		{"second", "2026-11-26T11:59:30.5Z", "2026-11-26T11:59:30Z"}, // kept to 12:00:31
		{"second", "2026-11-26T11:59:29.9Z", "expired 2026-11-26T11:59:29Z 1m1s"},
		{"second", "0001-01-01T00:00:00.5Z", "expired 0001-01-01T00:00:00Z 1m1s"},
		{"second", "2026-11-26T12:00:31Z", "not begun"},
		{"second", "9999-12-31T23:59:59Z", "not begun"},
		{"minute", "2026-11-26T11:59:00Z", "2026-11-26T11:59:00Z"},
		{"minute", "2026-11-26T11:58:59Z", "expired 2026-11-26T11:58:00Z 2m"},
		{"sliding", "2026-11-26T11:58:59Z", "2026-11-26T11:58:00Z"}, // read by 11:59's
		{"sliding", "2026-11-26T11:57:59Z", "expired 2026-11-26T11:57:00Z 3m"},
	} {
		req := Request{APIKey: c.rule[:1] + "1"}
		u, err := e.UsageAt(t.Context(), c.rule, &req, at(c.at))
		var got string
		var expired *WindowExpiredError
		var bad *RequestError
		switch {
		case err == nil:
			got = u.WindowStart.UTC().Format(time.RFC3339Nano)
		case errors.As(err, &expired) && errors.Is(err, ErrWindowExpired):
			got = "expired " + expired.Start.UTC().Format(time.RFC3339Nano) + " " + ShortDuration(expired.Kept)
			if msg := err.Error(); !strings.Contains(msg, "for "+ShortDuration(expired.Kept)+" from its start") || !strings.Contains(msg, "usage history") {
				t.Errorf("%s at %s: %q", c.rule, c.at, msg)
			}
		case errors.As(err, &bad) && bad.Field == "window_start" && errors.Is(err, ErrInvalidRequest):
			got = "not begun"
		default:
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s at %s: %s, want %s", c.rule, c.at, got, c.want)
		}
	}
}
