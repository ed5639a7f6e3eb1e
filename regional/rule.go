package regional

import (
	"math"
	"net/netip"
	"regexp"
	"strings"
	"time"
)

// Algorithm is a rate-limit algorithm.
type Algorithm uint8

// The algorithms.
const (
	TokenBucket Algorithm = iota + 1
	SlidingWindowLog
	SlidingWindowCounter
	FixedWindow
	GCRA
	// Concurrency counts requests in flight (Rule: algorithm concurrency):
	// a sliding window log of slots, one a request, whose window is the
	// slots' TTL; releasing a slot forgets its entry early.
	Concurrency
)

var algorithmNames = [...]string{"", "token_bucket", "sliding_window_log", "sliding_window_counter", "fixed_window", "gcra", "concurrency"}

// logged reports whether an algorithm keeps an entry per request: the
// sliding window log, and concurrency's slots.
func (a Algorithm) logged() bool { return a == SlidingWindowLog || a == Concurrency }

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return "unknown"
}

// Scope says who enforces a rule.
type Scope uint8

// Scopes.
const (
	ScopeRegional Scope = iota // each region enforces the limit alone
	ScopeGlobal                // one limit shared by all regions
)

// Mode is how a global rule spends its region's budget.
type Mode uint8

// Modes.
const (
	ModeStrict  Mode = iota // only within the region's share
	ModeElastic             // the share, or observed global slack
)

// Fallback is what a rule does when its store cannot answer.
type Fallback uint8

// Fallbacks.
const (
	FailOpen   Fallback = iota // allow, marked degraded
	FailClosed                 // deny as unavailable
	// LocalOnly enforces the limit in this replica's memory, marked
	// degraded; for a global rule (its default), within the replica's
	// part of what its region may still admit (see Engine.Check).
	LocalOnly
)

var fallbackNames = [...]string{"fail_open", "fail_closed", "local_only"}

func (f Fallback) String() string { return fallbackNames[f] }

// Params are the numbers of one limit, as applied to a request.
type Params struct {
	Algorithm Algorithm
	// Limit is what the limit admits: a token bucket's capacity, GCRA's
	// burst, or a window's limit, in units of cost.
	Limit int64
	// Rate is a token bucket's refill or GCRA's rate, per second.
	Rate float64
	// Window is a window's length in microseconds (fixed and sliding windows).
	Window int64
}

// WindowMicros is the limit's window in microseconds: for a token bucket
// or GCRA, the time to refill the limit completely, rounded up.
func (p Params) WindowMicros() int64 {
	if p.Rate > 0 {
		return int64(math.Ceil(float64(p.Limit) * 1e6 / p.Rate))
	}
	return p.Window
}

// resetAt is when a counter whose store cannot tell is taken to be full
// again, from now (µs): the end of the window in course for a windowed
// algorithm, whose windows are aligned to multiples of their length, and
// one window from now for the others.
func (p Params) resetAt(now int64) int64 {
	if (p.Algorithm == FixedWindow || p.Algorithm == SlidingWindowCounter) && p.Window > 0 {
		return now - now%p.Window + p.Window
	}
	return now + p.WindowMicros()
}

// scaled returns p with its limit set to n and, for a token bucket or GCRA,
// its rate scaled alike, so that the window stays the same: a tier or an
// override of 300 on "30 a minute" means "300 a minute".
func (p Params) scaled(n int64) Params {
	if p.Rate > 0 && p.Limit > 0 {
		p.Rate = p.Rate * float64(n) / float64(p.Limit)
	}
	p.Limit = n
	return p
}

// Penalty is a progressive cooldown for clients that keep sending while
// told to wait: the first such request costs Base, each further one doubles
// it, up to Max.
type Penalty struct {
	Base, Max time.Duration
}

// Rule is one compiled rule. A Rule is immutable and may be shared.
type Rule struct {
	ID     string
	Domain string // Envoy domain it is limited to, or "" for any
	// By lists the descriptors whose values make the counter key.
	By        []string
	Base      Params
	Tiers     map[string]int64 // tier to limit
	Overrides map[string]int64 // counter key to limit
	Scope     Scope
	Mode      Mode
	CarryDebt bool
	Cost      int64 // cost of a request that names none
	Shadow    bool
	// CountOverLimit counts every hit sent to the rule, whatever the
	// decision: past the limit as debt, which the key pays back before it
	// is allowed again (usage known after the response, such as tokens).
	CountOverLimit bool
	// RefundOnExpiry gives a reservation's estimate back when it ends
	// unsettled (on_expiry: refund); by default it stays charged.
	RefundOnExpiry bool
	// Batch is the batch of tokens a replica takes from the store at once
	// for a hot key (the rule's batch: N, or lease: N), served from memory.
	Batch    int64
	Fallback Fallback
	Penalty  *Penalty
	// MaxKeys caps the keys this rule tracks in a region (see
	// DefaultMaxKeys); 0 is no cap.
	MaxKeys int
	// FoldOverflow counts keys beyond MaxKeys in one shared counter
	// instead of refusing them.
	FoldOverflow bool
	// Name and Replaces are a limit's of an envoyproxy/ratelimit
	// configuration: in one RLS request, a limit met by one descriptor
	// takes the place of the limits it replaces, met by others.
	Name     string
	Replaces []string
	// Quota is such a limit's quota_mode: in one RLS request, its
	// descriptor's OVER_LIMIT makes the whole answer OVER_LIMIT only
	// if every quota descriptor of the request is over its limit.
	Quota bool

	match     matcher
	denyAll   bool    // a limit of 0, of an envoyproxy/ratelimit configuration
	unlimited bool    // such a configuration's unlimited: true
	self      []*Rule // the rule alone, as candidates returns it
	overflow  Params  // the shared counter of keys beyond MaxKeys
}

// Unlimited reports whether the rule is an unlimited entry of an
// envoyproxy/ratelimit configuration: it limits and counts nothing.
func (r *Rule) Unlimited() bool { return r.unlimited }

// DefaultMaxKeys is the cap on the keys a rule tracks in a region when
// its rule sets no max_keys: ten times the 100,000 tenants a deployment is
// built for, so that a flood of made-up keys (a botnet's addresses, forged
// API keys) cannot grow a store without bound.
const DefaultMaxKeys = 1_000_000

// smallestLimit is the smallest limit the rule can apply.
func (r *Rule) smallestLimit() int64 {
	m := int64(math.MaxInt64)
	if r.Base.Limit > 0 {
		m = r.Base.Limit
	}
	for _, n := range r.Tiers {
		m = min(m, n)
	}
	for _, n := range r.Overrides {
		m = min(m, n)
	}
	return m
}

// matcher is a rule's compiled match.
type matcher struct {
	endpoint      string // path prefix, on segment boundaries
	endpointRegex *regexp.Regexp
	method        string // upper case
	apiKey        *glob
	ip            netip.Prefix // valid if set
	tier          string
	custom        []customMatch
}

type customMatch struct {
	name string
	glob glob
}

// matchPath reports whether path is prefix or below it: "/users" matches
// "/users" and "/users/7" but not "/usersettings".
func matchPath(prefix, path string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || strings.HasSuffix(prefix, "/") || path[len(prefix)] == '/' || path[len(prefix)] == '?'
}

// glob matches strings against a pattern where * is any run of characters
// and ? any one byte. Patterns that are a literal, a prefix or a suffix
// (the usual "sk_*") take a fast path.
type glob struct {
	pattern string
	kind    globKind
	lit     string
}

type globKind uint8

const (
	globGeneral globKind = iota
	globExact
	globPrefix
	globSuffix
	globAny
)

func compileGlob(pattern string) (glob, error) {
	g := glob{pattern: pattern}
	if pattern == "" {
		return g, errEmptyPattern
	}
	stars := strings.Count(pattern, "*")
	switch {
	case strings.Contains(pattern, "?"):
		g.kind = globGeneral
	case pattern == "*":
		g.kind = globAny
	case stars == 0:
		g.kind, g.lit = globExact, pattern
	case stars == 1 && strings.HasSuffix(pattern, "*"):
		g.kind, g.lit = globPrefix, pattern[:len(pattern)-1]
	case stars == 1 && strings.HasPrefix(pattern, "*"):
		g.kind, g.lit = globSuffix, pattern[1:]
	}
	return g, nil
}

var errEmptyPattern = &patternError{"empty pattern"}

type patternError struct{ msg string }

func (e *patternError) Error() string { return e.msg }

func (g *glob) match(s string) bool {
	switch g.kind {
	case globAny:
		return true
	case globExact:
		return s == g.lit
	case globPrefix:
		return strings.HasPrefix(s, g.lit)
	case globSuffix:
		return strings.HasSuffix(s, g.lit)
	}
	return wildcardMatch(g.pattern, s)
}

// wildcardMatch matches with backtracking over the last star only, which
// is linear in practice and never allocates.
func wildcardMatch(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == s[si]):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
