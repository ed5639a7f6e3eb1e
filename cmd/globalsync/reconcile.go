package main

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// selfName is globalsync's name in the gossip: it takes the regions'
// deltas and asks them for what it misses with its digest, but counts
// nothing of its own.
const selfName = "globalsync"

// settleAfter is how long after a window ends its books are closed: for
// the last deltas, and the repairs of an anti-entropy round, to arrive.
func (s *Service) settleAfter() time.Duration { return s.cfg.AntiEntropy + 2*s.cfg.Rebalance }

// usageView is globalsync's copy of every region's usage.
type usageView struct {
	c       *crdt.Counters
	regions []string
}

// view returns the copy for the regions known now, rebuilt (keeping what
// it held) when a region appears. The caller holds s.mu.
func (s *Service) view() *crdt.Counters {
	regions := append(slices.Clone(s.knownRegions()), selfName)
	slices.Sort(regions)
	if s.usage != nil && slices.Equal(s.usage.regions, regions) {
		return s.usage.c
	}
	c, err := crdt.NewCounters(selfName, regions)
	if err != nil {
		return nil
	}
	if s.usage != nil {
		c.Merge(s.usage.c.DeltaSince(0))
	}
	s.usage = &usageView{c: c, regions: regions}
	return c
}

func (s *Service) onDelta(m *nats.Msg) {
	from := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	d, err := crdt.DecodeDelta(m.Data)
	if err != nil {
		return
	}
	if !strings.HasPrefix(m.Subject, s.cfg.Prefix+".repair.") && d.Origin != from {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.view(); c != nil {
		c.Merge(d)
	}
}

// publishDigest asks the regions for what the copy misses.
func (s *Service) publishDigest() {
	s.mu.Lock()
	c := s.view()
	var dg crdt.Digest
	var err error
	if c != nil {
		dg, err = c.Digest(crdt.DefaultDigestBuckets)
	}
	s.mu.Unlock()
	if c == nil || err != nil {
		return
	}
	b, err := crdt.AppendDigest(nil, dg)
	if err != nil {
		return
	}
	m := nats.NewMsg(s.cfg.Prefix + ".digest." + selfName)
	m.Data = b
	m.Header.Set(transport.HeaderReplica, "globalsync-"+s.cfg.ID)
	s.digestSeq++
	m.Header.Set(transport.HeaderSeq, strconv.FormatUint(s.digestSeq, 10))
	s.nc.PublishMsg(m)
}

// keepClosed is how long a window's usage is kept after its books close.
const keepClosed = 10 * time.Minute

// windowOf is the window of the rule a counter belongs to, as the regions
// report it, or 0. The caller holds s.mu.
func (s *Service) windowOf(id crdt.ID) time.Duration {
	inner, _ := strings.CutPrefix(id.Key, "gq:{")
	rule, _, _ := strings.Cut(inner, ":")
	return s.rules[rule].Window
}

// expireUsage forgets windows whose books closed a while ago (GetGlobalUsage
// answers for the last ten minutes), in the copy and in the ledger; a
// window of a rule no region reports goes after a day. The caller holds
// s.mu.
func (s *Service) expireUsage(now time.Time) {
	c := s.view()
	if c == nil {
		return
	}
	old := func(id crdt.ID) bool {
		age := now.Sub(time.UnixMilli(id.Epoch))
		if w := s.windowOf(id); w > 0 {
			return age > w+s.settleAfter()+keepClosed
		}
		return age > 24*time.Hour
	}
	c.Expire(old)
	for id := range s.reconciled {
		if old(id) {
			delete(s.reconciled, id)
		}
	}
}

// OverAdmission is one region's part of a window that admitted more than
// its limit.
type OverAdmission struct {
	Rule, Key, Region string
	WindowStart       time.Time
	Amount            int64
}

// earlierRules is a rule set that was in force until a time.
type earlierRules struct {
	rules *regional.RuleSet
	until time.Time
}

// maxEarlierRules bounds the rule sets kept for closing books: a set
// replaced more than a few changes ago no longer governs an open window.
const maxEarlierRules = 8

// limitDuring is the limit a window starting at start is judged against:
// the highest of the limits in force while it ran (the current one, and
// those of the rule sets replaced after it began). A region that had not
// yet heard of a lower limit did not over-admit by keeping to the
// higher. The caller holds s.mu.
func (s *Service) limitDuring(key string, current int64, start time.Time) int64 {
	limit := current
	for _, er := range s.earlierRules {
		if !er.until.After(start) {
			continue
		}
		if _, l, ok := er.rules.GlobalLimitOf(key); ok {
			limit = max(limit, l)
		}
	}
	return limit
}

// reconcile closes the books of windows that ended: a counter whose
// regions together admitted more than its limit is over-admission, put on
// the regions that went beyond what they were granted (in proportion), or
// on all in proportion to their usage if none did; it is counted, logged,
// and, for carry_debt rules, charged to the regions' next windows. Only
// the leader reconciles. The caller holds s.mu.
func (s *Service) reconcile(now time.Time) []OverAdmission {
	if s.rulesSet == nil || s.alloc == nil || now.Sub(s.lastReconcile) < s.cfg.AntiEntropy/2 {
		return nil
	}
	s.lastReconcile = now
	s.booksClosed = now.Add(-s.settleAfter())
	c := s.view()
	if c == nil {
		return nil
	}
	var found []OverAdmission
	var done []crdt.ID
	for _, id := range s.pendingWindows(c) {
		rule, limit, ok := s.rulesSet.GlobalLimitOf(id.Key)
		if !ok {
			done = append(done, id)
			continue
		}
		window := rule.Base.Window / 1000 // ms
		end := time.UnixMilli(id.Epoch + window)
		limit = s.limitDuring(id.Key, limit, time.UnixMilli(id.Epoch))
		if now.Before(end.Add(s.settleAfter())) {
			continue
		}
		done = append(done, id)
		if !end.After(s.inheritedBooks) {
			continue // an earlier leader closed these books
		}
		pn := c.Get(id)
		total := pn.Value()
		if total <= limit {
			continue
		}
		over := total - limit
		granted := s.alloc.Granted(rule.ID, id.Epoch*1000/rule.Base.Window)
		used := pn.ByRegion()
		parts := budget.Attribute(over, limit, used, granted)
		for _, r := range slices.Sorted(maps.Keys(parts)) {
			part := parts[r]
			oa := OverAdmission{Rule: rule.ID, Key: id.Key, Region: r, WindowStart: time.UnixMilli(id.Epoch), Amount: part}
			found = append(found, oa)
			s.overAdmitted.WithLabelValues(rule.ID, r).Add(float64(part))
			s.cfg.Logger.Warn("over-admission", "rule", rule.ID, "key", id.Key, "region", r,
				"window_start", oa.WindowStart, "admitted", used[r], "over", part, "carry_debt", rule.CarryDebt)
			if rule.CarryDebt {
				s.alloc.Charge(rule.ID, r, float64(part)/float64(limit))
			}
		}
	}
	for _, id := range done {
		s.reconciled[id] = true
	}
	return found
}

// pendingWindows lists the windows in the copy not yet reconciled.
func (s *Service) pendingWindows(c *crdt.Counters) []crdt.ID {
	var ids []crdt.ID
	for _, e := range c.DeltaSince(0).Entries {
		if !s.reconciled[e.ID] {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// newOverAdmittedMetric is geoquota_over_admitted_total.
func newOverAdmittedMetric() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "geoquota_over_admitted_total",
		Help: "Requests (in cost) admitted beyond a global limit, found when a window's books close, by rule and the region held to account."},
		[]string{"rule", "region"})
}
