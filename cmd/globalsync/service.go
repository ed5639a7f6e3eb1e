package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// LeaderBucket holds the lease that makes one globalsync the leader.
const (
	LeaderBucket = "geoquota-leader"
	leaderKey    = "globalsync"
)

// Config configures the service. Zero fields take defaults.
type Config struct {
	// ID tells this instance from the others.
	ID string
	// Regions are every region; empty: the regions heard from.
	Regions []string
	// Rebalance is how often budgets are recomputed and published. 1s.
	Rebalance time.Duration
	// LeaderTTL is how long a leader's lease lasts unless renewed; a
	// follower takes over once it has lapsed. 3s.
	LeaderTTL time.Duration
	// Budget configures the allocator.
	Budget budget.Config
	// Prefix starts the gossip subjects. "geoquota".
	Prefix string
	// Rules, if set, are the rules the regions enforce: with them the
	// leader knows each counter's limit and closes the books of every
	// window (over-admission, carry_debt).
	Rules *regional.RuleSet
	// RulesYAML, if set, reads the rules to publish to every region: the
	// leader calls it every rebalance and publishes what changed. The
	// rules it publishes are also those it closes the books with.
	RulesYAML func() ([]byte, error)
	// AntiEntropy is how often globalsync asks the regions for usage it
	// missed. 10s.
	AntiEntropy time.Duration
	// Registry, if set, gets the service's metrics.
	Registry *prometheus.Registry
	Clock    func() time.Time
	Logger   *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Rebalance <= 0 {
		c.Rebalance = time.Second
	}
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = 3 * time.Second
	}
	if c.Budget == (budget.Config{}) {
		c.Budget = budget.DefaultConfig()
	}
	if c.Prefix == "" {
		c.Prefix = "geoquota"
	}
	if c.AntiEntropy <= 0 {
		c.AntiEntropy = 10 * time.Second
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Service is one globalsync instance: it hears every replica's heartbeat,
// and while it leads, computes and publishes the budgets.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	budgets jetstream.KeyValue
	leases  jetstream.KeyValue
	rulesKV jetstream.KeyValue
	subs    []*nats.Subscription

	mu        sync.Mutex
	replicas  map[string]*replica // by replica id
	rules     map[string]budget.Rule
	regions   map[string]time.Time // heard from, when
	listed    map[string]bool      // named by a region's --regions
	alloc     *budget.Allocator    // while leading
	leader    bool
	leaderRev uint64
	revs      map[string]uint64 // budget key → last revision seen
	docs      map[string]transport.BudgetDoc

	usage    *usageView
	rulesSet *regional.RuleSet
	rulesRev uint64 // the rules bucket's revision of rulesSet, once published
	// earlierRules are the rule sets in force before rulesSet, each until
	// it was replaced: a window's books are closed against the limits in
	// force while it ran.
	earlierRules   []earlierRules
	reconciled     map[crdt.ID]bool
	overAdmitted   *prometheus.CounterVec
	found          []OverAdmission // the latest, for tests and the API
	digestSeq      uint64
	lastReconcile  time.Time
	booksClosed    time.Time // every window that ended by then is reconciled
	inheritedBooks time.Time // booksClosed of the leaders before this one
	rulesPublished bool

	history []DashboardSample // the dashboard's, oldest first

	cancel context.CancelFunc
	done   chan struct{}
}

type replica struct {
	region string
	heard  time.Time
	rules  map[string]*demandTrack
}

// demandTrack is a replica's last report on a rule and its rate of
// demand.
type demandTrack struct {
	last     transport.RuleReport
	rate     budget.DemandRate
	admitted budget.DemandRate // what was admitted, for the dashboard
}

// add records a heartbeat's report.
func (t *demandTrack) add(rep transport.RuleReport, now time.Time) {
	t.last = rep
	window := time.Duration(rep.WindowMillis) * time.Millisecond
	t.rate.Add(rep.Admitted+rep.Denied, window, now)
	t.admitted.Add(rep.Admitted, window, now)
}

// Start makes the buckets if need be, subscribes to heartbeats, and starts
// the rebalancing loop. Stop it with Close.
func Start(ctx context.Context, nc *nats.Conn, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Budget.Validate(); err != nil {
		return nil, err
	}
	// A leader taking over reads every lease still in force from the
	// bucket's history: a lease's life must fit in it.
	if cfg.Budget.LeaseTTL+cfg.Budget.Skew > time.Duration(transport.BudgetHistory-2)*cfg.Rebalance {
		return nil, fmt.Errorf("globalsync: --lease-ttl %v is more than the %d rebalances (--rebalance %v) whose leases the budget bucket keeps",
			cfg.Budget.LeaseTTL, transport.BudgetHistory-2, cfg.Rebalance)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, nc: nc, js: js, replicas: map[string]*replica{}, rules: map[string]budget.Rule{},
		regions: map[string]time.Time{}, listed: map[string]bool{}, revs: map[string]uint64{}, docs: map[string]transport.BudgetDoc{}, done: make(chan struct{}),
		rulesSet: cfg.Rules, reconciled: map[crdt.ID]bool{}, overAdmitted: newOverAdmittedMetric()}
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(s.overAdmitted, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "geoquota_globalsync_leader",
			Help: "1 while this globalsync instance leads."}, func() float64 {
			if s.Leader() {
				return 1
			}
			return 0
		}))
	}
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if s.budgets, err = js.CreateOrUpdateKeyValue(kctx, jetstream.KeyValueConfig{Bucket: transport.BudgetsBucket,
		History: transport.BudgetHistory, Description: "geoquota budget leases, one key per global rule"}); err != nil {
		return nil, fmt.Errorf("globalsync: bucket %s: %w", transport.BudgetsBucket, err)
	}
	if s.rulesKV, err = js.CreateOrUpdateKeyValue(kctx, transport.RulesBucketConfig); err != nil {
		return nil, fmt.Errorf("globalsync: bucket %s: %w", transport.RulesBucket, err)
	}
	if s.leases, err = js.CreateOrUpdateKeyValue(kctx, jetstream.KeyValueConfig{Bucket: LeaderBucket,
		Description: "the lease of the leading globalsync"}); err != nil {
		return nil, fmt.Errorf("globalsync: bucket %s: %w", LeaderBucket, err)
	}
	for subject, h := range map[string]nats.MsgHandler{
		cfg.Prefix + ".heartbeat.*":               s.onHeartbeat,
		cfg.Prefix + ".delta.*":                   s.onDelta,
		cfg.Prefix + ".repair." + selfName + ".*": s.onDelta,
	} {
		sub, err := nc.Subscribe(subject, h)
		if err != nil {
			for _, sub := range s.subs {
				sub.Unsubscribe()
			}
			return nil, err
		}
		s.subs = append(s.subs, sub)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		cfg.Logger.Warn("globalsync: subscription not confirmed", "err", err)
	}
	loop, stop := context.WithCancel(context.Background())
	s.cancel = stop
	go s.run(loop)
	return s, nil
}

// Close stops the service. A leader's lease is left to lapse: a follower
// takes over within one LeaderTTL.
func (s *Service) Close() {
	s.cancel()
	<-s.done
	for _, sub := range s.subs {
		sub.Unsubscribe()
	}
}

// Leader reports whether this instance leads.
func (s *Service) Leader() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leader
}

func (s *Service) onHeartbeat(m *nats.Msg) {
	var hb transport.Heartbeat
	if err := json.Unmarshal(m.Data, &hb); err != nil || hb.Region == "" || hb.Replica == "" ||
		hb.Region != m.Subject[strings.LastIndexByte(m.Subject, '.')+1:] {
		return
	}
	now := s.cfg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.regions[hb.Region] = now
	for _, r := range hb.Regions {
		if r != "" && len(r) <= 64 && !strings.ContainsAny(r, ". *>") {
			s.listed[r] = true
		}
	}
	r := s.replicas[hb.Replica]
	if r == nil || r.region != hb.Region {
		r = &replica{region: hb.Region, rules: map[string]*demandTrack{}}
		s.replicas[hb.Replica] = r
	}
	r.heard = now
	for id, rep := range hb.Rules {
		if id == "" || rep.WindowMillis <= 0 || rep.WindowMillis > maxWindowMillis {
			continue
		}
		s.rules[id] = budget.Rule{ID: id, Window: time.Duration(rep.WindowMillis) * time.Millisecond,
			Sliding: rep.Algorithm == "sliding_window_counter"}
		t := r.rules[id]
		if t == nil {
			t = &demandTrack{}
			r.rules[id] = t
		}
		t.add(rep, now)
	}
}

func (s *Service) run(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Rebalance)
	defer t.Stop()
	ae := time.NewTicker(s.cfg.AntiEntropy)
	defer ae.Stop()
	s.publishDigest()
	for {
		s.tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ae.C:
			s.mu.Lock()
			s.expireUsage(s.cfg.Clock())
			s.mu.Unlock()
			s.publishDigest()
		case <-t.C:
		}
	}
}

// tick keeps or seeks the lead and, leading, rebalances every rule.
func (s *Service) tick(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Rebalance)
	defer cancel()
	defer s.sample()
	s.forgetReplicas()
	if !s.lead(ctx) {
		return
	}
	if err := s.publishRules(ctx); err != nil {
		s.cfg.Logger.Warn("globalsync: rules not published", "err", err)
	}
	s.pushRules()
	if err := s.rebalance(ctx); err != nil {
		s.cfg.Logger.Warn("globalsync: rebalance", "err", err)
	}
}

// pushRules pushes the rules last published, every tick: a region that
// was cut off has them within a tick of hearing globalsync again, before
// JetStream answers it (see transport.PushRulesSubject).
func (s *Service) pushRules() {
	s.mu.Lock()
	rs, rev, published := s.rulesSet, s.rulesRev, s.rulesPublished
	s.mu.Unlock()
	if rs == nil || rev == 0 || !published {
		return
	}
	if err := transport.PushRules(s.nc, rev, rs.YAML()); err != nil {
		s.cfg.Logger.Warn("globalsync: rules not pushed", "err", err)
	}
}

// publishRules publishes the rules if they changed since last published.
func (s *Service) publishRules(ctx context.Context) error {
	if s.cfg.RulesYAML == nil {
		return nil
	}
	yaml, err := s.cfg.RulesYAML()
	if err != nil {
		return err
	}
	if s.rulesSet != nil && bytes.Equal(yaml, s.rulesSet.YAML()) && s.rulesPublished {
		return nil
	}
	rs, err := regional.Parse("rules", yaml)
	if err != nil {
		return err // the last good rules stay published
	}
	var rev uint64
	if en, err := s.rulesKV.Get(ctx, transport.RulesKey); err == nil && bytes.Equal(en.Value(), yaml) {
		rev = en.Revision()
	} else {
		if rev, err = transport.PublishRules(ctx, s.rulesKV, yaml); err != nil {
			return err
		}
		s.cfg.Logger.Info("rules published", "rules", len(rs.Rules()))
	}
	s.mu.Lock()
	if s.rulesSet != nil && !bytes.Equal(s.rulesSet.YAML(), rs.YAML()) {
		s.earlierRules = append(s.earlierRules, earlierRules{s.rulesSet, s.cfg.Clock()})
		if len(s.earlierRules) > maxEarlierRules {
			s.earlierRules = s.earlierRules[1:]
		}
	}
	s.rulesSet, s.rulesPublished, s.rulesRev = rs, true, rev
	s.mu.Unlock()
	return nil
}

type leaderLease struct {
	ID         string `json:"id"`
	UntilMilli int64  `json:"until_ms"`
}

// lead renews this instance's lease, or takes the lead if the lease has
// lapsed; it reports whether this instance leads. Compare-and-swap on the
// key's revision makes sure only one instance holds it.
func (s *Service) lead(ctx context.Context) bool {
	now := s.cfg.Clock()
	val, _ := json.Marshal(leaderLease{ID: s.cfg.ID, UntilMilli: now.Add(s.cfg.LeaderTTL).UnixMilli()})
	s.mu.Lock()
	leading, rev := s.leader, s.leaderRev
	s.mu.Unlock()
	if leading {
		nrev, err := s.leases.Update(ctx, leaderKey, val, rev)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.leader = false
			s.cfg.Logger.Warn("globalsync: lost the lead", "err", err)
			return false
		}
		s.leaderRev = nrev
		return true
	}
	var nrev uint64
	en, err := s.leases.Get(ctx, leaderKey)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		nrev, err = s.leases.Create(ctx, leaderKey, val)
	case err == nil:
		var cur leaderLease
		if json.Unmarshal(en.Value(), &cur) == nil && cur.ID != s.cfg.ID &&
			now.UnixMilli() < cur.UntilMilli+s.cfg.Budget.Skew.Milliseconds() {
			return false // another leads
		}
		// Lapsed, or ours (this instance lost its step, a publish
		// refused): take it, and start afresh from the bucket.
		nrev, err = s.leases.Update(ctx, leaderKey, val, en.Revision())
	}
	if err != nil {
		return false
	}
	tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.takeOver(tctx); err != nil {
		s.cfg.Logger.Warn("globalsync: taking the lead", "err", err)
		return false
	}
	s.mu.Lock()
	s.leader, s.leaderRev = true, nrev
	s.mu.Unlock()
	s.cfg.Logger.Info("globalsync: leading", "id", s.cfg.ID)
	return true
}

// takeOver starts a fresh allocator that knows every lease the previous
// leaders issued that may still be in force.
func (s *Service) takeOver(ctx context.Context) error {
	alloc, err := budget.NewAllocator(s.cfg.Budget)
	if err != nil {
		return err
	}
	revs, docs := map[string]uint64{}, map[string]transport.BudgetDoc{}
	var closed time.Time
	keys, err := s.budgets.ListKeys(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	for key := range keys.Keys() {
		hist, err := s.budgets.History(ctx, key)
		if err != nil {
			return err
		}
		var all []transport.BudgetDoc
		for _, en := range hist {
			revs[key] = max(revs[key], en.Revision())
			if d, err := transport.DecodeBudgetDoc(en.Value()); err == nil {
				all = append(all, d)
			}
		}
		if len(all) == 0 {
			continue
		}
		docs[key] = all[len(all)-1]
		transport.RestoreAllocator(alloc, all, s.cfg.Budget.Skew)
		closed = laterOf(closed, docs[key].BooksClosed)
	}
	s.mu.Lock()
	s.alloc, s.revs, s.docs = alloc, revs, docs
	// The books the previous leaders closed stay closed: over-admission
	// is counted, and debt charged, once.
	s.inheritedBooks = laterOf(s.inheritedBooks, closed)
	s.mu.Unlock()
	return nil
}

// rebalance computes every rule's leases from the replicas' reports and
// publishes them.
func (s *Service) rebalance(ctx context.Context) error {
	now := s.cfg.Clock()
	s.mu.Lock()
	if found := s.reconcile(now); len(found) > 0 {
		s.found = append(s.found, found...)
	}
	regions := s.knownRegions()
	type pub struct {
		key string
		doc transport.BudgetDoc
		rev uint64
	}
	var pubs []pub
	for _, rule := range s.sortedRules() {
		for _, region := range regions {
			if rep, ok := s.regionReport(rule, region, now); ok {
				s.alloc.Report(rule.ID, rep)
			}
		}
		if !s.reported(rule, now) {
			// No replica has reported the rule for long (every lease
			// lapsed, every window it counted in over): it is no
			// longer global anywhere.
			delete(s.rules, rule.ID)
			s.alloc.Forget(rule.ID)
			continue
		}
		rule.Floors = s.higherFloors(rule.ID, regions, now)
		leases, err := s.alloc.Rebalance(now, rule, regions)
		if err != nil {
			s.cfg.Logger.Warn("globalsync: rule skipped", "rule", rule.ID, "err", err)
			continue
		}
		key := transport.BudgetKey(rule.ID)
		doc := transport.NewBudgetDoc(s.cfg.ID, leases)
		doc.SetSnapshot(s.alloc.Snapshot(rule.ID))
		doc.BooksClosed = laterOf(s.booksClosed, s.inheritedBooks)
		pubs = append(pubs, pub{key, doc, s.revs[key]})
	}
	s.mu.Unlock()
	var errs []error
	for _, p := range pubs {
		b, _ := json.Marshal(p.doc)
		var rev uint64
		var err error
		if p.rev == 0 {
			rev, err = s.budgets.Create(ctx, p.key, b)
		} else {
			rev, err = s.budgets.Update(ctx, p.key, b, p.rev)
		}
		if err == nil {
			if perr := transport.PushBudget(s.nc, rev, b); perr != nil {
				s.cfg.Logger.Warn("globalsync: budget not pushed", "rule", p.doc.Rule, "err", perr)
			}
		}
		if err != nil {
			// Another instance wrote since: it leads now, or did.
			errs = append(errs, fmt.Errorf("publish %s: %w", p.doc.Rule, err))
			s.mu.Lock()
			s.leader = false
			s.mu.Unlock()
			break
		}
		s.mu.Lock()
		s.revs[p.key], s.docs[p.key] = rev, p.doc
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// regionReport sums a region's live replicas' reports on a rule: demand
// adds up (of the replicas heard within demandSilence); the lease acknowledged is the oldest any replica acknowledges
// (each replica enforces its own); what was used is the most any saw, if
// all speak of the same window. The caller holds s.mu.
func (s *Service) regionReport(rule budget.Rule, region string, now time.Time) (budget.Report, bool) {
	rep := budget.Report{Region: region}
	found, sameEpoch, epoch := false, true, int64(0)
	for _, r := range s.replicas {
		if r.region != region || now.Sub(r.heard) > s.replicaSilence() {
			continue
		}
		t := r.rules[rule.ID]
		if t == nil {
			continue
		}
		if !found {
			rep.Acked, epoch = t.last.Acked, t.last.UsedEpoch
		}
		found = true
		if now.Sub(r.heard) <= s.demandSilence() {
			rep.Demand += t.rate.Rate()
		}
		rep.Acked = min(rep.Acked, t.last.Acked)
		rep.Used = max(rep.Used, t.last.Used)
		if t.last.UsedEpoch != epoch {
			sameEpoch = false
		}
	}
	rep.UsedEpoch, rep.HasUsed = epoch, found && sameEpoch && rep.Acked > 0
	return rep, found
}

// maxWindowMillis bounds the window a heartbeat may report: a year.
const maxWindowMillis = 366 * 24 * 3600 * 1000

// replicaSilence is how long a replica may be silent before it no longer
// counts: it may hold a lease it got after its last heartbeat, in force for
// a lease's life and the skew allowance after.
func (s *Service) replicaSilence() time.Duration {
	return s.cfg.Budget.LeaseTTL + s.cfg.Budget.Skew + 2*time.Second
}

// demandSilence is how long a replica may be silent before its demand is
// no longer believed: a region cut off stops being renewed at its share
// (leases it cannot receive would keep the share from the others for a
// lease's life after they were issued), while its acknowledgements still
// count for replicaSilence.
func (s *Service) demandSilence() time.Duration { return max(3*s.cfg.Rebalance, minDemandSilence) }

// minDemandSilence is four of the regions' heartbeats (500ms).
const minDemandSilence = 2 * time.Second

// reported says whether a replica reported the rule lately: within a
// lease's life and two of the rule's windows. The caller holds s.mu.
func (s *Service) reported(rule budget.Rule, now time.Time) bool {
	for _, r := range s.replicas {
		if t := r.rules[rule.ID]; t != nil && !t.rate.Last().IsZero() &&
			now.Sub(t.rate.Last()) <= s.replicaSilence()+2*rule.Window {
			return true
		}
	}
	return false
}

// knownRegions are the regions the budgets are split over: --regions,
// else every region heard from or named by one that was.
func (s *Service) knownRegions() []string {
	if len(s.cfg.Regions) > 0 {
		return s.cfg.Regions
	}
	all := maps.Clone(s.listed)
	for r := range s.regions {
		all[r] = true
	}
	return slices.Sorted(maps.Keys(all))
}

// forgetReplicas forgets the replicas silent for longer than
// replicaForget, leader or not.
func (s *Service) forgetReplicas() {
	now := s.cfg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range s.replicas {
		if now.Sub(r.heard) > replicaForget {
			delete(s.replicas, id)
		}
	}
}

// replicaForget is how long a replica may be silent before globalsync
// forgets it: it is gone, or cut off for so long that it is the operator's
// concern (see the runbook).
const replicaForget = 10 * time.Minute

// higherFloors returns the floors, as fractions of the rule's limit now,
// of regions whose replicas last said they enforce a higher limit: a
// region cut off when the limit was lowered keeps its floor of the old
// limit until it hears of the new. The limit now is the rules file's, or
// else the one the replica heard last reported. The caller holds s.mu.
func (s *Service) higherFloors(rule string, regions []string, now time.Time) map[string]float64 {
	current, latest := int64(0), time.Time{}
	if s.rulesSet != nil {
		if r := s.rulesSet.Rule(rule); r != nil {
			current = r.Base.Limit
		}
	}
	enforced := map[string]int64{}
	for _, r := range s.replicas {
		if now.Sub(r.heard) > replicaForget {
			continue
		}
		t := r.rules[rule]
		if t == nil || t.last.Limit <= 0 {
			continue
		}
		enforced[r.region] = max(enforced[r.region], t.last.Limit)
		if s.rulesSet == nil && r.heard.After(latest) {
			current, latest = t.last.Limit, r.heard
		}
	}
	if current <= 0 {
		return nil
	}
	floor := s.cfg.Budget.Floor(len(regions))
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

func (s *Service) sortedRules() []budget.Rule {
	ids := slices.Sorted(maps.Keys(s.rules))
	out := make([]budget.Rule, len(ids))
	for i, id := range ids {
		out[i] = s.rules[id]
	}
	return out
}

// Budgets returns the last published leases of every rule.
func (s *Service) Budgets() []transport.BudgetDoc {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Collect(maps.Values(s.docs))
	slices.SortFunc(out, func(a, b transport.BudgetDoc) int { return strings.Compare(a.Rule, b.Rule) })
	return out
}

// OverAdmissions returns every over-admission found so far.
func (s *Service) OverAdmissions() []OverAdmission {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.found)
}

// GlobalUsage returns what every region admitted of one counter's window,
// as globalsync's copy has it.
func (s *Service) GlobalUsage(key string, startMillis int64) map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.view(); c != nil {
		return c.Get(crdt.ID{Key: key, Epoch: startMillis}).ByRegion()
	}
	return map[string]int64{}
}

// RegionStatus is what globalsync knows of a region.
type RegionStatus struct {
	Region      string `json:"region"`
	LastHeardMS int64  `json:"last_heard_ms"`
	Replicas    int    `json:"replicas"`
	// Suspect is set when the region has been silent for longer than a
	// lease: cut off, or down.
	Suspect bool `json:"partition_suspected"`
}

// Regions returns every region's status.
func (s *Service) Regions() []RegionStatus {
	now := s.cfg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []RegionStatus
	for _, name := range s.knownRegions() {
		st := RegionStatus{Region: name, LastHeardMS: -1, Suspect: true}
		if at, ok := s.regions[name]; ok {
			st.LastHeardMS = now.Sub(at).Milliseconds()
			st.Suspect = now.Sub(at) > 3*s.cfg.Rebalance
		}
		for _, r := range s.replicas {
			if r.region == name && now.Sub(r.heard) <= s.replicaSilence() {
				st.Replicas++
			}
		}
		out = append(out, st)
	}
	return out
}
