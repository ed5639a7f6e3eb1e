package main

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/geoquota/geoquota/budget"
)

// percent writes a fraction of the limit as a percentage: one decimal,
// two below 1% (0.033 is "3.3%", 0.0004 "0.04%").
func percent(f float64) string {
	p := 100 * f
	if p != 0 && math.Abs(p) < 1 {
		return strconv.FormatFloat(p, 'f', 2, 64) + "%"
	}
	return strconv.FormatFloat(p, 'f', 1, 64) + "%"
}

// explain says, in a line, why a region's lease of a rule is what it
// is, from the reason the allocator gave it (budget.Reason): the step
// that decided it, then the figures it worked from. own is how many of
// the rule's counters have budgets of their own, hysteresis the
// allocator's; silent says the region has not been heard lately. Empty
// for a lease without a reason (a counter's, or one published by a
// leader that gave none).
func explain(l budget.Lease, own int, hysteresis float64, silent bool) string {
	r := l.Reason
	asks := percent(r.Demand) + " of the limit a window"
	apart := ""
	if own > 0 {
		// Their demand is theirs, not the rule's.
		apart = fmt.Sprintf(" beyond the %d %s, leased apart", own, plural(own, "counter with a budget of its own", "counters with budgets of their own"))
	}
	var s string
	switch r.Why {
	case "":
		return ""
	case budget.WhyDemand:
		s = fmt.Sprintf("demand — it asks %s, met in full", asks)
	case budget.WhySpare:
		need := max(0, r.Demand-l.Floor)
		if need > 0 {
			s = fmt.Sprintf("demand and spare — it asks %s, met in full, and holds %s more: what no region asks for, shared out in proportion to demand",
				asks, percent(r.Target-need))
		} else {
			s = fmt.Sprintf("spare — its floor covers what it asks (%s); it holds %s more: what no region asks for, shared out in proportion to demand",
				asks, percent(r.Target))
		}
	case budget.WhyLevel:
		s = fmt.Sprintf("water level — the regions ask for more than the limit; it asks %s, more than an equal part, and gets what each region asking as much gets",
			asks)
	case budget.WhyFloor:
		s = fmt.Sprintf("floor — its floor covers what it asks (%s), and the other regions' demand takes all the rest", asks)
	case budget.WhyIdle:
		s = "floor — it asks nothing of the rule" + apart + "; the rest goes to the regions that do"
	case budget.WhyEven:
		s = "even — no region asks anything of the rule" + apart + "; the rest is split evenly over the regions heard within a lease's life"
		if silent {
			s += ": this one too, not heard lately but within that"
		}
	case budget.WhySilent:
		s = "floor — not heard lately (cut off, or down): its demand no longer counts; its floor is never granted to another region"
	case budget.WhyHeld:
		s = fmt.Sprintf("hysteresis — demand would make it %s, a move of less than %s, so it stays (it asks %s)",
			percent(l.Floor+r.Target), percent(hysteresis), asks)
	case budget.WhyMarks:
		s = fmt.Sprintf("high-water marks — it wants %s, but the other regions may still admit up to their marks in this window, under leases they hold or held; "+
			"the rest comes as they acknowledge lower leases, or with the next window", percent(r.Want))
	default:
		s = string(r.Why)
	}
	if l.Debt > 0 {
		s += fmt.Sprintf("; %s withheld this window for over-admission found earlier (carry_debt)", percent(l.Debt))
	}
	return s
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// maxMoves bounds the lease moves the dashboard keeps.
const maxMoves = 300

// minMove is the least change of a region's allowance the dashboard lists
// as a move: half a point of the limit.
const minMove = 0.005

// Move is a change of what the leader granted a region of a rule, with
// why, for the dashboard's lists and its charts' points.
type Move struct {
	AtMillis int64   `json:"at_ms"` // when this instance first saw the document that made it
	Rule     string  `json:"rule"`
	Region   string  `json:"region"`
	From     float64 `json:"from"` // allowances, fractions of the limit
	To       float64 `json:"to"`
	Why      string  `json:"why"` // explain's
	Text     string  `json:"text"`
}

// moveLog finds lease moves by comparing each rule's newest document
// with the one before.
type moveLog struct {
	moves []Move
	seq   map[string]uint64             // rule → the Seq of the last document seen
	last  map[string]map[string]float64 // rule → region → allowance
}

// note records the moves in docs (each rule's newest document, at now)
// since the documents seen before; silent are the regions not heard
// lately.
func (m *moveLog) note(now time.Time, docs []budget.Document, hysteresis float64, silent map[string]bool) {
	if m.seq == nil {
		m.seq, m.last = map[string]uint64{}, map[string]map[string]float64{}
	}
	for _, doc := range docs {
		if doc.Seq == m.seq[doc.Rule] {
			continue
		}
		m.seq[doc.Rule] = doc.Seq
		last := m.last[doc.Rule]
		next := make(map[string]float64, len(doc.Leases))
		for _, region := range slices.Sorted(maps.Keys(doc.Leases)) {
			l, _ := doc.Lease(region)
			to := l.Allowance()
			next[region] = to
			from, seen := last[region]
			if !seen || math.Abs(to-from) < minMove {
				continue
			}
			why := explain(l, len(doc.Counters), hysteresis, silent[region])
			text := fmt.Sprintf("%s %s → %s", region, percent(from), percent(to))
			if why != "" {
				text += ": " + why
			}
			m.moves = append(m.moves, Move{AtMillis: now.UnixMilli(), Rule: doc.Rule, Region: region, From: from, To: to, Why: why, Text: text})
		}
		m.last[doc.Rule] = next
	}
}

// trim drops the moves before from, and the oldest beyond maxMoves.
func (m *moveLog) trim(from int64) {
	m.moves = trimmed(m.moves, from, maxMoves, func(m Move) int64 { return m.AtMillis })
}
