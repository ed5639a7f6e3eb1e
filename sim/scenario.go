package sim

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/geoquota/geoquota/budget"
	"go.yaml.in/yaml/v3"
)

// Scenario is one simulation: regions, links, traffic and faults, read
// from a YAML file (see the files in sim/scenarios).
type Scenario struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Duration is how much virtual time the scenario covers.
	Duration time.Duration `yaml:"duration"`
	// Step is the granularity at which requests and messages interleave:
	// messages due within a step are delivered before its requests. 1ms.
	Step    time.Duration `yaml:"step"`
	Regions []string      `yaml:"regions"`
	// ClockSkew sets a region's clock ahead (positive) or behind of the
	// true time.
	ClockSkew  map[string]time.Duration `yaml:"clock_skew"`
	GlobalSync GlobalSyncSpec           `yaml:"globalsync"`
	Network    NetworkSpec              `yaml:"network"`
	Gossip     GossipSpec               `yaml:"gossip"`
	Budget     BudgetSpec               `yaml:"budget"`
	Rule       RuleSpec                 `yaml:"rule"`
	// Modes lists the modes the scenario runs in; both by default.
	Modes   []string      `yaml:"modes"`
	Traffic []TrafficSpec `yaml:"traffic"`
	Faults  []FaultSpec   `yaml:"faults"`
	// Expect states the scenario's guarantees, checked by its test.
	Expect ExpectSpec `yaml:"expect"`
}

// GlobalSyncSpec places globalsync.
type GlobalSyncSpec struct {
	// Region is where globalsync runs: its links are that region's. The
	// first region by default.
	Region string `yaml:"region"`
	// Shards runs globalsync as that many instances, each leading the
	// slice of the rule's counters whose keys hash to it
	// (budget.ShardOf): 1 (one instance) by default.
	Shards int `yaml:"shards"`
}

// NetworkSpec models the links between regions.
type NetworkSpec struct {
	// Latency is the one-way latency between two regions: each pair of
	// regions gets a latency drawn from [min, max] by the seed. 100ms to
	// 300ms.
	Latency struct {
		Min time.Duration `yaml:"min"`
		Max time.Duration `yaml:"max"`
	} `yaml:"latency"`
	// Local is the latency within a region (between a regiond and a
	// globalsync in the same region), at least the step. 1ms.
	Local time.Duration `yaml:"local"`
	// Jitter adds to every message a delay drawn from [0, jitter]. 0.
	Jitter time.Duration `yaml:"jitter"`
	// Loss is the probability that a gossip message or heartbeat is lost
	// (budgets travel through JetStream KV, which does not lose them). 0.
	Loss float64 `yaml:"loss"`
}

// GossipSpec sets the gossip's timing; the defaults are the daemons'.
type GossipSpec struct {
	Interval    time.Duration `yaml:"interval"`
	AntiEntropy time.Duration `yaml:"anti_entropy"`
	Heartbeat   time.Duration `yaml:"heartbeat"`
}

// BudgetSpec sets globalsync's budgets; the defaults are the daemons'.
type BudgetSpec struct {
	Rebalance time.Duration `yaml:"rebalance"`
	LeaseTTL  time.Duration `yaml:"lease_ttl"`
	Skew      time.Duration `yaml:"skew"`
	Reserve   *float64      `yaml:"reserve"`
}

// RuleSpec is the one global rule every region enforces, one counter per
// key.
type RuleSpec struct {
	Limit  int64         `yaml:"limit"`
	Window time.Duration `yaml:"window"`
	// Algorithm is fixed_window (the default), sliding_window_counter, or
	// concurrency: requests in flight (traffic of streams), the window
	// the slots' ttl, in strict mode only.
	Algorithm string `yaml:"algorithm"`
	CarryDebt bool   `yaml:"carry_debt"`
	// Fallback is what a region does while its store is down: a global
	// rule's own default (its part of the region's allowance, counted in
	// memory) when empty; fail_closed, local_only (the same as the
	// default), or, in elastic mode, fail_open.
	Fallback string `yaml:"fallback"`
	// CountOverLimit counts every hit, past the limit as debt: a limit of
	// tokens reported after the response (traffic with tokens).
	CountOverLimit bool `yaml:"count_over_limit"`
}

// TrafficSpec is one source of requests.
type TrafficSpec struct {
	Region string `yaml:"region"`
	// Kind is steady, shift, diurnal or flash.
	Kind string `yaml:"kind"`
	// Rate is requests per second (for shift, before the shift; for
	// flash, outside the crowd; for diurnal, the mean).
	Rate float64 `yaml:"rate"`
	// Shift: the traffic moves to region To, linearly from At over Over.
	To   string        `yaml:"to"`
	At   time.Duration `yaml:"at"`
	Over time.Duration `yaml:"over"`
	// Flash: Peak requests per second from At for For.
	Peak float64       `yaml:"peak"`
	For  time.Duration `yaml:"for"`
	// Diurnal: the rate swings by Amplitude (0 to 1) of itself over
	// Period, starting at Phase (a fraction of the period).
	Amplitude float64       `yaml:"amplitude"`
	Period    time.Duration `yaml:"period"`
	Phase     float64       `yaml:"phase"`
	// Keys is how many API keys (counters) the source spreads over; 1 by
	// default, at most 100,000. Key i is "k<i>", shared by every source.
	Keys int `yaml:"keys"`
	// Zipf (> 1) draws keys by Zipf's law with this exponent, key 0 the
	// most asked; 0 draws them uniformly.
	Zipf float64 `yaml:"zipf"`
	// Hot sends this fraction of the requests to key 0 (a hot key).
	Hot float64 `yaml:"hot"`
	// Home, for kind tenants, is the fraction of each key's requests that
	// arrive at its home region (key i lives in region i mod n, in the
	// order of the scenario's regions); the rest spread evenly over the
	// others. A tenants source names no region: Rate is its total.
	Home float64 `yaml:"home"`
	// Tokens, if set, makes each request an answer whose cost is known
	// only at its end, as an LLM gateway meters it: a check that counts
	// nothing before it ("is the tenant already over?"), and the answer's
	// tokens reported when it ends. The rule must count_over_limit.
	Tokens *TokensSpec `yaml:"tokens"`
	// Streams, if set, makes each request a stream that holds a slot of
	// the rule (algorithm concurrency) while it lasts; the rule's window
	// is the slots' ttl.
	Streams *StreamsSpec `yaml:"streams"`
}

// StreamsSpec draws how long a stream lasts: log-normal, heavy-tailed,
// at most Max. Its gateway releases its slot when it ends, but for a
// fraction Abandon of them, whose holders crash: those slots free
// themselves.
type StreamsSpec struct {
	Median  time.Duration `yaml:"median"`
	Sigma   float64       `yaml:"sigma"`
	Max     time.Duration `yaml:"max"`
	Abandon float64       `yaml:"abandon"`
}

// TokensSpec draws an answer's tokens: log-normal, heavy-tailed (most
// answers short, a few very long), between 1 and Max; the answer lasts
// its tokens at PerSecond a second.
//
// With Reserve set, the gateway reserves that estimate before each answer
// instead of asking whether the tenant is over, and commits the answer's
// tokens at its end (the difference given back, or taken past the limit).
type TokensSpec struct {
	Median    float64 `yaml:"median"`
	Sigma     float64 `yaml:"sigma"`
	Max       int64   `yaml:"max"`
	PerSecond float64 `yaml:"per_second"`
	Reserve   int64   `yaml:"reserve"`
}

// FaultSpec is one fault, or the end of one.
type FaultSpec struct {
	At time.Duration `yaml:"at"`
	// Kind is partition (Regions cut off from the others and from
	// globalsync, unless it runs among them), split (Groups cut from each
	// other), heal (every link restored), globalsync-down (no budgets for
	// For), redis-down (Region's store fails for For, then comes back
	// empty) or clock-jump (Region's clock moves By).
	Kind    string        `yaml:"kind"`
	Regions []string      `yaml:"regions"`
	Groups  [][]string    `yaml:"groups"`
	Region  string        `yaml:"region"`
	For     time.Duration `yaml:"for"`
	By      time.Duration `yaml:"by"`
}

// ExpectSpec is what a scenario promises, checked by its test: in every
// window of every counter, strict mode admits at most the limit, and
// elastic mode at most MaxElasticOver percent over it.
type ExpectSpec struct {
	// MaxElasticOver is elastic mode's worst over-admission, percent of
	// the limit. 2.
	MaxElasticOver *float64 `yaml:"max_elastic_over"`
	// SettledElasticOver, if set, is elastic mode's worst over-admission
	// from SettledFrom on, percent of the limit: once the counters that
	// ask for more than their limit have budgets of their own.
	SettledElasticOver *float64      `yaml:"settled_elastic_over"`
	SettledFrom        time.Duration `yaml:"settled_from"`
	// Converge: after every heal, all regions and globalsync hold what
	// every region counted before it within two gossip intervals plus the
	// time on the wire (see Report.Heals).
	Converge bool `yaml:"converge"`
	// Utilization, if set, is the fraction of the limit the busiest
	// counter must reach in every full window from UtilizationFrom on,
	// while demand exceeds the limit.
	Utilization     float64       `yaml:"utilization"`
	UtilizationFrom time.Duration `yaml:"utilization_from"`
	// UtilizationUntil ends that check (0: the end).
	UtilizationUntil time.Duration `yaml:"utilization_until"`
	// TenantUtilization, if set, is the fraction of the limit every
	// counter asked for more than its limit in a full window must admit
	// in it, from UtilizationFrom on (see Window.Tenants).
	TenantUtilization float64 `yaml:"tenant_utilization"`
	// MaxStrictOver, for traffic with tokens, is strict mode's worst
	// count past the limit in a window, percent of the limit: the answers
	// under way when their regions reached their allowance report past
	// it (docs/design.md). 0 (none) by default.
	MaxStrictOver float64 `yaml:"max_strict_over"`
}

// MaxKeys bounds a source's keys.
const MaxKeys = 1_000_000

//go:embed scenarios/*.yaml
var builtin embed.FS

// Names lists the built-in scenarios.
func Names() []string {
	entries, _ := fs.ReadDir(builtin, "scenarios")
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	return out
}

// Load returns a built-in scenario by name, or reads a scenario file if
// name is a path (it ends in .yaml or .yml, or names a file).
func Load(name string) (*Scenario, error) {
	if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") || strings.ContainsRune(name, os.PathSeparator) {
		b, err := os.ReadFile(name)
		if err != nil {
			return nil, err
		}
		return Parse(name, b)
	}
	b, err := builtin.ReadFile(path.Join("scenarios", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("sim: no scenario %q (sim run -list names them)", name)
	}
	return Parse(name+".yaml", b)
}

// ErrInvalidScenario wraps every error about a scenario's content.
var ErrInvalidScenario = errors.New("invalid scenario")

func invalid(source, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s: %s", ErrInvalidScenario, source, field, fmt.Sprintf(format, args...))
}

// Parse reads a scenario and checks it, filling in defaults. An error
// names the field at fault.
func Parse(source string, b []byte) (*Scenario, error) {
	var s Scenario
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidScenario, source, err)
	}
	if err := s.check(source); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Scenario) check(src string) error {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&s.Step, time.Millisecond)
	def(&s.Network.Latency.Min, 100*time.Millisecond)
	def(&s.Network.Latency.Max, 300*time.Millisecond)
	def(&s.Network.Local, time.Millisecond)
	def(&s.Gossip.Interval, 250*time.Millisecond)
	def(&s.Gossip.AntiEntropy, 10*time.Second)
	def(&s.Gossip.Heartbeat, 500*time.Millisecond)
	def(&s.Budget.Rebalance, time.Second)
	def(&s.Budget.LeaseTTL, 10*time.Second)
	def(&s.Budget.Skew, 500*time.Millisecond)
	if s.Budget.Reserve == nil {
		r := 0.10
		s.Budget.Reserve = &r
	}
	if s.Expect.MaxElasticOver == nil {
		m := 2.0
		s.Expect.MaxElasticOver = &m
	}
	if s.Rule.Algorithm == "" {
		s.Rule.Algorithm = "fixed_window"
	}
	if len(s.Modes) == 0 {
		s.Modes = []string{"strict", "elastic"}
		if s.Rule.Algorithm == "concurrency" {
			s.Modes = []string{"strict"} // a global concurrency limit is strict
		}
	}
	if s.GlobalSync.Region == "" && len(s.Regions) > 0 {
		s.GlobalSync.Region = s.Regions[0]
	}
	for i := range s.Traffic {
		if s.Traffic[i].Keys == 0 {
			s.Traffic[i].Keys = 1
		}
	}
	known := map[string]bool{}
	for i, r := range s.Regions {
		if r == "" || strings.ContainsAny(r, ". *>") || known[r] {
			return invalid(src, fmt.Sprintf("regions[%d]", i), "%q: want a distinct name without spaces, dots or wildcards", r)
		}
		known[r] = true
	}
	region := func(field, r string) error {
		if !known[r] {
			return invalid(src, field, "%q is not one of regions %v", r, s.Regions)
		}
		return nil
	}
	positive := func(field string, d time.Duration) error {
		if d <= 0 {
			return invalid(src, field, "%v: want more than 0", d)
		}
		return nil
	}
	switch {
	case s.Name == "":
		return invalid(src, "name", "missing")
	case len(s.Regions) < 2:
		return invalid(src, "regions", "%d: want at least 2", len(s.Regions))
	case s.Duration <= 0 || s.Duration > 48*time.Hour:
		return invalid(src, "duration", "%v: want more than 0, at most 48h", s.Duration)
	case s.Step <= 0 || s.Step > 100*time.Millisecond || (100*time.Millisecond)%s.Step != 0:
		return invalid(src, "step", "%v: want more than 0, at most 100ms, and 100ms a whole number of steps (the samples' times are steps')", s.Step)
	case s.Network.Latency.Min < s.Step || s.Network.Latency.Max < s.Network.Latency.Min:
		return invalid(src, "network.latency", "min %v, max %v: want step (%v) ≤ min ≤ max", s.Network.Latency.Min, s.Network.Latency.Max, s.Step)
	case s.Network.Local < s.Step:
		return invalid(src, "network.local", "%v: want at least the step (%v)", s.Network.Local, s.Step)
	case s.Network.Jitter < 0:
		return invalid(src, "network.jitter", "%v: want 0 or more", s.Network.Jitter)
	case !(s.Network.Loss >= 0 && s.Network.Loss < 1):
		return invalid(src, "network.loss", "%v: want 0 to less than 1", s.Network.Loss)
	case s.Rule.Limit <= 0:
		return invalid(src, "rule.limit", "%d: want more than 0", s.Rule.Limit)
	case s.Rule.Window < time.Second || s.Rule.Window%time.Millisecond != 0:
		return invalid(src, "rule.window", "%v: want whole milliseconds, at least 1s", s.Rule.Window)
	case !slices.Contains([]string{"fixed_window", "sliding_window_counter", "concurrency"}, s.Rule.Algorithm):
		return invalid(src, "rule.algorithm", "%q: want fixed_window, sliding_window_counter or concurrency", s.Rule.Algorithm)
	case s.Rule.Algorithm == "concurrency" && (s.Rule.Window > 10*time.Minute || s.Rule.CarryDebt || s.Rule.CountOverLimit || s.Rule.Fallback != "" && s.Rule.Fallback != "fail_closed"):
		return invalid(src, "rule", "a concurrency rule's window is its slots' ttl, at most 10m; it takes no carry_debt, count_over_limit, or fallback but fail_closed")
	case !slices.Contains([]string{"", "fail_open", "fail_closed", "local_only"}, s.Rule.Fallback):
		return invalid(src, "rule.fallback", "%q: want fail_open, fail_closed or local_only", s.Rule.Fallback)
	case !(*s.Budget.Reserve >= 0 && *s.Budget.Reserve <= 1):
		return invalid(src, "budget.reserve", "%v: want 0 to 1", *s.Budget.Reserve)
	case s.GlobalSync.Shards < 0 || s.GlobalSync.Shards > budget.MaxShards:
		return invalid(src, "globalsync.shards", "%d: want 0 (one instance) to %d", s.GlobalSync.Shards, budget.MaxShards)
	case s.Budget.Skew < 0:
		return invalid(src, "budget.skew", "%v: want 0 or more", s.Budget.Skew)
	case len(s.Traffic) == 0:
		return invalid(src, "traffic", "missing")
	}
	for _, c := range []struct {
		field string
		d     time.Duration
	}{{"gossip.interval", s.Gossip.Interval}, {"gossip.anti_entropy", s.Gossip.AntiEntropy}, {"gossip.heartbeat", s.Gossip.Heartbeat},
		{"budget.rebalance", s.Budget.Rebalance}, {"budget.lease_ttl", s.Budget.LeaseTTL}} {
		if err := positive(c.field, c.d); err != nil {
			return err
		}
	}
	if err := region("globalsync.region", s.GlobalSync.Region); err != nil {
		return err
	}
	for r, d := range s.ClockSkew {
		if err := region("clock_skew", r); err != nil {
			return err
		}
		if d.Abs() > time.Hour {
			return invalid(src, "clock_skew."+r, "%v: want at most an hour either way", d)
		}
	}
	for i, m := range s.Modes {
		if m != "strict" && m != "elastic" {
			return invalid(src, fmt.Sprintf("modes[%d]", i), "%q: want strict or elastic", m)
		}
	}
	for i := range s.Traffic {
		if err := s.Traffic[i].check(src, fmt.Sprintf("traffic[%d]", i), region); err != nil {
			return err
		}
		if s.Traffic[i].Tokens != nil && !s.Rule.CountOverLimit {
			return invalid(src, fmt.Sprintf("traffic[%d].tokens", i), "tokens are reported after the answer: the rule must say count_over_limit")
		}
		if streams := s.Traffic[i].Streams != nil; streams != (s.Rule.Algorithm == "concurrency") {
			return invalid(src, fmt.Sprintf("traffic[%d].streams", i), "streams hold slots of a concurrency rule, and a concurrency rule's traffic is streams")
		}
		if k := s.Traffic[i].Streams; k != nil && k.Max > s.Rule.Window {
			return invalid(src, fmt.Sprintf("traffic[%d].streams.max", i), "%v: a stream longer than the rule's ttl (%v) may outlive its slot, and is no longer counted", k.Max, s.Rule.Window)
		}
	}
	for i := range s.Faults {
		if err := s.Faults[i].check(src, fmt.Sprintf("faults[%d]", i), region, s.Duration); err != nil {
			return err
		}
	}
	return nil
}

func (t *TrafficSpec) check(src, field string, region func(string, string) error) error {
	if t.Kind == "tenants" {
		switch {
		case t.Region != "":
			return invalid(src, field+".region", "%q: a tenants source spans every region", t.Region)
		case !(t.Home > 0 && t.Home <= 1):
			return invalid(src, field+".home", "%v: want more than 0, at most 1", t.Home)
		case t.Hot != 0:
			return invalid(src, field+".hot", "%v: a tenants source has no hot key", t.Hot)
		}
	} else if err := region(field+".region", t.Region); err != nil {
		return err
	} else if t.Home != 0 {
		return invalid(src, field+".home", "%v: only a tenants source has homes", t.Home)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(t.Rate) || t.Rate < 0 || t.Rate > 1e8:
		return invalid(src, field+".rate", "%v: want 0 to 100,000,000 per second", t.Rate)
	case t.Keys < 1 || t.Keys > MaxKeys:
		return invalid(src, field+".keys", "%d: want 1 to %d", t.Keys, MaxKeys)
	case t.Zipf != 0 && !(t.Zipf > 1 && t.Zipf <= 10):
		return invalid(src, field+".zipf", "%v: want 0 (uniform) or more than 1, at most 10", t.Zipf)
	case !(t.Hot >= 0 && t.Hot <= 1):
		return invalid(src, field+".hot", "%v: want 0 to 1", t.Hot)
	}
	if k := t.Streams; k != nil {
		switch {
		case t.Tokens != nil:
			return invalid(src, field+".streams", "a source sends streams or answers of tokens, not both")
		case k.Median <= 0 || k.Max < k.Median || k.Max > time.Hour || !(k.Sigma >= 0 && k.Sigma <= 5):
			return invalid(src, field+".streams", "median %v, max %v, sigma %v: want 0 < median <= max <= 1h and a sigma of 0 to 5", k.Median, k.Max, k.Sigma)
		case !(k.Abandon >= 0 && k.Abandon <= 1):
			return invalid(src, field+".streams.abandon", "%v: want 0 to 1", k.Abandon)
		}
	}
	if k := t.Tokens; k != nil {
		switch {
		case !(k.Median >= 1 && k.Median <= 1e6) || !(k.Sigma >= 0 && k.Sigma <= 5):
			return invalid(src, field+".tokens", "median %v, sigma %v: want a median of 1 to 1,000,000 and a sigma of 0 to 5", k.Median, k.Sigma)
		case k.Max < int64(k.Median) || k.Max > 1<<20:
			return invalid(src, field+".tokens.max", "%d: want the median (%v) to 1,048,576", k.Max, k.Median)
		case !(k.PerSecond > 0 && k.PerSecond <= 1e6):
			return invalid(src, field+".tokens.per_second", "%v: want more than 0, at most 1,000,000", k.PerSecond)
		case k.Reserve < 0 || k.Reserve > k.Max:
			return invalid(src, field+".tokens.reserve", "%d: want 0 (ask, then report) to max (%d)", k.Reserve, k.Max)
		case k.Reserve > 0 && float64(k.Max)/k.PerSecond > 3000:
			return invalid(src, field+".tokens", "the longest answer lasts %.0fs: a reservation holds an hour at most", float64(k.Max)/k.PerSecond)
		}
	}
	switch t.Kind {
	case "steady", "tenants":
	case "shift":
		if err := region(field+".to", t.To); err != nil {
			return err
		}
		if t.At < 0 || t.Over < 0 {
			return invalid(src, field+".at", "want at and over 0 or more")
		}
	case "flash":
		if !finite(t.Peak) || t.Peak < 0 || t.Peak > 1e8 {
			return invalid(src, field+".peak", "%v: want 0 to 100,000,000 per second", t.Peak)
		}
		if t.At < 0 || t.For <= 0 {
			return invalid(src, field+".for", "want at 0 or more and for more than 0")
		}
	case "diurnal":
		if !(t.Amplitude >= 0 && t.Amplitude <= 1) {
			return invalid(src, field+".amplitude", "%v: want 0 to 1", t.Amplitude)
		}
		if t.Period <= 0 {
			return invalid(src, field+".period", "%v: want more than 0", t.Period)
		}
		if !finite(t.Phase) {
			return invalid(src, field+".phase", "%v: want a number", t.Phase)
		}
	default:
		return invalid(src, field+".kind", "%q: want steady, shift, diurnal, flash or tenants", t.Kind)
	}
	return nil
}

func (f *FaultSpec) check(src, field string, region func(string, string) error, duration time.Duration) error {
	if f.At < 0 || f.At > duration {
		return invalid(src, field+".at", "%v: want within the scenario's duration (%v)", f.At, duration)
	}
	switch f.Kind {
	case "partition":
		if len(f.Regions) == 0 {
			return invalid(src, field+".regions", "missing: name the regions cut off")
		}
		for i, r := range f.Regions {
			if err := region(fmt.Sprintf("%s.regions[%d]", field, i), r); err != nil {
				return err
			}
		}
	case "split":
		if len(f.Groups) < 2 {
			return invalid(src, field+".groups", "want at least 2 groups")
		}
		seen := map[string]bool{}
		for i, g := range f.Groups {
			for j, r := range g {
				name := fmt.Sprintf("%s.groups[%d][%d]", field, i, j)
				if err := region(name, r); err != nil {
					return err
				}
				if seen[r] {
					return invalid(src, name, "%q is in two groups", r)
				}
				seen[r] = true
			}
		}
	case "heal":
	case "globalsync-down":
		if f.For <= 0 {
			return invalid(src, field+".for", "%v: want more than 0", f.For)
		}
	case "redis-down":
		if err := region(field+".region", f.Region); err != nil {
			return err
		}
		if f.For <= 0 {
			return invalid(src, field+".for", "%v: want more than 0", f.For)
		}
	case "clock-jump":
		if err := region(field+".region", f.Region); err != nil {
			return err
		}
		if f.By == 0 || f.By.Abs() > time.Hour {
			return invalid(src, field+".by", "%v: want non-zero, at most an hour either way", f.By)
		}
	default:
		return invalid(src, field+".kind", "%q: want partition, split, heal, globalsync-down, redis-down or clock-jump", f.Kind)
	}
	return nil
}
