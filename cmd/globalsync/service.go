package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/control"
	"github.com/geoquota/geoquota/transport/gossip"
	"github.com/geoquota/geoquota/transport/namespace"
)

// Config configures the service. Zero fields take defaults.
type Config struct {
	// ID tells this instance from the others.
	ID string
	// URL is where operators reach this instance's dashboard: the
	// leader's claim names it, so that a follower's dashboard links to
	// the leader's. Empty: not known (SetURL may tell it later).
	URL string
	// Regions are every region; empty: the regions heard from.
	Regions []string
	// Rebalance is how often budgets are recomputed and published. 1s.
	Rebalance time.Duration
	// LeaderTTL is how long a leader's claim lasts unless renewed; a
	// follower takes over once it has lapsed. 3s.
	LeaderTTL time.Duration
	// Budget configures the allocator.
	Budget budget.Config
	// Shard and Shards run this instance as one of Shards, each the leader
	// of the slice of the counters whose keys hash to its Shard
	// (coord.Config): its own claim in the leader bucket
	// (control.ShardLeaderKey), its own key of each rule in the budgets
	// bucket (control.ShardBudgetKey). Slice 0's leader publishes the
	// rules. 0 or 1 shards: one slice.
	Shard, Shards int
	// Names are the subjects and buckets of the deployment; the zero
	// value is the unnamed deployment's.
	Names namespace.Names
	// RedactKeys reports over-admissions with regional.RedactKey's hash
	// in place of the counter's key (--key-redaction hash, the default).
	RedactKeys bool
	// Rules, if set, are the rules the regions enforce: with them the
	// leader knows each counter's limit and closes the books of every
	// window (over-admission, carry_debt).
	Rules *regional.RuleSet
	// RulesYAML, if set, reads the rules to publish to every region: the
	// leader calls it every rebalance and publishes what changed. The
	// rules it publishes are also those it closes the books with.
	RulesYAML func() ([]byte, error)
	// StrictRules refuses to publish rules that load with warnings
	// (regional.RuleSet.Strict): --rules-strict.
	StrictRules bool
	// AntiEntropy is how often the regions say how far their gossip
	// runs, so that globalsync finds and asks for usage it missed. 10s.
	AntiEntropy time.Duration
	// Registry, if set, gets the service's metrics.
	Registry *prometheus.Registry
	// Clock gives the service and its gossip node their time; nil means
	// time.Now.
	Clock func() time.Time
	// Manual leaves the ticking to the caller (Service.Tick, and the
	// gossip's Tick): a test that drives time. Otherwise goroutines tick
	// both when due, until Close.
	Manual bool
	Logger *slog.Logger
}

// withDefaults fills in the defaults; those of the coordinator's
// settings are the coordinator's (coord.Config).
func (c Config) withDefaults() Config {
	if c.LeaderTTL <= 0 {
		c.LeaderTTL = 3 * time.Second
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Service is one globalsync instance: the coordinator (budget/coord)
// driven over NATS. Its gossip node hears every replica's heartbeat and
// every region's usage; while this instance leads (a claim in JetStream KV,
// taken with compare-and-swap), it publishes the coordinator's budget
// documents in the budgets bucket, and the rules in the rules bucket. Its
// methods are safe for concurrent use.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	subjects namespace.Names
	budgets  jetstream.KeyValue
	claims   jetstream.KeyValue
	rulesKV  jetstream.KeyValue
	gossip   *control.Gossip
	pushed   *nats.Subscription // the budget documents the leader pushes

	mu        sync.Mutex // over the coordinator, and the fields below
	coord     *coord.Coordinator
	leaderRev uint64            // the leader claim's revision, while leading
	revs      map[string]uint64 // budget key → last revision seen
	rulesRev  uint64            // the rules bucket's revision of the rules published
	url       string            // Config.URL, or as SetURL set it
	// claim is the leader's claim as this instance last read or wrote
	// it, at claimAt; claimAt is zero while the last try to read or take
	// it failed (who leads is not known).
	claim   leaderClaim
	claimAt time.Time
	history []DashboardSample // the dashboard's, oldest first
	faults  faultLog          // the dashboard's faults and leader changes
	moves   moveLog           // the dashboard's lease moves

	overAdmitted *prometheus.CounterVec
	debtCounted  *prometheus.CounterVec // past the limit of rules that count every hit

	// agreed is false while slice 0's leader was last found to cut the
	// counters otherwise (sameSlicing).
	agreed atomic.Bool

	closeOnce sync.Once
	closed    atomic.Bool
	stop      chan struct{}
	done      chan struct{}
}

// Start makes the buckets if need be, joins the gossip, and, unless
// Manual, starts rebalancing. Stop it with Close.
func Start(ctx context.Context, nc *nats.Conn, cfg Config) (*Service, error) {
	cfg = cfg.withDefaults()
	c, err := coord.New(coord.Config{ID: cfg.ID, Regions: cfg.Regions, Rebalance: cfg.Rebalance, AntiEntropy: cfg.AntiEntropy,
		Budget: cfg.Budget, Shard: cfg.Shard, Shards: cfg.Shards})
	if err != nil {
		return nil, fmt.Errorf("globalsync: %w", err)
	}
	cc := c.Config()
	cfg.Rebalance, cfg.AntiEntropy, cfg.Budget = cc.Rebalance, cc.AntiEntropy, cc.Budget
	if cfg.Rules != nil {
		c.SetRules(cfg.Clock(), cfg.Rules)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, nc: nc, coord: c, revs: map[string]uint64{}, overAdmitted: newOverAdmittedMetric(),
		debtCounted: newDebtCountedMetric(), url: cfg.URL,
		stop: make(chan struct{}), done: make(chan struct{})}
	s.agreed.Store(true)
	if cfg.Registry != nil {
		cfg.Registry.MustRegister(s.overAdmitted, s.debtCounted, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "geoquota_globalsync_leader",
			Help: "1 while this globalsync instance leads."}, func() float64 {
			if s.Leader() {
				return 1
			}
			return 0
		}))
	}
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if s.budgets, err = js.CreateOrUpdateKeyValue(kctx, control.BudgetsBucketConfig(cfg.Names)); err != nil {
		return nil, fmt.Errorf("globalsync: bucket %s: %w", cfg.Names.BudgetsBucket(), err)
	}
	if s.rulesKV, err = js.CreateOrUpdateKeyValue(kctx, control.RulesBucketConfig(cfg.Names)); err != nil {
		return nil, fmt.Errorf("globalsync: bucket %s: %w", cfg.Names.RulesBucket(), err)
	}
	if s.claims, err = js.CreateOrUpdateKeyValue(kctx, control.LeaderBucketConfig(cfg.Names)); err != nil {
		return nil, fmt.Errorf("globalsync: bucket %s: %w", cfg.Names.LeaderBucket(), err)
	}
	node, err := gossip.New(gossip.Config{Region: coord.Name, Replica: coord.Name + "-" + cfg.ID, Instance: control.NewInstance(),
		Names: cfg.Names, AntiEntropy: cfg.AntiEntropy, Observer: true, Regions: cfg.Regions, Counters: locked{s}, Heartbeats: locked{s}}, cfg.Clock())
	if err != nil {
		return nil, fmt.Errorf("globalsync: %w", err)
	}
	s.subjects = node.Names()
	// Following, the coordinator is given the leader's documents as they
	// are pushed: the dashboard and the API show the leases in force.
	if s.pushed, err = nc.Subscribe(s.subjects.PushBudgets(), s.observePushed); err != nil {
		return nil, fmt.Errorf("globalsync: subscribing to the pushed budgets: %w", err)
	}
	if s.gossip, err = control.StartGossip(nc, node, control.GossipOptions{Clock: cfg.Clock, Manual: cfg.Manual, Logger: cfg.Logger}); err != nil {
		s.pushed.Unsubscribe()
		return nil, fmt.Errorf("globalsync: %w", err)
	}
	if cfg.Manual {
		close(s.done)
	} else {
		go s.run()
	}
	return s, nil
}

// Close stops the service. A leader's claim is left to lapse: a follower
// takes over within one LeaderTTL.
func (s *Service) Close() {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.done
		s.pushed.Unsubscribe()
		s.gossip.Close()
	})
}

// observePushed hands the coordinator a budget document the leader
// pushed; it keeps it only while following.
func (s *Service) observePushed(m *nats.Msg) {
	doc, err := budget.DecodeDocument(m.Data)
	if err != nil {
		s.cfg.Logger.Warn("globalsync: pushed budget document ignored", "err", err)
		return
	}
	s.with(func(c *coord.Coordinator) { c.Observe(doc) })
}

// SetURL sets where operators reach this instance's dashboard (Config.URL),
// for the claims it writes from now on.
func (s *Service) SetURL(url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.url = url
}

// Gossip returns the service's gossip, to tick it by hand (Manual).
func (s *Service) Gossip() *control.Gossip { return s.gossip }

// Leader reports whether this instance leads.
func (s *Service) Leader() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.coord.Leading()
}

// Readiness says whether the instance is ready to serve (/readyz): it is
// connected to NATS, and it knows whether it leads or which instance
// does, from the leader's claim it read or wrote within the last leader
// TTL.
type Readiness struct {
	Ready bool `json:"ready"`
	// Role is "leader" or "follower" while ready.
	Role string `json:"role,omitempty"`
	// Leader is the leading instance's ID, and LeaderURL its dashboard
	// if it said where that is.
	Leader    string `json:"leader,omitempty"`
	LeaderURL string `json:"leader_url,omitempty"`
	// Reason says why the instance is not ready.
	Reason string `json:"reason,omitempty"`
}

// Readiness returns whether the instance is ready to serve, and its role.
func (s *Service) Readiness() Readiness {
	now := s.cfg.Clock()
	s.mu.Lock()
	claim, at, leading := s.claim, s.claimAt, s.coord.Leading()
	s.mu.Unlock()
	switch {
	case s.closed.Load():
		return Readiness{Reason: "shutting down"}
	case !s.nc.IsConnected():
		return Readiness{Reason: "not connected to NATS (" + s.nc.Status().String() + ")"}
	case at.IsZero():
		return Readiness{Reason: "does not know who leads: the leader's claim (JetStream KV bucket " +
			s.cfg.Names.LeaderBucket() + ") could not be read or taken at the last try, or not yet"}
	case now.Sub(at) > s.cfg.LeaderTTL:
		return Readiness{Reason: fmt.Sprintf("last read the leader's claim %v ago, more than the leader TTL (%v)",
			now.Sub(at).Round(time.Millisecond), s.cfg.LeaderTTL)}
	}
	r := Readiness{Ready: true, Role: "follower", Leader: claim.ID, LeaderURL: claim.URL}
	if leading && claim.ID == s.cfg.ID {
		r.Role = "leader"
	}
	return r
}

func (s *Service) run() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Rebalance)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	for {
		s.Tick(ctx)
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
	}
}

// Tick does one rebalance's work: it keeps or seeks the lead and, leading,
// publishes the rules and every rule's budget document.
func (s *Service) Tick(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Rebalance)
	defer cancel()
	now := s.cfg.Clock()
	defer s.sample(now)
	s.with(func(c *coord.Coordinator) { c.Tick(now) })
	if !s.lead(ctx, now) {
		return
	}
	if err := s.publishRules(ctx, now); err != nil {
		s.cfg.Logger.Warn("globalsync: rules not published", "err", err)
	}
	s.pushRules()
	if err := s.rebalance(ctx, now); err != nil {
		s.cfg.Logger.Warn("globalsync: rebalance", "err", err)
	}
}

// with runs f on the coordinator, alone.
func (s *Service) with(f func(*coord.Coordinator)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.coord)
}

// pushRules pushes the rules last published, every tick: a region that
// was cut off has them within a tick of hearing globalsync again, before
// JetStream answers it (see control.PushRules).
func (s *Service) pushRules() {
	s.mu.Lock()
	rs, rev := s.coord.Rules(), s.rulesRev
	s.mu.Unlock()
	if rs == nil || rev == 0 {
		return
	}
	if err := control.PushRules(s.nc, s.subjects, rev, rs.YAML()); err != nil {
		s.cfg.Logger.Warn("globalsync: rules not pushed", "err", err)
	}
}

// publishRules publishes the rules if they changed since last published.
func (s *Service) publishRules(ctx context.Context, now time.Time) error {
	if s.cfg.RulesYAML == nil {
		return nil
	}
	yaml, err := s.cfg.RulesYAML()
	if err != nil {
		return err
	}
	s.mu.Lock()
	cur, published := s.coord.Rules(), s.rulesRev > 0
	s.mu.Unlock()
	if cur != nil && bytes.Equal(yaml, cur.YAML()) && (published || s.cfg.Shard > 0) {
		return nil
	}
	rs, err := regional.Parse("rules", yaml)
	if err == nil && s.cfg.StrictRules {
		if err = rs.Strict(); err != nil {
			err = fmt.Errorf("--rules-strict: %w", err)
		}
	}
	if err != nil {
		return err // the last good rules stay published
	}
	var rev uint64
	if s.cfg.Shard > 0 {
		// Slice 0's leader publishes them; this one closes its books
		// with them.
		s.mu.Lock()
		s.coord.SetRules(now, rs)
		s.mu.Unlock()
		return nil
	}
	if en, err := s.rulesKV.Get(ctx, control.RulesKey); err == nil && bytes.Equal(en.Value(), yaml) {
		rev = en.Revision()
	} else {
		if rev, err = control.PublishRules(ctx, s.rulesKV, yaml); err != nil {
			return err
		}
		s.cfg.Logger.Info("rules published", "rules", len(rs.Rules()), "warnings", len(rs.Warnings()))
		for _, w := range rs.Warnings() {
			s.cfg.Logger.Warn("rules: read and not enforced (--rules-strict refuses such rules)", "warning", w)
		}
	}
	s.mu.Lock()
	s.coord.SetRules(now, rs)
	s.rulesRev = rev
	s.mu.Unlock()
	return nil
}

// leaderClaim is the leader's claim, the value of control.LeaderKey in the
// leader bucket (control.ShardLeaderKey of its slice). URL, if known, is
// the leader's dashboard; Shards, the slices it runs with (--shards; 0:
// one).
type leaderClaim struct {
	ID         string `json:"id"`
	UntilMilli int64  `json:"until_ms"`
	Shards     int    `json:"shards,omitempty"`
	URL        string `json:"url,omitempty"`
}

// lead renews this instance's claim, or takes the lead if the claim has
// lapsed; it reports whether this instance leads. Compare-and-swap on the
// key's revision makes sure only one instance holds it. It notes the
// claim it read or wrote (nothing if it could do neither): who leads.
func (s *Service) lead(ctx context.Context, now time.Time) bool {
	s.mu.Lock()
	own := leaderClaim{ID: s.cfg.ID, UntilMilli: now.Add(s.cfg.LeaderTTL).UnixMilli(), URL: s.url}
	if s.cfg.Shards > 1 {
		own.Shards = s.cfg.Shards
	}
	leading, rev := s.coord.Leading(), s.leaderRev
	s.mu.Unlock()
	if s.cfg.Shard > 0 && !s.sameSlicing(ctx, now) {
		if leading {
			s.mu.Lock()
			s.coord.Follow()
			s.claimAt = time.Time{}
			s.mu.Unlock()
		}
		return false
	}
	val, _ := json.Marshal(own)
	if leading {
		nrev, err := s.claims.Update(ctx, control.ShardLeaderKey(s.cfg.Shard), val, rev)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			s.coord.Follow()
			s.claimAt = time.Time{}
			s.cfg.Logger.Warn("globalsync: lost the lead", "err", err)
			return false
		}
		s.leaderRev = nrev
		s.claim, s.claimAt = own, now
		return true
	}
	var nrev uint64
	en, err := s.claims.Get(ctx, control.ShardLeaderKey(s.cfg.Shard))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		nrev, err = s.claims.Create(ctx, control.ShardLeaderKey(s.cfg.Shard), val)
	case err == nil:
		var cur leaderClaim
		if json.Unmarshal(en.Value(), &cur) == nil && cur.ID != s.cfg.ID &&
			now.UnixMilli() < cur.UntilMilli+s.cfg.Budget.Skew.Milliseconds() {
			s.mu.Lock()
			s.claim, s.claimAt = cur, now
			s.mu.Unlock()
			return false // another leads
		}
		// Lapsed, or ours (this instance lost its step, a publish
		// refused): take it, and start afresh from the bucket.
		nrev, err = s.claims.Update(ctx, control.ShardLeaderKey(s.cfg.Shard), val, en.Revision())
	}
	if err != nil {
		s.mu.Lock()
		s.claimAt = time.Time{}
		s.mu.Unlock()
		return false
	}
	tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.takeOver(tctx); err != nil {
		s.mu.Lock()
		s.claimAt = time.Time{}
		s.mu.Unlock()
		s.cfg.Logger.Warn("globalsync: taking the lead", "err", err)
		return false
	}
	s.mu.Lock()
	s.leaderRev = nrev
	s.claim, s.claimAt = own, now
	s.mu.Unlock()
	s.cfg.Logger.Info("globalsync: leading", "id", s.cfg.ID)
	return true
}

// sameSlicing reports whether slice 0's leader, if one leads, runs with
// this instance's number of slices: slice 0's claim says how the counters
// are cut, and a slice of another cutting does not lead beside it (its
// documents would be of counters slice 0's cutting gives to others). It
// says so once each time it starts to disagree.
func (s *Service) sameSlicing(ctx context.Context, now time.Time) bool {
	en, err := s.claims.Get(ctx, control.LeaderKey)
	if err != nil {
		return true // none leads slice 0, or none is known to: nothing to disagree with
	}
	var zero leaderClaim
	if json.Unmarshal(en.Value(), &zero) != nil || now.UnixMilli() >= zero.UntilMilli+s.cfg.Budget.Skew.Milliseconds() {
		return true
	}
	same := max(1, zero.Shards) == max(1, s.cfg.Shards)
	if !same && s.agreed.Swap(false) {
		s.cfg.Logger.Error("globalsync: not leading: slice 0's leader cuts the counters otherwise",
			"shards", max(1, s.cfg.Shards), "slice 0 leader", zero.ID, "its shards", max(1, zero.Shards))
	}
	if same {
		s.agreed.Store(true)
	}
	return same
}

// takeOver has the coordinator lead from what the budgets bucket holds:
// every document of every rule, oldest first — of this instance's slice,
// under its keys, and as sliced now (a key's documents of another number
// of slices are of counters this leader does not count).
func (s *Service) takeOver(ctx context.Context) error {
	revs := map[string]uint64{}
	var history [][]budget.Document
	keys, err := s.budgets.ListKeys(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	for key := range keys.Keys() {
		if shard, ok := control.ShardOfBudgetKey(key); !ok || shard != s.cfg.Shard {
			continue
		}
		hist, err := s.budgets.History(ctx, key)
		if err != nil {
			return err
		}
		var docs []budget.Document
		for _, en := range hist {
			revs[key] = max(revs[key], en.Revision())
			if d, err := budget.DecodeDocument(en.Value()); err == nil && d.Shard == s.cfg.Shard && max(1, d.Shards) == max(1, s.cfg.Shards) {
				docs = append(docs, d)
			}
		}
		history = append(history, docs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.revs = revs
	return s.coord.Restore(history)
}

// rebalance has the coordinator rebalance, and publishes its documents.
func (s *Service) rebalance(ctx context.Context, now time.Time) error {
	s.mu.Lock()
	docs, found, err := s.coord.Rebalance(now)
	revs := make([]uint64, len(docs))
	for i, d := range docs {
		revs[i] = s.revs[control.ShardBudgetKey(d.Rule, s.cfg.Shard)]
	}
	s.mu.Unlock()
	for _, oa := range found {
		s.overAdmitted.WithLabelValues(oa.Rule, oa.Region).Add(float64(oa.Amount))
		if oa.Debt {
			// Usage reported past the limit (count_over_limit), expected
			// up to the answers under way; the books cannot tell it from
			// admission past the limit.
			s.debtCounted.WithLabelValues(oa.Rule, oa.Region).Add(float64(oa.Amount))
			s.cfg.Logger.Info("usage counted past the limit", "rule", oa.Rule, "region", oa.Region, "window_start", oa.WindowStart,
				"counted", oa.Admitted, "past", oa.Amount, "carry_debt", oa.CarryDebt)
			continue
		}
		s.cfg.Logger.Warn("over-admission", "rule", oa.Rule, "region", oa.Region, "window_start", oa.WindowStart,
			"admitted", oa.Admitted, "over", oa.Amount, "carry_debt", oa.CarryDebt)
	}
	errs := []error{err}
	for i, doc := range docs {
		key := control.ShardBudgetKey(doc.Rule, s.cfg.Shard)
		b, _ := json.Marshal(doc)
		if max := s.nc.MaxPayload(); max > 0 {
			s.with(func(c *coord.Coordinator) { c.Sized(doc.Rule, len(b), int(max), now) })
		}
		if err := fits(doc, len(b), s.nc.MaxPayload()); err != nil {
			// Not another leader's doing: the regions keep their leases
			// until they lapse, then their floors.
			errs = append(errs, err)
			continue
		}
		var rev uint64
		var err error
		if revs[i] == 0 {
			rev, err = s.budgets.Create(ctx, key, b)
		} else {
			rev, err = s.budgets.Update(ctx, key, b, revs[i])
		}
		if err != nil {
			// Another instance wrote since: it leads now, or did.
			errs = append(errs, fmt.Errorf("publish %s: %w", doc.Rule, err))
			s.with(func(c *coord.Coordinator) { c.Follow() })
			break
		}
		if err := control.PushBudget(s.nc, s.subjects, rev, b); err != nil {
			s.cfg.Logger.Warn("globalsync: budget not pushed", "rule", doc.Rule, "err", err)
		}
		s.mu.Lock()
		s.revs[key] = rev
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// fits says why a budget document of size bytes cannot be published on
// servers whose max_payload is max (0: unknown), or nil. (The coordinator,
// told of the size, makes the next ones smaller: Coordinator.Sized.)
func fits(doc budget.Document, size int, max int64) error {
	if max <= 0 || int64(size) <= max {
		return nil
	}
	return fmt.Errorf("publish %s: a budget document of %d bytes, over the NATS servers' max_payload of %d, not sent: "+
		"the next ones hold fewer than its %d counters with budgets of their own (or raise max_payload)", doc.Rule, size, max, len(doc.Counters))
}

// Budgets returns the last leases of every rule.
func (s *Service) Budgets() []budget.Document {
	s.mu.Lock()
	defer s.mu.Unlock()
	return orEmpty(s.coord.Budgets())
}

// orEmpty is xs, or an empty slice for nil: an API's list is [] in JSON,
// never null.
func orEmpty[T any](xs []T) []T {
	if xs == nil {
		return []T{}
	}
	return xs
}

// OverAdmissions returns every over-admission found so far, their keys
// redacted if so configured.
func (s *Service) OverAdmissions() []coord.OverAdmission {
	s.mu.Lock()
	oas := orEmpty(s.coord.OverAdmissions())
	s.mu.Unlock()
	if s.cfg.RedactKeys {
		oas = slices.Clone(oas)
		for i := range oas {
			oas[i].Key = regional.RedactKey(oas[i].Key)
		}
	}
	return oas
}

// GlobalUsage returns what every region admitted of one counter's window,
// as globalsync's copy has it.
func (s *Service) GlobalUsage(key string, start time.Time) map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.coord.GlobalUsage(key, start)
}

// Regions returns every region's status.
func (s *Service) Regions() []coord.RegionStatus {
	now := s.cfg.Clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return orEmpty(s.coord.Status(now))
}

// newOverAdmittedMetric is geoquota_over_admitted_total.
func newOverAdmittedMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "geoquota_over_admitted_total",
		Help: "Requests (in cost) admitted beyond a global limit, found when a window's books close, by rule and the region held to account."},
		[]string{"rule", "region"})
}

func newDebtCountedMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "geoquota_counted_past_limit_total",
		Help: "Of geoquota_over_admitted_total, what rules with count_over_limit counted past a global limit, found when a window's books close, by rule and region: usage reported past the limit (answers under way when the region reached its share), which the books cannot tell from admission past it."},
		[]string{"rule", "region"})
}

// locked is the coordinator as the gossip node sees it: every call under
// the service's lock.
type locked struct{ s *Service }

func (l locked) OwnDeltas(since uint64, max int) (ds []crdt.Delta) {
	l.s.with(func(c *coord.Coordinator) { ds = c.OwnDeltas(since, max) })
	return ds
}

func (l locked) RegionState(region string) (d crdt.Delta) {
	l.s.with(func(c *coord.Coordinator) { d = c.RegionState(region) })
	return d
}

func (l locked) MergeRemote(ctx context.Context, d crdt.Delta) (rep crdt.MergeReport, err error) {
	l.s.with(func(c *coord.Coordinator) { rep, err = c.MergeRemote(ctx, d) })
	return rep, err
}

func (l locked) ObserveOwn(crdt.Delta) {}

func (l locked) Heartbeat(now time.Time, hb gossip.Heartbeat) {
	l.s.with(func(c *coord.Coordinator) { c.Heartbeat(now, hb) })
}
