package transport

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// Metrics are the Prometheus metrics of the regional path, in a
// registry of their own. No tenant or key is ever a label.
type Metrics struct {
	Registry *prometheus.Registry

	checks        *prometheus.CounterVec   // rule, decision
	checkDuration *prometheus.HistogramVec // api
	redisDuration prometheus.Histogram
	redisChecks   prometheus.Histogram
	redisErrors   prometheus.Counter
	uncountedReqs prometheus.Counter
	deniedCharged *prometheus.CounterVec
	reservations  *prometheus.CounterVec

	mu       sync.RWMutex
	children map[string]*[decisionKinds]prometheus.Counter // by rule id
}

// Decisions as labels of geoquota_checks_total.
const (
	decAllowed = iota
	decOverLimit
	decBlocked
	decUnavailable
	decBypassed
	decShadowOver // a shadow limit that would have denied
	decKeyLimit   // a new key past its rule's max_keys
	decUnlimited  // a request no rule applied to
	decInvalid    // an Envoy RLS descriptor of bad input, answered OVER_LIMIT
	decisionKinds
)

var decisionLabels = [decisionKinds]string{"allowed", "over_limit", "blocked", "unavailable", "bypassed", "shadow_over_limit", "key_limit", "unlimited", "invalid"}

// NewMetrics registers the metrics, with the engine's own counters read
// when scraped. e may be nil, and attached later with Attach.
func NewMetrics(e *regional.Engine) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry(), children: map[string]*[decisionKinds]prometheus.Counter{}}
	m.checks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "geoquota_checks_total", Help: "Limits checked, by rule and decision (rule is empty for keys allowed or blocked by list, for requests no rule applied to: unlimited, and for Envoy RLS descriptors of bad input: invalid).",
	}, []string{"rule", "decision"})
	m.checkDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "geoquota_check_duration_seconds", Help: "Time to decide a request, by API.",
		Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3},
	}, []string{"api"})
	m.redisDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "geoquota_redis_pipeline_duration_seconds", Help: "Round trips to Redis: one pipeline of checks.",
		Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3},
	})
	m.redisChecks = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "geoquota_redis_pipeline_checks", Help: "Checks sent to Redis in one pipeline.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 9), // 1 … 256, the most a pipeline takes
	})
	m.redisErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "geoquota_redis_errors_total", Help: "Redis pipelines that failed.",
	})
	m.uncountedReqs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "geoquota_batch_uncounted_total", Help: "Requests of gRPC Check batches left unchecked, counting nothing, because too little of the batch's deadline was left.",
	})
	m.deniedCharged = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "geoquota_denied_charged_total", Help: "Cost counted of hits their limit denied, by rule: usage reported past the limit of a rule with count_over_limit, counted as debt.",
	}, []string{"rule"})
	m.reservations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "geoquota_reservations_total", Help: "Reservations by what became of the call: reserved, denied (nothing held), committed, released, again (a settlement sent again, answered alike), not_found (not made here, or ended), refused (a counter keeps as many settlements as it may).",
	}, []string{"result"})
	m.Registry.MustRegister(m.checks, m.checkDuration, m.redisDuration, m.redisChecks, m.redisErrors, m.uncountedReqs, m.deniedCharged, m.reservations,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if e != nil {
		m.Attach(e)
	}
	return m
}

// Attach exposes the engine's own counters: breaker, degraded decisions,
// caches, hot keys' batches, key caps, rule reloads and the warnings of
// the rules in force.
func (m *Metrics) Attach(e *regional.Engine) {
	st := e.Stats()
	counter := func(name, help string, f func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f()) })
	}
	const reloadsHelp = "Rule sets put in force (result=ok, the first included) or rejected (result=error)."
	const siblingHelp = "Denials told by sibling replicas and refused, by reason."
	m.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "geoquota_rule_reloads_total", Help: reloadsHelp,
			ConstLabels: prometheus.Labels{"result": "ok"}}, func() float64 { return float64(st.RuleReloads.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "geoquota_rule_reloads_total", Help: reloadsHelp,
			ConstLabels: prometheus.Labels{"result": "error"}}, func() float64 { return float64(st.RuleReloadErrors.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "geoquota_rule_warnings",
			Help: "Warnings of the rules in force: fields read and not enforced, each logged when the rules were put in force."},
			func() float64 { return float64(len(e.Rules().Warnings())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "geoquota_breaker_state",
			Help: "Circuit breaker in front of the store: 0 closed, 1 open, 2 half-open."},
			func() float64 { return float64(e.Breaker()) }),
		counter("geoquota_degraded_decisions_total", "Decisions made without the shared store (fail_open, local_only).", st.Degraded.Load),
		counter("geoquota_store_errors_total", "Checks whose store call failed or timed out.", st.StoreErrors.Load),
		counter("geoquota_global_degraded_admitted_total", "Cost admitted of global limits without the store, counted in memory until the store takes it.", st.GlobalDegraded.Load),
		counter("geoquota_global_degraded_written_total", "Cost admitted of global limits without the store and written to it since.", st.GlobalWrittenBack.Load),
		counter("geoquota_global_degraded_lost_total", "Cost admitted of global limits without the store whose window ended before the store came back.", st.GlobalDegradedLost.Load),
		counter("geoquota_denial_cache_hits_total", "Limits denied from the denial cache, without the store.", st.DenialCacheHits.Load),
		counter("geoquota_batch_hits_total", "Limits served from a hot key's batch, without the store.", st.BatchHits.Load),
		counter("geoquota_batch_tokens_taken_total", "Tokens taken from the store in hot keys' batches.", st.BatchTaken.Load),
		counter("geoquota_batch_tokens_returned_total", "Batched tokens given back unused.", st.BatchReturned.Load),
		counter("geoquota_batch_tokens_lapsed_total", "Batched tokens of a window that ended unused.", st.BatchLapsed.Load),
		counter("geoquota_keys_refused_total", "Requests refused because their rule tracks its maximum of keys.", st.KeysRefused.Load),
		counter("geoquota_keys_folded_total", "Requests counted in their rule's shared overflow counter.", st.KeysFolded.Load),
		counter("geoquota_penalties_total", "Cooldowns doubled for clients that kept sending while told to wait.", st.Penalties.Load),
		counter("geoquota_violations_dropped_total", "Denials left out of the audit log because its buffer was full.", st.ViolationsDropped.Load),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "geoquota_sibling_denials_refused_total", Help: siblingHelp,
			ConstLabels: prometheus.Labels{"reason": "key_too_long"}}, func() float64 { return float64(st.DenialsTooLong.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "geoquota_sibling_denials_refused_total", Help: siblingHelp,
			ConstLabels: prometheus.Labels{"reason": "unknown_rule"}}, func() float64 { return float64(st.DenialsUnknownRule.Load()) }),
		counter("geoquota_sibling_denials_capped_total", "Siblings' denials held for less than they asked: no longer than one of the rule's can last.", st.DenialsCapped.Load),
		counter("geoquota_reservations_refunded_total", "Reservations that ended unsettled and were refunded (on_expiry: refund) by this replica.", st.ReservationsRefunded.Load),
		counter("geoquota_reservations_expired_late_total", "Reservations to refund found more than a minute after their end: they stayed charged.", st.ReservationsExpiredLate.Load),
		keyCaps{e},
	)
}

// keyCaps exports, per rule with a cap on its keys, the keys this replica
// tracks and the cap: a rule nearing its cap is seen before it refuses.
type keyCaps struct{ e *regional.Engine }

var (
	trackedKeysDesc = prometheus.NewDesc("geoquota_tracked_keys",
		"Keys of the rule this replica tracks (seen in the rule's last window, or the last minute if longer), under its max_keys.", []string{"rule"}, nil)
	maxKeysDesc = prometheus.NewDesc("geoquota_max_keys",
		"The rule's cap on the keys it tracks in the region (max_keys).", []string{"rule"}, nil)
)

func (keyCaps) Describe(ch chan<- *prometheus.Desc) { ch <- trackedKeysDesc; ch <- maxKeysDesc }

func (k keyCaps) Collect(ch chan<- prometheus.Metric) {
	k.e.TrackedKeys(func(rule string, tracked int64, max int) {
		ch <- prometheus.MustNewConstMetric(trackedKeysDesc, prometheus.GaugeValue, float64(tracked), rule)
		ch <- prometheus.MustNewConstMetric(maxKeysDesc, prometheus.GaugeValue, float64(max), rule)
	})
}

// ObserveRedis is a regional.RedisOptions.Observe: one pipeline.
func (m *Metrics) ObserveRedis(took time.Duration, checks int, err error) {
	m.redisDuration.Observe(took.Seconds())
	m.redisChecks.Observe(float64(checks))
	if err != nil {
		m.redisErrors.Inc()
	}
}

// apiMetrics record the decisions made through one API.
type apiMetrics struct {
	*Metrics
	took prometheus.Observer // checkDuration for the API
}

// forAPI binds the metrics to an API's label once, off the request path.
func (m *Metrics) forAPI(api string) apiMetrics {
	return apiMetrics{m, m.checkDuration.WithLabelValues(api)}
}

// uncounted records requests of a batch left unchecked.
func (m apiMetrics) uncounted(n int) { m.uncountedReqs.Add(float64(n)) }

// observe records a decision.
func (m apiMetrics) observe(d *regional.Decision, took time.Duration) {
	m.took.Observe(took.Seconds())
	switch {
	case d.Bypassed:
		m.count("", decBypassed)
	case d.Code == regional.CodeBlocked:
		m.count("", decBlocked)
	case len(d.Limits) == 0:
		m.count("", decUnlimited)
	}
	for i := range d.Limits {
		l := &d.Limits[i]
		switch {
		case l.Allowed:
			m.count(l.Rule.ID, decAllowed)
		case l.Shadow:
			m.count(l.Rule.ID, decShadowOver)
		case d.Code == regional.CodeUnavailable:
			m.count(l.Rule.ID, decUnavailable)
		case l.KeyRefused:
			m.count(l.Rule.ID, decKeyLimit)
		default:
			m.count(l.Rule.ID, decOverLimit)
		}
		if !l.Allowed && l.Charged > 0 {
			m.deniedCharged.WithLabelValues(l.Rule.ID).Add(float64(l.Charged))
		}
	}
}

func (m *Metrics) count(rule string, decision int) {
	m.mu.RLock()
	cs := m.children[rule]
	m.mu.RUnlock()
	if cs == nil {
		m.mu.Lock()
		if cs = m.children[rule]; cs == nil {
			cs = new([decisionKinds]prometheus.Counter)
			for i := range cs {
				cs[i] = m.checks.WithLabelValues(rule, decisionLabels[i])
			}
			m.children[rule] = cs
		}
		m.mu.Unlock()
	}
	cs[decision].Inc()
}

// AttachGossip exposes the gossip's counters, the lag behind each remote
// region, and the region's budget for each global rule.
func (m *Metrics) AttachGossip(st *gossip.Stats, e *regional.Engine) {
	counter := func(name, help string, labels prometheus.Labels, v *atomic.Int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v.Load()) })
	}
	const msgs, refused = "Gossip messages, by direction.", "Gossip messages or slots refused and never merged, by reason."
	m.Registry.MustRegister(
		counter("geoquota_gossip_messages_total", msgs, prometheus.Labels{"direction": "out"}, &st.Sent),
		counter("geoquota_gossip_messages_total", msgs, prometheus.Labels{"direction": "in"}, &st.Received),
		counter("geoquota_gossip_slots_applied_total", "Slots of other regions that raised this region's copy.", nil, &st.Applied),
		counter("geoquota_anti_entropy_repairs_total", "Slots this region missed and got back by anti-entropy.", nil, &st.Repaired),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "malformed"}, &st.Malformed),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "unknown_region"}, &st.UnknownRegion),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "spoofed"}, &st.Spoofed),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "replayed"}, &st.Replayed),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "regressed"}, &st.Regressed),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "ahead"}, &st.Ahead),
		counter("geoquota_gossip_refused_total", refused, prometheus.Labels{"reason": "unknown_rule"}, &st.UnknownRule),
		counter("geoquota_gossip_store_errors_total", "Merges of gossip into the store that failed.", nil, &st.StoreErrors),
		&gossipCollector{e: e},
	)
}

// gossipCollector reports, when scraped, how long ago each remote region
// was heard from, and the budget this region holds per global rule.
type gossipCollector struct{ e *regional.Engine }

var (
	lagDesc = prometheus.NewDesc("geoquota_gossip_lag_seconds",
		"Time since the last gossip message from each remote region.", []string{"region"}, nil)
	shareDesc = prometheus.NewDesc("geoquota_budget_share",
		"Fraction of each global rule's limit this region may admit now (its lease, or its floor).", []string{"rule"}, nil)
	leaseDesc = prometheus.NewDesc("geoquota_budget_lease_valid",
		"1 while this region holds a budget lease for the global rule, 0 on its floor; absent for a region alone, which needs none.", []string{"rule"}, nil)
)

func (c *gossipCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lagDesc
	ch <- shareDesc
	ch <- leaseDesc
}

func (c *gossipCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	e := c.e
	for _, r := range e.GlobalRegions() {
		if t, ok := e.LastHeard(r); ok {
			ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, now.Sub(t).Seconds(), r)
		}
	}
	for _, r := range e.GlobalRules() {
		share, valid := e.Floor(), 0.0
		if l, _, ok := e.Lease(r.ID); ok && l.Holds(now) {
			share, valid = l.Allowance(), 1
		}
		if e.Alone() {
			// The only region needs no lease: it enforces the whole
			// limit, and says so without a lease "not valid".
			ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, 1, r.ID)
			continue
		}
		ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, share, r.ID)
		ch <- prometheus.MustNewConstMetric(leaseDesc, prometheus.GaugeValue, valid, r.ID)
	}
}

// reservation counts a reservation call by its result
// (geoquota_reservations_total).
func (m *Metrics) reservation(result string) { m.reservations.WithLabelValues(result).Inc() }

// settlement counts a settlement by what it did.
func (m *Metrics) settlement(commit, again bool) {
	switch {
	case again:
		m.reservation("again")
	case commit:
		m.reservation("committed")
	default:
		m.reservation("released")
	}
}
