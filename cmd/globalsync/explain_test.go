package main

import (
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/budget"
)

// TestPercent: fractions of the limit read as percentages, small ones
// with a second decimal.
func TestPercent(t *testing.T) {
	for f, want := range map[float64]string{0: "0.0%", 0.033333: "3.3%", 0.012: "1.2%", 0.483333: "48.3%", 1: "100.0%", 0.0004: "0.04%", 1.25: "125.0%"} {
		if got := percent(f); got != want {
			t.Errorf("percent(%v) = %q, want %q", f, got, want)
		}
	}
}

// TestExplain: each reason the allocator gives reads as the step that
// decided the lease, then its figures, in percentages; debt withheld is
// said after it.
func TestExplain(t *testing.T) {
	const floor = 1.0 / 30
	lease := func(share, debt float64, r budget.Reason) budget.Lease {
		return budget.Lease{Region: "us", Floor: floor, Share: share, Debt: debt, Reason: r}
	}
	for _, c := range []struct {
		lease  budget.Lease
		own    int
		silent bool
		want   string
	}{
		{lease(0.3, 0, budget.Reason{Why: budget.WhyDemand, Demand: 0.3 + floor, Target: 0.3, Want: 0.3 + floor}), 0, false,
			"demand — it asks 33.3% of the limit a window, met in full"},
		{lease(0.4, 0, budget.Reason{Why: budget.WhySpare, Demand: 0.2, Target: 0.4, Want: 0.4 + floor}), 0, false,
			"demand and spare — it asks 20.0% of the limit a window, met in full, and holds 23.3% more: what no region asks for, shared out in proportion to demand"},
		{lease(0.1, 0, budget.Reason{Why: budget.WhySpare, Demand: 0.02, Target: 0.1, Want: 0.1 + floor}), 0, false,
			"spare — its floor covers what it asks (2.0% of the limit a window); it holds 10.0% more: what no region asks for, shared out in proportion to demand"},
		{lease(0.3, 0, budget.Reason{Why: budget.WhyLevel, Demand: 2, Target: 0.3, Want: 0.3 + floor}), 0, false,
			"water level — the regions ask for more than the limit; it asks 200.0% of the limit a window, more than an equal part, and gets what each region asking as much gets"},
		{lease(0, 0, budget.Reason{Why: budget.WhyFloor, Demand: 0.02, Want: floor}), 0, false,
			"floor — its floor covers what it asks (2.0% of the limit a window), and the other regions' demand takes all the rest"},
		{lease(0, 0, budget.Reason{Why: budget.WhyIdle, Want: floor}), 0, false,
			"floor — it asks nothing of the rule; the rest goes to the regions that do"},
		{lease(0, 0, budget.Reason{Why: budget.WhyIdle, Want: floor}), 1, false,
			"floor — it asks nothing of the rule beyond the 1 counter with a budget of its own, leased apart; the rest goes to the regions that do"},
		{lease(0.45, 0, budget.Reason{Why: budget.WhyEven, Target: 0.45, Want: 0.45 + floor}), 2, true,
			"even — no region asks anything of the rule beyond the 2 counters with budgets of their own, leased apart; the rest is split evenly over the regions heard within a lease's life: this one too, not heard lately but within that"},
		{lease(0, 0, budget.Reason{Why: budget.WhySilent, Want: floor}), 0, true,
			"floor — not heard lately (cut off, or down): its demand no longer counts; its floor is never granted to another region"},
		{lease(0.3, 0, budget.Reason{Why: budget.WhyHeld, Demand: 0.34, Target: 0.305, Want: 0.3 + floor}), 0, false,
			"hysteresis — demand would make it 33.8%, a move of less than 1.0%, so it stays (it asks 34.0% of the limit a window)"},
		{lease(0.2, 0, budget.Reason{Why: budget.WhyMarks, Demand: 1, Target: 0.6, Want: 0.6 + floor}), 0, false,
			"high-water marks — it wants 63.3%, but the other regions may still admit up to their marks in this window, under leases they hold or held; the rest comes as they acknowledge lower leases, or with the next window"},
		{lease(0, 0.02, budget.Reason{Why: budget.WhyIdle, Want: floor}), 0, false,
			"floor — it asks nothing of the rule; the rest goes to the regions that do; 2.0% withheld this window for over-admission found earlier (carry_debt)"},
		{lease(0, 0, budget.Reason{}), 0, false, ""},
	} {
		if got := explain(c.lease, c.own, 0.01, c.silent); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.lease.Reason.Why, got, c.want)
		}
	}
}

// TestMoves: a region's allowance that changes by half a point or more
// from one document to the next is a move, with why; smaller changes,
// the first document and one seen again are not.
func TestMoves(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	doc := func(seq uint64, eu, us budget.Lease) budget.Document {
		eu.Rule, eu.Region, eu.Seq, us.Rule, us.Region, us.Seq = "g", "eu", seq, "g", "us", seq
		return budget.NewDocument("gs", []budget.Lease{eu, us})
	}
	even := budget.Lease{Floor: 0.05, Share: 0.45, Reason: budget.Reason{Why: budget.WhyEven}}
	idle := budget.Lease{Floor: 0.05, Reason: budget.Reason{Why: budget.WhyIdle}}
	spare := budget.Lease{Floor: 0.05, Share: 0.85, Reason: budget.Reason{Why: budget.WhySpare, Demand: 0.2, Target: 0.85}}
	var m moveLog
	m.note(at, []budget.Document{doc(1, even, even)}, 0.01, nil)
	m.note(at.Add(time.Second), []budget.Document{doc(1, even, even)}, 0.01, nil)
	nudged := even
	nudged.Share += 0.004
	m.note(at.Add(2*time.Second), []budget.Document{doc(2, nudged, even)}, 0.01, nil)
	if len(m.moves) != 0 {
		t.Fatalf("moves %+v, want none: a first document, the same again, a change of less than half a point", m.moves)
	}
	m.note(at.Add(3*time.Second), []budget.Document{doc(3, spare, idle)}, 0.01, nil)
	if len(m.moves) != 2 {
		t.Fatalf("moves %+v, want eu's and us's", m.moves)
	}
	eu, us := m.moves[0], m.moves[1]
	if eu.Region != "eu" || eu.AtMillis != at.Add(3*time.Second).UnixMilli() || !strings.HasPrefix(eu.Text, "eu 50.4% → 90.0%: demand and spare — it asks 20.0%") {
		t.Errorf("eu's move %+v", eu)
	}
	if us.Region != "us" || us.Text != "us 50.0% → 5.0%: floor — it asks nothing of the rule; the rest goes to the regions that do" {
		t.Errorf("us's move %+v", us)
	}
	m.trim(at.Add(4 * time.Second).UnixMilli())
	if len(m.moves) != 0 {
		t.Errorf("moves %+v after trimming those before they were made, want none", m.moves)
	}
}
