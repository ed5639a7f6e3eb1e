package regional

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ErrInvalidRules is wrapped by every error about a rules file.
var ErrInvalidRules = errors.New("regional: invalid rules")

// RuleError says what is wrong with a rules file, and where.
type RuleError struct {
	File  string // the file, or "" for rules given as bytes
	Rule  string // the rule's id, or "" for a top-level field
	Field string // the field, such as "refill_per_second"
	Line  int    // the YAML line, when known
	Msg   string
}

func (e *RuleError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, "rule %q: ", e.Rule)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, "%s: ", e.Field)
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *RuleError) Unwrap() error { return ErrInvalidRules }

// The rules file, as written. Field names are those of the YAML.
type fileSpec struct {
	Rules  []ruleSpec   `yaml:"rules"`
	TierOf []tierOfSpec `yaml:"tier_of"`
	Allow  []string     `yaml:"allow"`
	Block  []string     `yaml:"block"`
}

type tierOfSpec struct {
	APIKey string `yaml:"api_key"`
	Tier   string `yaml:"tier"`
}

type ruleSpec struct {
	ID              string           `yaml:"id"`
	Domain          string           `yaml:"domain"`
	Match           matchSpec        `yaml:"match"`
	By              []string         `yaml:"by"`
	Algorithm       string           `yaml:"algorithm"`
	Capacity        *int64           `yaml:"capacity"`
	RefillPerSecond *float64         `yaml:"refill_per_second"`
	Limit           *int64           `yaml:"limit"`
	Window          *time.Duration   `yaml:"window"`
	TTL             *time.Duration   `yaml:"ttl"`
	Rate            *float64         `yaml:"rate"`
	Burst           *int64           `yaml:"burst"`
	Tiers           map[string]int64 `yaml:"tiers"`
	Overrides       map[string]int64 `yaml:"overrides"`
	Scope           string           `yaml:"scope"`
	Mode            string           `yaml:"mode"`
	CarryDebt       bool             `yaml:"carry_debt"`
	Cost            *int64           `yaml:"cost"`
	Shadow          bool             `yaml:"shadow"`
	CountOverLimit  bool             `yaml:"count_over_limit"`
	OnExpiry        string           `yaml:"on_expiry"`
	Batch           int64            `yaml:"batch"`
	Lease           int64            `yaml:"lease"` // batch's older name
	Fallback        string           `yaml:"fallback"`
	Penalty         *penaltySpec     `yaml:"penalty"`
	MaxKeys         *int             `yaml:"max_keys"`
	OnKeyOverflow   string           `yaml:"on_key_overflow"`
}

type matchSpec struct {
	Endpoint      string            `yaml:"endpoint"`
	EndpointRegex string            `yaml:"endpoint_regex"`
	Method        string            `yaml:"method"`
	APIKey        string            `yaml:"api_key"`
	IP            string            `yaml:"ip"`
	Tier          string            `yaml:"tier"`
	Descriptors   map[string]string `yaml:"descriptors"`
}

type penaltySpec struct {
	Base time.Duration `yaml:"base"`
	Max  time.Duration `yaml:"max"`
}

// Limits on what a rules file may ask for.
const (
	// MaxValueLen is the longest descriptor value a request may carry.
	MaxValueLen = 512
	// maxLogLimit bounds sliding_window_log, which keeps one entry per
	// admitted unit of cost.
	maxLogLimit = 100_000
	// maxLimit keeps every count exact in the float arithmetic that the Lua
	// scripts and their Go twins share.
	maxLimit = 1 << 40
	// maxRate bounds token-bucket and GCRA rates, per second.
	maxRate = 1e9
	// minWindow and maxWindow bound windows and token-bucket periods.
	minWindow = time.Millisecond
	maxWindow = 366 * 24 * time.Hour
	// maxSlotTTL bounds a concurrency limit's ttl: how long a request may
	// hold its slot unreleased.
	maxSlotTTL = 24 * time.Hour
	// minGlobalSlotTTL and maxGlobalSlotTTL bound a global concurrency
	// limit's ttl, the length of the windows its slots are counted in:
	// shares move between regions at their pace, and no faster than
	// gossip and budgets do (seconds).
	minGlobalSlotTTL = time.Second
	maxGlobalSlotTTL = 10 * time.Minute
)

// DefaultSlotTTL is a concurrency limit's ttl when its rule gives none:
// a slot not released by then frees itself.
const DefaultSlotTTL = time.Minute

// LoadFile reads and compiles a rules file, or a directory of
// envoyproxy/ratelimit domain files (see ReadRules). Any error wraps
// ErrInvalidRules and names the file, the rule and the field.
func LoadFile(path string) (*RuleSet, error) {
	srcs, err := readSources(path)
	if err != nil {
		return nil, err
	}
	return loadSources(path, srcs)
}

// Parse compiles rules from YAML: a geoquota rules file, or
// envoyproxy/ratelimit's configuration (one domain a document); name is
// used in error messages (a file name, or "" if none). The whole set is
// valid or none of it is used.
func Parse(name string, src []byte) (*RuleSet, error) {
	if isEnvoyConfig(src) {
		rs, err := compileEnvoy([]envoySource{{name, src}})
		if err != nil {
			return nil, err
		}
		rs.Source, rs.yaml = name, bytes.Clone(src)
		return rs, nil
	}
	var spec fileSpec
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	// An empty file has no rules: refused below.
	if err := dec.Decode(&spec); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(name, src, err)
	}
	rs, err := compile(name, spec, src)
	if err != nil {
		return nil, err
	}
	rs.yaml = bytes.Clone(src)
	return rs, nil
}

// yamlError turns a decoding error into a RuleError naming the rule whose
// lines it is on.
func yamlError(name string, src []byte, err error) error {
	var te *yaml.TypeError
	msg := err.Error()
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	msg = strings.TrimPrefix(msg, "yaml: ")
	line := 0
	if _, err := fmt.Sscanf(msg, "line %d:", &line); err == nil {
		msg = strings.TrimSpace(msg[strings.Index(msg, ":")+1:])
	}
	msg = strings.ReplaceAll(msg, "regional.ruleSpec", "rule")
	msg = strings.ReplaceAll(msg, "regional.matchSpec", "match")
	msg = strings.ReplaceAll(msg, "regional.fileSpec", "rules file")
	e := &RuleError{File: name, Line: line, Msg: msg}
	for _, r := range ruleLines(src) {
		if line >= r.first && (r.last == 0 || line <= r.last) {
			e.Rule = r.id
			if !strings.Contains(msg, "not found in type") {
				e.Field = r.fields[line]
			}
		}
	}
	return e
}

// ruleSpan is the lines a rule spans in the file, for messages.
type ruleSpan struct {
	id          string
	first, last int            // last is 0 for the final rule
	fields      map[int]string // line to the field whose value is on it
}

// ruleLines finds where each rule sits in the YAML, from the node tree,
// which parses even when the typed decoding fails.
func ruleLines(src []byte) []ruleSpan {
	var doc yaml.Node
	if yaml.Unmarshal(src, &doc) != nil || len(doc.Content) == 0 {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil
	}
	var spans []ruleSpan
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "rules" || top.Content[i+1].Kind != yaml.SequenceNode {
			continue
		}
		for _, r := range top.Content[i+1].Content {
			span := ruleSpan{first: r.Line, fields: map[int]string{}}
			for j := 0; r.Kind == yaml.MappingNode && j+1 < len(r.Content); j += 2 {
				key, value := r.Content[j].Value, r.Content[j+1]
				if key == "id" {
					span.id = value.Value
				}
				span.fields[value.Line] = key
				for k := 0; value.Kind == yaml.MappingNode && k+1 < len(value.Content); k += 2 {
					span.fields[value.Content[k+1].Line] = key + "." + value.Content[k].Value
				}
			}
			if n := len(spans); n > 0 {
				spans[n-1].last = r.Line - 1
			}
			spans = append(spans, span)
		}
	}
	return spans
}

// compile validates the spec and builds the RuleSet.
func compile(name string, spec fileSpec, src []byte) (*RuleSet, error) {
	rs := &RuleSet{Source: name, byID: map[string]*Rule{}, descriptors: map[string]bool{}}
	for _, d := range wellKnown {
		rs.descriptors[d] = true
	}
	// Where rule i sits in src, for an error about it: found only then,
	// since it parses the YAML again.
	spanOf := func(i int) (ruleSpan, bool) {
		if spans := ruleLines(src); i < len(spans) {
			return spans[i], true
		}
		return ruleSpan{}, false
	}
	for i, glob := range spec.Allow {
		g, err := compileGlob(glob)
		if err != nil {
			return nil, &RuleError{File: name, Field: fmt.Sprintf("allow[%d]", i), Msg: err.Error()}
		}
		rs.allow = append(rs.allow, g)
	}
	for i, glob := range spec.Block {
		g, err := compileGlob(glob)
		if err != nil {
			return nil, &RuleError{File: name, Field: fmt.Sprintf("block[%d]", i), Msg: err.Error()}
		}
		if strings.Trim(glob, "*?") == "" {
			// Wildcards alone match every key long enough: "?*" any key.
			return nil, &RuleError{File: name, Field: fmt.Sprintf("block[%d]", i), Msg: fmt.Sprintf("%q blocks every API key: every request would be denied", glob)}
		}
		rs.block = append(rs.block, g)
	}
	for i, t := range spec.TierOf {
		g, err := compileGlob(t.APIKey)
		if err != nil {
			return nil, &RuleError{File: name, Field: fmt.Sprintf("tier_of[%d].api_key", i), Msg: err.Error()}
		}
		if t.Tier == "" {
			return nil, &RuleError{File: name, Field: fmt.Sprintf("tier_of[%d].tier", i), Msg: "required"}
		}
		rs.tierOf = append(rs.tierOf, tierOf{apiKey: g, tier: t.Tier})
	}
	if len(spec.Rules) == 0 {
		// A set emptied by mistake (a truncated file, a bad template)
		// would lift every limit at once.
		return nil, &RuleError{File: name, Field: "rules", Msg: "no rules: every request would go through unlimited; give at least one (a rule with shadow: true counts without denying)"}
	}
	for i, s := range spec.Rules {
		r, err := compileRule(s)
		if err != nil {
			err.File = name
			if span, ok := spanOf(i); ok {
				err.Line = span.first
				field, _, _ := strings.Cut(err.Field, "[")
				for line, f := range span.fields {
					if f == field {
						err.Line = line // the field's own line
					}
				}
			}
			if err.Rule == "" {
				err.Rule = fmt.Sprintf("#%d", i+1)
			}
			return nil, err
		}
		if _, dup := rs.byID[r.ID]; dup {
			span, _ := spanOf(i)
			return nil, &RuleError{File: name, Line: span.first, Rule: r.ID, Field: "id", Msg: "used by another rule"}
		}
		rs.byID[r.ID] = r
		rs.rules = append(rs.rules, r)
		rs.refunds = rs.refunds || r.RefundOnExpiry
		for d := range s.Match.Descriptors {
			rs.descriptors[d] = true
		}
		for _, d := range r.By {
			rs.descriptors[d] = true
		}
	}
	rs.buildIndex()
	return rs, nil
}

// wellKnown are the descriptors every request may carry.
var wellKnown = []string{"api_key", "endpoint", "method", "ip", "tier"}

func compileRule(s ruleSpec) (*Rule, *RuleError) {
	fail := func(field, format string, args ...any) *RuleError {
		return &RuleError{Rule: s.ID, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if s.ID == "" {
		return nil, fail("id", "required")
	}
	if len(s.ID) > 128 || strings.ContainsAny(s.ID, "{}|\\: \t\n") {
		// The id begins every counter's key, ended by a colon.
		return nil, fail("id", "must be at most 128 characters, without spaces, braces, colons, | or \\")
	}
	r := &Rule{ID: s.ID, Domain: s.Domain, By: s.By, Shadow: s.Shadow, CarryDebt: s.CarryDebt, CountOverLimit: s.CountOverLimit, Cost: 1}
	r.self = []*Rule{r}
	if err := r.compileMatch(s.Match); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, d := range s.By {
		if d == "" || seen[d] {
			return nil, fail(fmt.Sprintf("by[%d]", i), "descriptor names must be non-empty and listed once")
		}
		seen[d] = true
	}
	if err := r.compileLimit(s); err != nil {
		return nil, err
	}
	smallest := r.smallestLimit()
	if r.Base.Algorithm == Concurrency {
		// A slot a request, whatever it costs.
		switch {
		case s.Cost != nil:
			return nil, fail("cost", "a concurrency limit counts requests in flight, one slot each: it takes no cost")
		case s.CountOverLimit:
			return nil, fail("count_over_limit", "a concurrency limit counts requests in flight: a request denied is not in flight")
		case s.Penalty != nil:
			return nil, fail("penalty", "a concurrency limit's denials are not held (a slot may be freed any moment), so no cooldown follows them")
		}
	}
	switch s.OnExpiry {
	case "", "charge":
	case "refund":
		if r.Base.Algorithm == Concurrency {
			return nil, fail("on_expiry", "a concurrency limit's slot frees itself at its ttl: there is no estimate to refund")
		}
		r.RefundOnExpiry = true
	default:
		return nil, fail("on_expiry", "%q: want charge or refund", s.OnExpiry)
	}
	if s.Cost != nil {
		if *s.Cost < 1 || *s.Cost > smallest {
			return nil, fail("cost", "must be between 1 and the rule's smallest limit (%d)", smallest)
		}
		r.Cost = *s.Cost
	}
	switch s.Scope {
	case "", "regional":
		r.Scope = ScopeRegional
		if s.Mode != "" || s.CarryDebt {
			return nil, fail("mode", "mode and carry_debt apply to global rules only")
		}
	case "global":
		r.Scope = ScopeGlobal
		switch s.Mode {
		case "", "strict":
			r.Mode = ModeStrict
		case "elastic":
			r.Mode = ModeElastic
		default:
			return nil, fail("mode", "%q: want strict or elastic", s.Mode)
		}
		if r.Base.Algorithm != FixedWindow && r.Base.Algorithm != SlidingWindowCounter && r.Base.Algorithm != Concurrency {
			return nil, fail("algorithm", "a global rule counts per window: use fixed_window, sliding_window_counter or concurrency")
		}
		if r.Base.Algorithm == Concurrency {
			// Its slots are counted in windows of its ttl (global.go):
			// shares move between regions at the pace of its windows.
			switch ttl := time.Duration(r.Base.Window) * time.Microsecond; {
			case r.Mode != ModeStrict:
				return nil, fail("mode", "a global concurrency limit is strict: never more in flight worldwide than its limit")
			case s.CarryDebt:
				return nil, fail("carry_debt", "a global concurrency limit keeps no debt: a slot is never taken past its limit")
			case ttl < minGlobalSlotTTL || ttl > maxGlobalSlotTTL:
				return nil, fail("ttl", "%v: a global concurrency limit's ttl must be between %v and %v", ttl, minGlobalSlotTTL, maxGlobalSlotTTL)
			}
		}
	default:
		return nil, fail("scope", "%q: want regional or global", s.Scope)
	}
	globalSlots := r.Scope == ScopeGlobal && r.Base.Algorithm == Concurrency
	if globalSlots && s.Fallback != "" && s.Fallback != "fail_closed" {
		return nil, fail("fallback", "a global concurrency limit's slots are released through the store: leave fallback out, or say fail_closed")
	}
	switch s.Fallback {
	case "":
		// A global rule admits, while its store cannot answer, what its
		// region may admit without it (Engine: degraded global limits):
		// failing open would break the limit for every region at once.
		// A global concurrency limit's slots must be released through
		// the store: it admits nothing without it.
		r.Fallback = FailOpen
		if r.Scope == ScopeGlobal {
			r.Fallback = LocalOnly
		}
		if globalSlots {
			r.Fallback = FailClosed
		}
	case "fail_open":
		if r.Scope == ScopeGlobal && r.Mode == ModeStrict {
			return nil, fail("fallback", "fail_open would admit past the region's share of a strict global limit while its store cannot answer; "+
				"leave it out (a global rule keeps to its share, counted in memory, the default) or say fail_closed")
		}
		r.Fallback = FailOpen
	case "fail_closed":
		r.Fallback = FailClosed
	case "local_only":
		r.Fallback = LocalOnly
	default:
		return nil, fail("fallback", "%q: want fail_open, fail_closed or local_only", s.Fallback)
	}
	batch, field := s.Batch, "batch"
	if s.Lease != 0 {
		if s.Batch != 0 {
			return nil, fail("lease", "is batch's older name: give batch alone")
		}
		batch, field = s.Lease, "lease"
	}
	if batch != 0 {
		switch {
		case batch < 0 || batch > smallest:
			return nil, fail(field, "must be between 1 and the rule's smallest limit (%d)", smallest)
		case r.Base.Algorithm.logged():
			return nil, fail(field, "%s keeps each request's time and cannot take batches", r.Base.Algorithm)
		case r.Scope == ScopeGlobal:
			return nil, fail(field, "global rules are counted in their region's budget and cannot take batches")
		}
		r.Batch = batch
	}
	if r.CountOverLimit {
		switch {
		case r.Base.Algorithm == SlidingWindowLog:
			return nil, fail("count_over_limit", "sliding_window_log would keep an entry for every hit, past its limit without bound: use sliding_window_counter")
		case r.Batch != 0:
			return nil, fail(field, "a rule with count_over_limit counts every hit in the store and cannot take batches")
		}
	}
	if s.Penalty != nil {
		p := *s.Penalty
		if p.Base <= 0 || p.Max < p.Base || p.Max > maxWindow {
			return nil, fail("penalty", "base must be positive and max at least base (and at most %v)", maxWindow)
		}
		r.Penalty = &Penalty{Base: p.Base, Max: p.Max}
	}
	switch {
	case s.MaxKeys == nil:
		if len(r.By) > 0 { // a rule of one counter has one key
			r.MaxKeys = DefaultMaxKeys
		}
	case *s.MaxKeys < 0:
		return nil, fail("max_keys", "%d: must not be negative (0 is no cap)", *s.MaxKeys)
	default:
		r.MaxKeys = *s.MaxKeys
	}
	switch s.OnKeyOverflow {
	case "", "refuse":
		r.FoldOverflow = false
	case "fold":
		r.FoldOverflow = true
	default:
		return nil, fail("on_key_overflow", "%q: want refuse or fold", s.OnKeyOverflow)
	}
	if s.OnKeyOverflow != "" && r.MaxKeys == 0 {
		return nil, fail("on_key_overflow", "needs max_keys")
	}
	// Keys beyond the cap share one counter, at the rule's own limit (or
	// its smallest, for a rule of tiers alone).
	r.overflow = r.Base
	if r.overflow.Limit == 0 {
		r.overflow = r.Base.scaled(r.smallestLimit())
	}
	return r, nil
}

// limitMax is the largest limit an algorithm takes: a log keeps an entry
// per request (concurrency, per request in flight).
func limitMax(a Algorithm) int64 {
	if a.logged() {
		return maxLogLimit
	}
	return maxLimit
}

// compileLimit reads the algorithm and its numbers, the tiers and the overrides.
func (r *Rule) compileLimit(s ruleSpec) *RuleError {
	fail := func(field, format string, args ...any) *RuleError {
		return &RuleError{Rule: s.ID, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	algorithm := s.Algorithm // as messages name it
	if algorithm == "" {
		algorithm = "token_bucket"
	}
	type field struct {
		name string
		set  bool
	}
	only := func(allowed ...string) *RuleError {
		for _, f := range []field{
			{"capacity", s.Capacity != nil}, {"refill_per_second", s.RefillPerSecond != nil},
			{"limit", s.Limit != nil}, {"window", s.Window != nil},
			{"rate", s.Rate != nil}, {"burst", s.Burst != nil}, {"ttl", s.TTL != nil},
		} {
			if f.set && !slices.Contains(allowed, f.name) {
				return fail(f.name, "does not apply to %s (it takes %s)", algorithm, strings.Join(allowed, ", "))
			}
		}
		return nil
	}
	// The limit's number may come from the rule, or only from tiers.
	number := func(name string, v *int64, max int64) (int64, *RuleError) {
		if v == nil {
			if len(s.Tiers) > 0 {
				return 0, nil
			}
			return 0, fail(name, "required")
		}
		if *v < 1 || *v > max {
			return 0, fail(name, "must be between 1 and %d", max)
		}
		return *v, nil
	}
	window := func() (time.Duration, *RuleError) {
		if s.Window == nil {
			return 0, fail("window", "required")
		}
		w := *s.Window
		if w < minWindow || w > maxWindow || w%time.Microsecond != 0 {
			return 0, fail("window", "%v: must be between %v and %v, in whole microseconds", w, minWindow, maxWindow)
		}
		return w, nil
	}
	rate := func(name string, v *float64) (float64, *RuleError) {
		if v == nil {
			return 0, fail(name, "required")
		}
		if !(*v > 0) || math.IsInf(*v, 0) || *v > maxRate {
			return 0, fail(name, "must be a positive number of at most %g", maxRate)
		}
		return *v, nil
	}
	var err *RuleError
	p := Params{}
	switch s.Algorithm {
	case "", "token_bucket":
		p.Algorithm = TokenBucket
		if err = only("capacity", "refill_per_second"); err == nil {
			if p.Limit, err = number("capacity", s.Capacity, maxLimit); err == nil {
				p.Rate, err = rate("refill_per_second", s.RefillPerSecond)
			}
		}
	case "gcra":
		p.Algorithm = GCRA
		if err = only("rate", "burst"); err == nil {
			if p.Limit, err = number("burst", s.Burst, maxLimit); err == nil {
				p.Rate, err = rate("rate", s.Rate)
			}
		}
	case "fixed_window", "sliding_window_counter", "sliding_window_log":
		p.Algorithm = Algorithm(slices.Index(algorithmNames[:], s.Algorithm))
		if err = only("limit", "window"); err == nil {
			if p.Limit, err = number("limit", s.Limit, limitMax(p.Algorithm)); err == nil {
				var w time.Duration
				w, err = window()
				p.Window = w.Microseconds()
			}
		}
	case "concurrency":
		p.Algorithm = Concurrency
		if err = only("limit", "ttl"); err == nil {
			if p.Limit, err = number("limit", s.Limit, limitMax(p.Algorithm)); err == nil {
				ttl := DefaultSlotTTL
				if s.TTL != nil {
					ttl = *s.TTL
				}
				if ttl < minWindow || ttl > maxSlotTTL || ttl%time.Microsecond != 0 {
					err = fail("ttl", "%v: must be between %v and %v, in whole microseconds", ttl, minWindow, maxSlotTTL)
				}
				p.Window = ttl.Microseconds()
			}
		}
	default:
		return fail("algorithm", "%q: want token_bucket, sliding_window_log, sliding_window_counter, fixed_window, gcra or concurrency", s.Algorithm)
	}
	if err != nil {
		return err
	}
	if p.Rate > 0 {
		// The period in which a token bucket refills, or GCRA drains, completely.
		period := float64(p.Limit) / p.Rate
		if p.Limit > 0 && (period < minWindow.Seconds() || period > maxWindow.Seconds()) {
			field, verb := "refill_per_second", "refilling"
			if p.Algorithm == GCRA {
				field, verb = "rate", "draining"
			}
			return fail(field, "%s %d takes %.3gs; must be between %v and %v", verb, p.Limit, period, minWindow, maxWindow)
		}
	}
	r.Base = p
	most := limitMax(p.Algorithm)
	for tier, n := range s.Tiers {
		if tier == "" || n < 1 || n > most {
			return fail("tiers", "tier %q: limit %d must be between 1 and %d", tier, n, most)
		}
	}
	for key, n := range s.Overrides {
		if key == "" || n < 1 || n > most {
			return fail("overrides", "key %q: limit %d must be between 1 and %d", key, n, most)
		}
	}
	if s.Tiers != nil && len(s.Tiers) == 0 {
		return fail("tiers", "empty: list the tiers and their limits, or leave tiers out")
	}
	if s.Match.Tier != "" && s.Tiers != nil {
		if _, ok := s.Tiers[s.Match.Tier]; !ok {
			return fail("match.tier", "%q is not among the rule's tiers, so the rule would never apply", s.Match.Tier)
		}
	}
	// Tiers and overrides scale a rate with the limit (see Params.scaled):
	// the scaled rate must stay within bounds too.
	if p.Rate > 0 {
		for _, n := range slices.Concat(slices.Collect(maps.Values(s.Tiers)), slices.Collect(maps.Values(s.Overrides))) {
			if scaled := p.scaled(n); scaled.Rate > maxRate {
				return fail("tiers", "a limit of %d scales the rate to %.3g a second, above %g", n, scaled.Rate, maxRate)
			}
		}
	}
	r.Tiers, r.Overrides = s.Tiers, s.Overrides
	if p.Limit == 0 {
		// Tiers alone: the tiers' limits scale the numbers given.
		if p.Rate > 0 {
			return fail("tiers", "a %s rule with tiers still needs its %s, to set the period", algorithm, map[Algorithm]string{TokenBucket: "capacity", GCRA: "burst"}[p.Algorithm])
		}
	}
	return nil
}

// compileMatch precompiles what a rule matches.
func (r *Rule) compileMatch(m matchSpec) *RuleError {
	fail := func(field, format string, args ...any) *RuleError {
		return &RuleError{Rule: r.ID, Field: "match." + field, Msg: fmt.Sprintf(format, args...)}
	}
	if m.Endpoint != "" && m.EndpointRegex != "" {
		return fail("endpoint_regex", "give endpoint or endpoint_regex, not both")
	}
	if m.Endpoint != "" && !strings.HasPrefix(m.Endpoint, "/") {
		return fail("endpoint", "%q: a path prefix starts with /", m.Endpoint)
	}
	r.match.endpoint = m.Endpoint
	if m.EndpointRegex != "" {
		re, err := regexp.Compile(m.EndpointRegex)
		if err != nil {
			return fail("endpoint_regex", "%v", err)
		}
		r.match.endpointRegex = re
	}
	r.match.method = strings.ToUpper(m.Method)
	if m.APIKey != "" {
		g, err := compileGlob(m.APIKey)
		if err != nil {
			return fail("api_key", "%v", err)
		}
		r.match.apiKey = &g
	}
	if m.IP != "" {
		p, err := netip.ParsePrefix(m.IP)
		if err != nil {
			a, aerr := netip.ParseAddr(m.IP)
			if aerr != nil {
				return fail("ip", "%q: want a CIDR such as 203.0.113.0/24 or an address", m.IP)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 { // request addresses are unmapped: so is the rule's
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		r.match.ip = p.Masked()
	}
	r.match.tier = m.Tier
	for _, name := range slices.Sorted(maps.Keys(m.Descriptors)) {
		if isWellKnown(name) {
			return fail("descriptors."+name, "%s is matched by its own field, not under descriptors", name)
		}
		g, err := compileGlob(m.Descriptors[name])
		if err != nil {
			return fail("descriptors."+name, "%v", err)
		}
		r.match.custom = append(r.match.custom, customMatch{name: name, glob: g})
	}
	return nil
}
