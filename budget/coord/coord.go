package coord

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// Name is globalsync's name in the gossip: it takes the regions' deltas
// and asks them for what it misses, but counts nothing of
// its own.
const Name = "globalsync"

// History is how many documents of each rule the budgets bucket keeps:
// enough to cover a lease's life at one rebalance a second, so that a
// leader taking over knows every lease still in force.
const History = 64

// Config configures a coordinator. Zero fields take the defaults.
type Config struct {
	// ID tells this globalsync instance from the others; the documents it
	// publishes name it as their leader.
	ID string
	// Regions are every region; empty: the regions heard from, and those
	// they name.
	Regions []string
	// Rebalance is how often the leader rebalances. 1s.
	Rebalance time.Duration
	// AntiEntropy is how often the regions say how far their gossip
	// runs, so that globalsync finds and asks for usage it missed. 10s.
	AntiEntropy time.Duration
	// Budget configures the allocator; the zero value means
	// budget.DefaultConfig().
	Budget budget.Config
	// Shard and Shards cut the global rules' counters in Shards slices
	// (budget.ShardOf), of which this coordinator serves slice Shard: it
	// keeps only their usage, takes only their reports, closes only their
	// books, and its documents are the rules' leases on that slice. 0 or
	// 1 shards: every counter. Budget.Counters is then the whole rule's:
	// each slice gives budgets of their own to its share of them, a
	// Shards-th (at least one), since a region's heartbeat names every
	// counter it holds one for, whatever its slice, and bounds them all
	// (budget.MaxCounters).
	Shard, Shards int
}

func (c Config) withDefaults() Config {
	if c.Rebalance <= 0 {
		c.Rebalance = time.Second
	}
	if c.AntiEntropy <= 0 {
		c.AntiEntropy = 10 * time.Second
	}
	if c.Budget == (budget.Config{}) {
		c.Budget = budget.DefaultConfig()
	}
	return c
}

// ErrInvalidConfig is a configuration a coordinator cannot run with.
var ErrInvalidConfig = errors.New("coord: invalid configuration")

// Validate reports the first unusable field, after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := c.Budget.Validate(); err != nil {
		return err
	}
	// A leader taking over reads every lease still in force from the
	// bucket's history: a lease's life must fit in it.
	if c.Budget.LeaseTTL+c.Budget.Skew > time.Duration(History-2)*c.Rebalance {
		return fmt.Errorf("%w: lease ttl %v is more than the %d rebalances (every %v) whose leases the budget bucket keeps",
			ErrInvalidConfig, c.Budget.LeaseTTL, History-2, c.Rebalance)
	}
	if c.Shards < 0 || c.Shards > budget.MaxShards || c.Shard < 0 || (c.Shard > 0 && c.Shard >= c.Shards) {
		return fmt.Errorf("%w: shard %d of %d: want 0 to shards-1, shards at most %d", ErrInvalidConfig, c.Shard, c.Shards, budget.MaxShards)
	}
	for _, r := range c.Regions {
		if r == "" || r == Name || len(r) > crdt.MaxRegionNameLen || strings.ContainsAny(r, ". *>") {
			return fmt.Errorf("%w: region %q", ErrInvalidConfig, r)
		}
	}
	return nil
}

// Coordinator is globalsync's brain as a state machine: it hears every
// replica's heartbeat (Heartbeat), keeps a copy of every region's usage
// (it is the Counters of globalsync's observer gossip node), and, while it
// leads, turns demand into budget documents (Rebalance) and closes each
// window's books (over-admission, carry_debt). A coordinator that starts
// to lead first restores what the leaders before it published (Restore).
//
// It does no I/O, reads no clock and starts no goroutine: globalsync's
// daemon and the simulator give it the time. It is not safe for
// concurrent use: its caller serializes every call, those the gossip node
// makes included.
type Coordinator struct {
	cfg Config

	replicas map[string]*replica    // by replica id
	rules    map[string]budget.Rule // the global rules reported
	heard    map[string]time.Time   // region → its last heartbeat
	listed   map[string]bool        // regions named by a region's heartbeat
	alloc    *budget.Allocator      // while leading
	docs     map[string]budget.Document
	tooLarge map[string]int            // by rule: times its documents stopped fitting (Sized)
	over     map[string]bool           // by rule: its last document did not fit
	issued   map[string][]issuedLeases // by rule, oldest first: see record

	usage      *crdt.Counters
	newRegions bool // a region was heard of since the copy was made
	lastExpire time.Time
	lastTick   time.Time // the time of the last Tick: how far ahead a window may start

	books books
}

type replica struct {
	region string
	heard  time.Time
	rules  map[string]*demandTrack
}

// demandTrack is a replica's last report on a rule, and its rates.
type demandTrack struct {
	last     gossip.RuleReport
	rate     budget.DemandRate
	admitted budget.DemandRate // what was admitted, for the dashboard
	counters map[string]*counterTrack
	spare    map[string]*counterTrack // the map before counters, emptied: the next report's, without a new map each
}

// counterTrack is a replica's last report on a counter on its own.
type counterTrack struct {
	last gossip.CounterReport
	rate budget.DemandRate
	seen time.Time
}

// CounterDemandSpan is how far back a counter's demand rate looks: a
// tenant's traffic in a region it visits now and then is sparse, and a
// rate over a second follows its noise.
const CounterDemandSpan = 3 * time.Second

// maxCounterKey bounds a counter's key in a heartbeat.
const maxCounterKey = 1024

// New returns a coordinator that follows (see Restore).
func New(cfg Config) (*Coordinator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Shards > 1 && cfg.Budget.Counters > 0 {
		cfg.Budget.Counters = max(1, cfg.Budget.Counters/cfg.Shards)
	}
	c := &Coordinator{cfg: cfg, replicas: map[string]*replica{}, rules: map[string]budget.Rule{}, heard: map[string]time.Time{},
		listed: map[string]bool{}, docs: map[string]budget.Document{}, tooLarge: map[string]int{}, over: map[string]bool{}, books: newBooks()}
	c.view()
	return c, nil
}

// Config returns the coordinator's settings, defaults filled in.
func (c *Coordinator) Config() Config { return c.cfg }

// maxWindow bounds the window a heartbeat may report: a year.
const maxWindow = 366 * 24 * time.Hour

// Heartbeat takes in a replica's heartbeat, heard at now (the gossip node
// has checked its sender).
func (c *Coordinator) Heartbeat(now time.Time, hb gossip.Heartbeat) {
	if hb.Region == "" || hb.Replica == "" || hb.Region == Name {
		return
	}
	if _, ok := c.heard[hb.Region]; !ok {
		c.newRegions = true
	}
	c.heard[hb.Region] = now
	for _, r := range hb.Regions {
		if r != "" && r != Name && len(r) <= crdt.MaxRegionNameLen && !strings.ContainsAny(r, ". *>") && !c.listed[r] {
			c.listed[r], c.newRegions = true, true
		}
	}
	r := c.replicas[hb.Replica]
	if r == nil || r.region != hb.Region {
		r = &replica{region: hb.Region, rules: map[string]*demandTrack{}}
		c.replicas[hb.Replica] = r
	}
	r.heard = now
	for id, rep := range hb.Rules {
		window := time.Duration(rep.WindowMillis) * time.Millisecond
		if id == "" || window <= 0 || window > maxWindow {
			continue
		}
		c.rules[id] = budget.Rule{ID: id, Window: window, Sliding: rep.Algorithm == regional.SlidingWindowCounter.String() || rep.Algorithm == regional.Concurrency.String()}
		t := r.rules[id]
		if t == nil {
			t = &demandTrack{}
			r.rules[id] = t
		}
		if len(rep.Acks) > budget.MaxShards {
			rep.Acks = nil // no slicing has that many: acknowledges nothing
		}
		t.last = rep
		counted := countedOf(rep.CountedMillis)
		t.rate.Add(rep.Admitted+rep.Denied, counted, window, now)
		t.admitted.Add(rep.Admitted, counted, window, now)
		c.trackCounters(id, t, rep.Counters, window, now)
	}
}

// trackCounters takes in a replica's reports on a rule's counters on their
// own; counters it no longer reports are forgotten (a replica reports
// every counter it holds a lease of), those it named lately as denied
// after a while.
func (c *Coordinator) trackCounters(rule string, t *demandTrack, reps map[string]gossip.CounterReport, window time.Duration, now time.Time) {
	next := t.spare
	if next == nil {
		next = make(map[string]*counterTrack, min(len(reps), budget.MaxCounters))
	}
	for key, rep := range reps {
		if len(next) >= budget.MaxCounters {
			break
		}
		if key == "" || len(key) > maxCounterKey || c.cfg.Shards > 1 && !c.owns(regional.CounterKey(rule, key)) {
			continue
		}
		ct := t.counters[key]
		if ct == nil {
			ct = &counterTrack{rate: budget.DemandRate{Span: CounterDemandSpan}}
		}
		ct.last, ct.seen = rep, now
		ct.rate.Add(rep.Admitted+rep.Denied, countedOf(rep.CountedMillis), window, now)
		next[key] = ct
	}
	// A replica names a counter without a budget of its own only while
	// it denies it more: one it named lately keeps its rate a while.
	for key, ct := range t.counters {
		if len(next) >= budget.MaxCounters {
			break
		}
		if _, ok := next[key]; !ok && ct.last.Acked == 0 && now.Sub(ct.seen) < CounterDemandSpan {
			next[key] = ct
		}
	}
	clear(t.counters)
	t.counters, t.spare = next, t.counters
}

// owns says whether a counter (its key, regional.CounterKey) is of this
// coordinator's slice (Config.Shard).
func (c *Coordinator) owns(key string) bool {
	return c.cfg.Shards <= 1 || budget.ShardOf(key, c.cfg.Shards) == c.cfg.Shard
}

// acked is what a replica's report on a rule acknowledges of this
// coordinator's slice's lease.
func (c *Coordinator) acked(rep *gossip.RuleReport) uint64 {
	if c.cfg.Shards <= 1 {
		if len(rep.Acks) > 0 {
			return 0 // it holds leases of a slicing: their Seqs are not ours
		}
		return rep.Acked
	}
	if len(rep.Acks) != c.cfg.Shards {
		return 0 // the replica holds the rule's leases of another slicing, or none
	}
	return rep.Acks[c.cfg.Shard]
}

// countedOf is a report's CountedMillis as a duration, 0 if out of range.
func countedOf(ms int64) time.Duration {
	if ms <= 0 || ms > maxWindow.Milliseconds() {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// Leading reports whether the coordinator leads.
func (c *Coordinator) Leading() bool { return c.alloc != nil }

// Restore makes the coordinator lead, with a fresh allocator that knows
// every lease the leaders before it published that may still be in force:
// history holds each rule's documents, oldest first, as the budgets bucket
// keeps them. Books those leaders closed stay closed.
func (c *Coordinator) Restore(history [][]budget.Document) error {
	alloc, err := budget.NewAllocator(c.cfg.Budget)
	if err != nil {
		return err
	}
	docs := map[string]budget.Document{}
	for _, h := range history {
		if len(h) == 0 {
			continue
		}
		latest := h[len(h)-1]
		docs[latest.Rule] = latest
		for _, d := range h {
			c.record(d)
		}
		alloc.RestoreHistory(h)
		c.books.inherit(latest.BooksClosed)
	}
	c.alloc, c.docs = alloc, docs
	return nil
}

// Follow stops leading: another instance leads now, or may.
func (c *Coordinator) Follow() { c.alloc = nil }

// Rebalance closes the books of the windows that have settled, then
// computes every rule's leases from the replicas' reports; it returns the
// documents to publish, one per rule, and the over-admissions the books
// found. A follower does nothing.
func (c *Coordinator) Rebalance(now time.Time) ([]budget.Document, []OverAdmission, error) {
	if c.alloc == nil {
		return nil, nil, nil
	}
	found := c.closeBooks(now)
	regions := c.Regions()
	replicas := slices.Sorted(maps.Keys(c.replicas)) // in order: demand sums the same to the last bit
	var docs []budget.Document
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(c.rules)) {
		rule := c.rules[id]
		if last, ok := c.docs[id]; ok && c.alloc.Seq(id) < last.Seq {
			// Forgotten, and global again: its leases go on from the
			// last published, which the regions may hold still, so that
			// no acknowledgement of those counts for a new one.
			c.alloc.NumberAfter(id, last.Seq)
		}
		counters := map[string][]budget.Report{}
		for _, region := range regions {
			if rep, ok := c.regionReport(rule, region, replicas, now); ok {
				c.alloc.Report(rule.ID, rep)
			}
			for key, rep := range c.counterReports(rule, region, replicas, now) {
				counters[key] = append(counters[key], rep)
			}
		}
		c.reportCounters(rule.ID, counters, now)
		c.counterUseSeen(rule, regions, now)
		if !c.reported(rule, now) {
			// No replica has reported the rule for long (every lease
			// lapsed, every window it counted in over): it is no
			// longer global anywhere.
			delete(c.rules, rule.ID)
			c.alloc.Forget(rule.ID)
			continue
		}
		rule.Floors = c.higherFloors(rule.ID, regions, now)
		leases, err := c.alloc.Rebalance(now, rule, regions)
		if err != nil {
			errs = append(errs, fmt.Errorf("rule %s: %w", rule.ID, err))
			continue
		}
		for i := range leases {
			// No demand for want of word of it, which the allocator
			// cannot tell from none.
			if l := &leases[i]; l.Key == "" && l.Reason.Why == budget.WhyIdle && now.Sub(c.heard[l.Region]) > c.demandSilence() {
				l.Reason.Why = budget.WhySilent
			}
		}
		doc := budget.NewDocument(c.cfg.ID, leases)
		if c.cfg.Shards > 1 {
			doc.Shard, doc.Shards = c.cfg.Shard, c.cfg.Shards
		}
		doc.SetSnapshot(c.alloc.Snapshot(rule.ID))
		doc.BooksClosed = c.books.closed()
		c.docs[rule.ID] = doc
		c.record(doc)
		docs = append(docs, doc)
	}
	return docs, found, errors.Join(errs...)
}

// regionReport sums a region's live replicas' reports on a rule (see
// reportSum).
func (c *Coordinator) regionReport(rule budget.Rule, region string, replicas []string, now time.Time) (budget.Report, bool) {
	sum := reportSum{rep: budget.Report{Region: region}}
	for _, id := range replicas {
		r := c.replicas[id]
		if r.region != region || now.Sub(r.heard) > c.replicaSilence() {
			continue
		}
		if t := r.rules[rule.ID]; t != nil {
			sum.add(t.rate.Rate(), now.Sub(r.heard) <= c.demandSilence(), c.acked(&t.last), t.last.Used, t.last.UsedEpoch, t.last.PrevUsed)
		}
	}
	return sum.report(), sum.n > 0
}

// reportSum sums replicas' reports on a rule, or on a counter: demand adds
// up (of the replicas heard within demandSilence); the lease acknowledged
// is the oldest any replica acknowledges (each replica enforces its own);
// what was used is the most any saw, if all speak of the same window.
type reportSum struct {
	rep                     budget.Report
	n                       int
	mixedEpochs, someNoPrev bool
}

func (s *reportSum) add(rate float64, believed bool, acked uint64, used float64, epoch int64, prev *float64) {
	if s.n == 0 {
		s.rep.Acked, s.rep.UsedEpoch = acked, epoch
	}
	s.n++
	if believed {
		s.rep.Demand += rate
	}
	s.rep.Acked = min(s.rep.Acked, acked)
	s.rep.Used = max(s.rep.Used, used)
	if epoch != s.rep.UsedEpoch {
		s.mixedEpochs = true
	}
	if prev == nil {
		s.someNoPrev = true
	} else {
		s.rep.PrevUsed = max(s.rep.PrevUsed, *prev)
	}
}

func (s *reportSum) report() budget.Report {
	s.rep.HasUsed = s.n > 0 && !s.mixedEpochs && s.rep.Acked > 0
	s.rep.HasPrev = s.rep.HasUsed && !s.someNoPrev
	return s.rep
}

// A counter gets a budget of its own if its regions ask for at least
// minCounterDemand of it (limits per window, summed over them): its room
// then moves inside a window as its demand does, where the rule's shares
// follow the rule's; or if it would gain at least minCounterGain from one
// (budget.Allocator.Gain): the rule's shares give it much less than it
// asks where it is asked.
const (
	minCounterDemand = 0.5
	minCounterGain   = 0.1
)

// Eviction: while every budget of its own is taken, a counter that would
// gain more than evictFactor times what the weakest one would lose takes
// its place (at most maxEvictions a rebalance).
const (
	evictFactor  = 2
	maxEvictions = 10
)

// reportCounters gives the allocator every region's reports on the
// counters of a rule: those with budgets of their own, then the others
// that qualify (minCounterDemand, minCounterGain), those that would gain
// most from a budget of their own first, then the most asked for, so that
// when budgets run short they go where the rule's shares fall shortest.
func (c *Coordinator) reportCounters(rule string, counters map[string][]budget.Report, now time.Time) {
	served := map[string]bool{}
	for _, key := range c.alloc.Counters(rule) {
		served[key] = true
	}
	type cand struct {
		key          string
		gain, demand float64
	}
	var cands []cand
	demand := map[string]float64{}
	for key, reps := range counters {
		if served[key] {
			for _, rep := range reps {
				c.alloc.ReportCounter(rule, key, rep)
			}
			continue
		}
		clear(demand)
		d := 0.0
		for _, rep := range reps {
			demand[rep.Region] += rep.Demand
			d += rep.Demand
		}
		if g := c.alloc.Gain(rule, demand); g >= minCounterGain || d >= minCounterDemand {
			cands = append(cands, cand{key, g, d})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(b.gain, a.gain), cmp.Compare(b.demand, a.demand), cmp.Compare(a.key, b.key))
	})
	evicted, evicting := 0, true
	var weak []budget.Weak // the weakest, weakest first, once needed
	for _, x := range cands {
		if evicting && c.alloc.Full(rule) {
			// Every budget of its own taken: one that would lose far
			// less gives its room to this one (it goes back to the
			// rule once its leases have lapsed). The candidates come
			// in falling gain: once one does not qualify, none does.
			// (A document as full as a message takes makes no room
			// by eviction: the evicted stays in it for a while.)
			if weak == nil {
				weak = c.alloc.WeakestN(rule, maxEvictions)
			}
			evicting = len(weak) > 0 && !c.alloc.AtFit(rule) && x.gain > evictFactor*weak[0].Gain && evicted < maxEvictions
			if evicting {
				c.alloc.Release(rule, weak[0].Key, now)
				weak = weak[1:]
				evicted++
			}
		}
		// The first report with demand makes its budget, if there is
		// room; then the rest.
		reps := counters[x.key]
		slices.SortStableFunc(reps, func(a, b budget.Report) int { return cmp.Compare(b.Demand, a.Demand) })
		for _, rep := range reps {
			c.alloc.ReportCounter(rule, x.key, rep)
		}
	}
}

// counterUseSeen tells the allocator what the gossip shows each region
// used of a rule's counters with budgets of their own in the window in
// course (budget.Allocator.CounterUseSeen): a region that borrowed of a
// counter before it had a budget of its own keeps what it used.
func (c *Coordinator) counterUseSeen(rule budget.Rule, regions []string, now time.Time) {
	w := rule.Window.Microseconds()
	if rule.Sliding || w <= 0 || c.books.rules == nil {
		return
	}
	epoch := now.UnixMicro() / w
	usage := c.view()
	for _, key := range c.alloc.Counters(rule.ID) {
		ck := regional.CounterKey(rule.ID, key)
		_, limit, ok := c.books.rules.GlobalLimitOf(ck)
		if !ok || limit <= 0 {
			continue
		}
		by := usage.Get(crdt.ID{Key: ck, Epoch: epoch * w / 1000}).ByRegion()
		for _, r := range regions {
			if n := by[r]; n > 0 {
				c.alloc.CounterUseSeen(rule.ID, key, r, epoch, float64(n)/float64(limit))
			}
		}
	}
}

// counterReports sums a region's live replicas' reports on the counters of
// a rule on their own, as regionReport does for the rule; a live replica
// that reports the rule but not a counter acknowledges none of its leases.
func (c *Coordinator) counterReports(rule budget.Rule, region string, replicas []string, now time.Time) map[string]budget.Report {
	// The sums are made in one block, as many as the replicas report
	// counters (thousands, every rebalance), not one by one.
	n := 0
	for _, id := range replicas {
		if r := c.replicas[id]; r.region == region && now.Sub(r.heard) <= c.replicaSilence() && r.rules[rule.ID] != nil {
			n += len(r.rules[rule.ID].counters)
		}
	}
	sums := make([]reportSum, 0, n)
	all := make(map[string]*reportSum, n)
	live := 0
	for _, id := range replicas {
		r := c.replicas[id]
		if r.region != region || now.Sub(r.heard) > c.replicaSilence() {
			continue
		}
		t := r.rules[rule.ID]
		if t == nil {
			continue
		}
		live++
		for key, ct := range t.counters {
			sum := all[key]
			if sum == nil {
				sums = append(sums, reportSum{rep: budget.Report{Region: region}})
				sum = &sums[len(sums)-1]
				all[key] = sum
			}
			sum.add(ct.rate.Rate(), now.Sub(r.heard) <= c.demandSilence(), ct.last.Acked, ct.last.Used, ct.last.UsedEpoch, ct.last.PrevUsed)
		}
	}
	out := make(map[string]budget.Report, len(all))
	for key, sum := range all {
		if sum.n < live {
			sum.rep.Acked = 0
		}
		out[key] = sum.report()
	}
	return out
}

// replicaSilence is how long a replica may be silent before it no longer
// counts: it may hold a lease it got after its last heartbeat, in force for
// a lease's life and the skew allowance after.
func (c *Coordinator) replicaSilence() time.Duration {
	return c.cfg.Budget.LeaseTTL + c.cfg.Budget.Skew + 2*time.Second
}

// demandSilence is how long a replica may be silent before its demand is
// no longer believed: a region cut off stops being renewed at its share
// (leases it cannot receive would keep the share from the others for a
// lease's life after they were issued), while its acknowledgements still
// count for replicaSilence.
func (c *Coordinator) demandSilence() time.Duration { return max(3*c.cfg.Rebalance, minDemandSilence) }

// minDemandSilence is four of the regions' heartbeats (500ms).
const minDemandSilence = 2 * time.Second

// reported says whether a replica reported the rule lately: within a
// lease's life and two of the rule's windows.
func (c *Coordinator) reported(rule budget.Rule, now time.Time) bool {
	for _, r := range c.replicas {
		if t := r.rules[rule.ID]; t != nil && !t.rate.Last().IsZero() &&
			now.Sub(t.rate.Last()) <= c.replicaSilence()+2*rule.Window {
			return true
		}
	}
	return false
}

// Regions are the regions the budgets are split over: Config.Regions,
// else every region heard from or named by one that was, sorted.
func (c *Coordinator) Regions() []string {
	if len(c.cfg.Regions) > 0 {
		return slices.Clone(c.cfg.Regions)
	}
	all := maps.Clone(c.listed)
	for r := range c.heard {
		all[r] = true
	}
	return slices.Sorted(maps.Keys(all))
}

// forgetReplicas is how long a replica may be silent before the
// coordinator forgets it: it is gone, or cut off for so long that it is
// the operator's concern (see the runbook).
const forgetReplicas = 10 * time.Minute

// Tick does the coordinator's housekeeping at now, leader or not: it
// forgets replicas long silent and, once an anti-entropy round, the
// windows of its usage copy whose books closed a while ago.
func (c *Coordinator) Tick(now time.Time) {
	c.lastTick = now
	for id, r := range c.replicas {
		if now.Sub(r.heard) > forgetReplicas {
			delete(c.replicas, id)
		}
	}
	if now.Sub(c.lastExpire) >= c.cfg.AntiEntropy {
		c.lastExpire = now
		c.expireUsage(now)
	}
}

// higherFloors returns the floors, as fractions of the rule's limit now,
// of regions whose replicas last said they enforce a higher limit: a
// region cut off when the limit was lowered keeps its floor of the old
// limit until it hears of the new. The limit now is the rules' (SetRules),
// or else the one the replica heard last reported.
func (c *Coordinator) higherFloors(rule string, regions []string, now time.Time) map[string]float64 {
	current, latest := int64(0), time.Time{}
	if rs := c.books.rules; rs != nil {
		if r := rs.Rule(rule); r != nil {
			current = r.Base.Limit
		}
	}
	enforced := map[string]int64{}
	for _, r := range c.replicas {
		if now.Sub(r.heard) > forgetReplicas {
			continue
		}
		t := r.rules[rule]
		if t == nil || t.last.Limit <= 0 {
			continue
		}
		enforced[r.region] = max(enforced[r.region], t.last.Limit)
		if c.books.rules == nil && r.heard.After(latest) {
			current, latest = t.last.Limit, r.heard
		}
	}
	if current <= 0 {
		return nil
	}
	floor := c.cfg.Budget.Floor(len(regions))
	var out map[string]float64
	for region, l := range enforced {
		if l > current {
			if out == nil {
				out = map[string]float64{}
			}
			out[region] = min(1, floor*float64(l)/float64(current))
		}
	}
	return out
}

// Budgets returns the last leases of every rule, by rule: those this
// coordinator computed, or, since it last restored, those it restored.
func (c *Coordinator) Budgets() []budget.Document {
	out := make([]budget.Document, 0, len(c.docs))
	for _, id := range slices.Sorted(maps.Keys(c.docs)) {
		out = append(out, c.docs[id])
	}
	return out
}

// Budget returns a rule's last leases (zero if none).
func (c *Coordinator) Budget(rule string) budget.Document { return c.docs[rule] }

// Sized tells a leader how many bytes the rule's last document took
// encoded, and how many a document may take (the NATS servers'
// max_payload): it bounds the counters the rule's next documents hold to
// as many as fill fitFraction of that, at the bytes a counter took in this
// one beside the document's own part (budget.Allocator.FitCounters). A
// counter's part grows as it ages (its leases reach more regions, its
// snapshot more windows), hence the margin; a document that did not fit
// (and was not sent) sheds the counters over the bound that would lose
// least, and narrows the rule's bound for good, by fitNarrowing each time
// its documents stop fitting.
func (c *Coordinator) Sized(rule string, size, maxSize int, now time.Time) {
	d, ok := c.docs[rule]
	n := max(len(d.Counters), len(d.CounterSnapshots))
	if c.alloc == nil || !ok || n == 0 || size <= 0 || maxSize <= 0 {
		return
	}
	if size > maxSize && !c.over[rule] {
		c.tooLarge[rule]++
	}
	c.over[rule] = size > maxSize
	own := d
	own.Counters, own.CounterSnapshots = nil, nil
	b, err := json.Marshal(own)
	if err != nil {
		return // plain data
	}
	perCounter := float64(max(1, size-len(b))) / float64(n)
	room := fitFraction * math.Pow(fitNarrowing, float64(c.tooLarge[rule])) * float64(maxSize)
	c.alloc.FitCounters(rule, max(1, int((room-float64(len(b)))/perCounter)), now)
}

// fitFraction is how much of the largest message a document may fill
// (Sized): the rest leaves room for its counters to age, and for counters
// whose keys are longer than those before; fitNarrowing is what remains
// of it each time the documents stop fitting.
const (
	fitFraction  = 0.7
	fitNarrowing = 0.85
)

// Window returns a reported global rule's window.
func (c *Coordinator) Window(rule string) (time.Duration, bool) {
	r, ok := c.rules[rule]
	return r.Window, ok
}

// RegionStatus is what the coordinator knows of a region.
type RegionStatus struct {
	Region string `json:"region"`
	// LastHeardMS is how long ago the region was last heard from; nil
	// (JSON null) if never.
	LastHeardMS *int64 `json:"last_heard_ms"`
	Replicas    int    `json:"replicas"`
	// Suspect is set when the region has been silent for longer than
	// three rebalances: cut off, or down.
	Suspect bool `json:"partition_suspected"`
}

// Status returns every region's status at now.
func (c *Coordinator) Status(now time.Time) []RegionStatus {
	var out []RegionStatus
	for _, name := range c.Regions() {
		st := RegionStatus{Region: name, Suspect: true}
		if at, ok := c.heard[name]; ok {
			ms := now.Sub(at).Milliseconds()
			st.LastHeardMS = &ms
			st.Suspect = now.Sub(at) > 3*c.cfg.Rebalance
		}
		for _, r := range c.replicas {
			if r.region == name && now.Sub(r.heard) <= c.replicaSilence() {
				st.Replicas++
			}
		}
		out = append(out, st)
	}
	return out
}

// Figure is one region's figures for one rule at one time: what the
// leader granted it (its lease's allowance, floor included), whether that
// lease holds, and what it was asked for and admitted, in limits per
// window. Demand and Admitted are of the replicas heard lately: Reported
// says one was (a region cut off has none, and its figures say nothing).
type Figure struct {
	Share    float64 `json:"share"`
	Valid    bool    `json:"lease_valid"`
	Demand   float64 `json:"demand"`
	Admitted float64 `json:"admitted"`
	Reported bool    `json:"reported,omitempty"`
}

// Figures returns every rule's figures at now, by rule and region.
func (c *Coordinator) Figures(now time.Time) map[string]map[string]Figure {
	out := map[string]map[string]Figure{}
	for id := range c.rules {
		points := map[string]Figure{}
		for _, r := range c.replicas {
			if now.Sub(r.heard) > c.replicaSilence() {
				continue
			}
			if t := r.rules[id]; t != nil {
				p := points[r.region]
				p.Demand += t.rate.Rate()
				p.Admitted += t.admitted.Rate()
				p.Reported = p.Reported || now.Sub(r.heard) <= c.demandSilence()
				points[r.region] = p
			}
		}
		if doc, ok := c.docs[id]; ok {
			for region, l := range doc.Leases {
				p := points[region]
				p.Share, p.Valid = l.Floor+l.Share-l.Debt, now.Before(l.Expires)
				points[region] = p
			}
		}
		out[id] = points
	}
	return out
}

// The coordinator's copy of every region's usage: the Counters of
// globalsync's observer gossip node.

// view returns the copy for the regions known now, rebuilt (keeping what
// it held) when a region appears.
func (c *Coordinator) view() *crdt.Counters {
	if c.usage != nil && !c.newRegions {
		return c.usage
	}
	c.newRegions = false
	regions := append(c.Regions(), Name)
	if c.usage != nil && len(regions) == len(c.usage.Regions()) {
		return c.usage // the regions are fixed (Config.Regions), or none is new to the copy
	}
	u, err := crdt.NewCounters(Name, regions)
	if err != nil {
		return c.usage // a region's name the counters refuse: keep the copy as it is
	}
	if c.usage != nil {
		u.Merge(c.usage.DeltaSince(0))
	}
	c.usage = u
	return u
}

// OwnDeltas implements gossip.Counters: globalsync counts nothing of its
// own, and answers no asks.
func (c *Coordinator) OwnDeltas(uint64, int) []crdt.Delta { return nil }

// RegionState implements gossip.Counters: globalsync answers no asks.
func (c *Coordinator) RegionState(string) crdt.Delta { return crdt.Delta{Origin: Name} }

// MergeRemote implements gossip.Counters: a region's slots, into the copy.
// Windows that start more than regional.MaxAhead after the time of the
// last Tick are refused (counted as ahead); before the first Tick, none is.
func (c *Coordinator) MergeRemote(_ context.Context, d crdt.Delta) (crdt.MergeReport, error) {
	ahead := 0
	if !c.lastTick.IsZero() {
		d, ahead = d.Until(c.lastTick.Add(regional.MaxAhead).UnixMilli())
	}
	if c.cfg.Shards > 1 {
		// Another slice's counters: another instance's to keep.
		d, _ = d.Keep(func(en *crdt.Entry) bool { return c.owns(en.Key) })
	}
	unknown := 0
	if b := &c.books; b.rules != nil {
		// With rules, counters of none of them, now or lately, are refused.
		d, unknown = d.Keep(func(en *crdt.Entry) bool {
			if b.rules.OfGlobalRules(en.Key) {
				return true
			}
			for _, e := range b.earlier {
				if e.rules.OfGlobalRules(en.Key) {
					return true
				}
			}
			return false
		})
	}
	rep := c.view().Merge(d)
	rep.Ahead, rep.UnknownRule = ahead, unknown
	return rep, nil
}

// ObserveOwn implements gossip.Counters: globalsync has no slots of its own.
func (c *Coordinator) ObserveOwn(crdt.Delta) {}

// GlobalUsage returns what every region admitted of one counter's window
// (its key, regional.CounterKey, and its start), as the copy has it.
func (c *Coordinator) GlobalUsage(key string, start time.Time) map[string]int64 {
	return c.GlobalCounter(crdt.ID{Key: key, Epoch: start.UnixMilli()}).ByRegion()
}

// Copied is how many counter windows the copy of the usage holds.
func (c *Coordinator) Copied() int { return c.view().Len() }

// GlobalCounter returns the copy of one counter's window.
func (c *Coordinator) GlobalCounter(id crdt.ID) crdt.PNCounter { return c.view().Get(id) }

var _ interface {
	gossip.Counters
	gossip.Heartbeats
} = (*Coordinator)(nil)
