package coord

import (
	"bytes"
	"maps"
	"slices"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
)

// books is the state of closing the windows' books: the rules they are
// judged against, and how far they are closed.
type books struct {
	rules *regional.RuleSet
	// earlier are the rule sets in force before rules, each until it was
	// replaced: a window's books are closed against the limits in force
	// while it ran.
	earlier    []earlierRules
	reconciled map[crdt.ID]bool
	found      []OverAdmission
	last       time.Time // when the books were last closed
	// closedBy: every window that ended by then is reconciled, by this
	// coordinator; inherited is the same of the leaders before it.
	closedBy, inherited time.Time
	// through is the end of the last window whose books were closed.
	through time.Time
}

func newBooks() books { return books{reconciled: map[crdt.ID]bool{}} }

// earlierRules is a rule set that was in force until a time.
type earlierRules struct {
	rules *regional.RuleSet
	until time.Time
}

// maxEarlierRules bounds the rule sets kept for closing books: a set
// replaced more than a few changes ago no longer governs an open window.
const maxEarlierRules = 8

// keepClosed is how long a window's usage is kept after its books close:
// GetGlobalUsage answers for the last ten minutes.
const keepClosed = 10 * time.Minute

// OverAdmission is one region's part of a window that admitted more than
// its limit.
type OverAdmission struct {
	Rule        string    `json:"rule"`
	Key         string    `json:"key"`
	Region      string    `json:"region"`
	WindowStart time.Time `json:"window_start"`
	Amount      int64     `json:"amount"`
	// Admitted is what the region admitted in the window; CarryDebt says
	// the amount is withheld from its next windows.
	Admitted  int64 `json:"admitted"`
	CarryDebt bool  `json:"carry_debt"`
	// Debt says the rule counts every hit (count_over_limit): the amount
	// counts usage reported past the limit — answers under way when the
	// region reached its share, counted whole, which the regions then deny
	// the key for — and the books cannot tell it from admission past it.
	Debt bool `json:"debt,omitempty"`
}

// SetRules gives the coordinator the rules the regions enforce, in force
// from now: with them, the leader closes the books of every window of a
// global rule. Rules replaced still judge the windows that ran under
// them.
func (c *Coordinator) SetRules(now time.Time, rs *regional.RuleSet) {
	b := &c.books
	if b.rules != nil && rs != nil && !bytes.Equal(b.rules.YAML(), rs.YAML()) {
		b.earlier = append(b.earlier, earlierRules{b.rules, now})
		if len(b.earlier) > maxEarlierRules {
			b.earlier = b.earlier[1:]
		}
	}
	b.rules = rs
}

// Rules returns the rules the books are closed with (nil: none).
func (c *Coordinator) Rules() *regional.RuleSet { return c.books.rules }

// OverAdmissions returns every over-admission found so far.
func (c *Coordinator) OverAdmissions() []OverAdmission { return slices.Clone(c.books.found) }

// BooksClosed is how far the books are closed: every window that ended by
// then is reconciled, by this coordinator or the leaders before it.
func (c *Coordinator) BooksClosed() time.Time { return c.books.closed() }

// ClosedThrough is the end of the last window whose books this
// coordinator closed (or found closed by the leaders before it).
func (c *Coordinator) ClosedThrough() time.Time { return c.books.through }

func (b *books) closed() time.Time { return later(b.closedBy, b.inherited) }

func (b *books) inherit(t time.Time) { b.inherited = later(b.inherited, t) }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// settleAfter is how long after a window ends its books are closed: for
// the last deltas, and the repairs of an anti-entropy round, to arrive.
func (c *Coordinator) settleAfter() time.Duration { return c.cfg.AntiEntropy + 2*c.cfg.Rebalance }

// closeBooks closes the books of windows that ended and settled, once
// half an anti-entropy round: a counter whose regions together admitted
// more than its limit is over-admission, put on the regions that went
// beyond what they were granted (in proportion), or on all in proportion
// to their usage if none did (budget.Attribute); with carry_debt it is
// charged to the regions' next windows. Only the leader closes books.
func (c *Coordinator) closeBooks(now time.Time) []OverAdmission {
	b := &c.books
	if b.rules == nil || c.alloc == nil || now.Sub(b.last) < c.cfg.AntiEntropy/2 {
		return nil
	}
	b.last = now
	settle := c.settleAfter()
	b.closedBy = now.Add(-settle)
	usage := c.view()
	// The windows settled, judged in the order of their IDs (debts add up
	// the same to the last bit).
	type window struct {
		id    crdt.ID
		rule  *regional.Rule
		limit int64
		end   time.Time
	}
	var settled []window
	for id := range usage.IDs() {
		if b.reconciled[id] {
			continue
		}
		rule, limit, ok := b.rules.GlobalLimitOf(id.Key)
		if !ok {
			b.reconciled[id] = true
			continue
		}
		end := time.UnixMilli(id.Epoch).Add(time.Duration(rule.Base.Window) * time.Microsecond)
		if !now.Before(end.Add(settle)) {
			settled = append(settled, window{id, rule, limit, end})
		}
	}
	slices.SortFunc(settled, func(a, b window) int { return a.id.Compare(b.id) })
	var found []OverAdmission
	for _, w := range settled {
		id, rule, limit, end := w.id, w.rule, w.limit, w.end
		start := time.UnixMilli(id.Epoch)
		b.reconciled[id] = true
		b.through = later(b.through, end)
		if !end.After(b.inherited) {
			continue // an earlier leader closed these books
		}
		limit = b.limitDuring(id.Key, limit, start)
		pn := usage.Get(id)
		total := pn.Value()
		if total <= limit {
			continue
		}
		used := pn.ByRegion()
		granted := c.alloc.Granted(rule.ID, id.Epoch*1000/rule.Base.Window)
		parts := budget.Attribute(total-limit, limit, used, granted)
		for _, r := range slices.Sorted(maps.Keys(parts)) {
			found = append(found, OverAdmission{Rule: rule.ID, Key: id.Key, Region: r, WindowStart: start, Amount: parts[r],
				Admitted: used[r], CarryDebt: rule.CarryDebt, Debt: rule.CountOverLimit})
			if rule.CarryDebt {
				c.alloc.Charge(rule.ID, r, float64(parts[r])/float64(limit))
			}
		}
	}
	b.found = append(b.found, found...)
	return found
}

// limitDuring is the limit a window starting at start is judged against:
// the highest of the limits in force while it ran (the current one, and
// those of the rule sets replaced after it began). A region that had not
// yet heard of a lower limit did not over-admit by keeping to the higher.
func (b *books) limitDuring(key string, current int64, start time.Time) int64 {
	limit := current
	for _, er := range b.earlier {
		if !er.until.After(start) {
			continue
		}
		if _, l, ok := er.rules.GlobalLimitOf(key); ok {
			limit = max(limit, l)
		}
	}
	return limit
}

// KeptFor is how long from its start the coordinator keeps a window of a
// rule: until keepClosed after its books close, or a day for a rule no
// region reports.
func (c *Coordinator) KeptFor(rule string) time.Duration {
	if r, ok := c.rules[rule]; ok {
		return r.Window + c.settleAfter() + keepClosed
	}
	return 24 * time.Hour
}

// expireUsage forgets windows whose books closed a while ago, in the copy
// and in the ledger (KeptFor).
func (c *Coordinator) expireUsage(now time.Time) {
	old := func(id crdt.ID) bool {
		rule, _, _ := regional.ParseCounterKey(id.Key)
		return now.Sub(time.UnixMilli(id.Epoch)) > c.KeptFor(rule)
	}
	c.view().Expire(old)
	for id := range c.books.reconciled {
		if old(id) {
			delete(c.books.reconciled, id)
		}
	}
}
