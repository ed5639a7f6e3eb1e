package sim

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report is what a run found.
type Report struct {
	Scenario    string
	Description string
	Mode        string
	Seed        uint64
	Regions     []string
	Limit       int64
	// Unit is what the limit counts: "" for requests, or "tokens"
	// (traffic with tokens: every figure of requests and admissions is
	// then in tokens).
	Unit      string
	Window    time.Duration
	Algorithm string
	Duration  time.Duration
	Gossip    time.Duration
	Latency   [2]time.Duration // the shortest and longest link
	Links     []LinkLatency    // every link between two regions
	Windows   []Window
	Samples   []Sample
	Notes     []Note
	Heals     []Heal
	Expiries  []Expiry
	Found     []OverAdmission
	// BooksClosed is the end of the last window whose books globalsync
	// closed (Found covers the windows that ended by then).
	BooksClosed time.Duration
	// ElasticBound is the scenario's bound on elastic over-admission,
	// percent of the limit; StrictBound, on strict's (traffic with
	// tokens: what is counted after the answers).
	ElasticBound, StrictBound float64
	// Requests, Admitted and FalseRejected are over the whole run.
	Requests, Admitted, FalseRejected int64
	// MessagesCut and MessagesLost count gossip and budget messages that
	// a cut link or loss kept from their destination.
	MessagesCut, MessagesLost int64
	// Shards are globalsync's instances' figures, one per instance
	// (GlobalSyncSpec.Shards); the text shows them when there are several.
	Shards []ShardFigures
	// Live is set for a report of a scenario played against a real
	// deployment (sim live), which cannot see lease expiries or messages.
	Live bool
	// Failed, in a live report, counts the requests that got no answer,
	// or one neither admitting nor denying: in none of the figures.
	Failed int64
	// Faults are the scenario's faults as they played out, in order of
	// their start.
	Faults []Fault
}

// Fault is one fault of a run and how long it lasted.
type Fault struct {
	// Kind is the scenario's (FaultSpec.Kind): partition, split,
	// globalsync-down, redis-down or clock-jump.
	Kind string
	// What says what happened: "ap cut off", "eu's Redis down".
	What string
	// From and To bound it in true virtual time; a clock jump has no
	// length (To is From).
	From, To time.Duration
}

// FaultsOf is what the faults of a scenario are over a run of duration d:
// a partition or a split lasts until the next heal, or the end; a fault
// due at d or after does not happen.
func FaultsOf(sc *Scenario, d time.Duration) []Fault {
	heal := func(after time.Duration) time.Duration {
		end := d
		for _, f := range sc.Faults {
			if f.Kind == "heal" && f.At > after {
				end = min(end, f.At)
			}
		}
		return end
	}
	var out []Fault
	for _, f := range sc.Faults {
		if f.At >= d || f.Kind == "heal" {
			continue
		}
		ft := Fault{Kind: f.Kind, From: f.At, To: f.At}
		switch f.Kind {
		case "partition":
			ft.What, ft.To = strings.Join(f.Regions, ", ")+" cut off", heal(f.At)
		case "split":
			var groups []string
			for _, g := range f.Groups {
				groups = append(groups, strings.Join(g, " "))
			}
			ft.What, ft.To = "split: "+strings.Join(groups, " | "), heal(f.At)
		case "globalsync-down":
			ft.What, ft.To = "globalsync down", min(f.At+f.For, d)
		case "redis-down":
			ft.What, ft.To = f.Region+"'s Redis down", min(f.At+f.For, d)
		case "clock-jump":
			sign := "+"
			if f.By < 0 {
				sign = ""
			}
			ft.What = fmt.Sprintf("%s's clock jumps %s%v", f.Region, sign, f.By)
		}
		out = append(out, ft)
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(a.From, b.From) })
	return out
}

// Window is one window of the rule, all counters together. Windows are
// aligned to the rule's window (as a fixed window is); for a sliding
// window counter, whose estimate reaches into the window before, the
// figures are per aligned window all the same: admissions over the limit
// in one are over-admission either way, but the room counted for false
// rejections may be more than the counter would have given.
type Window struct {
	Start time.Duration // true virtual time
	// Full is false for a window the run began or ended within.
	Full     bool
	Requests int64
	// Admitted is what the busiest counter admitted, every region
	// together; Counters how many counters admitted anything.
	Admitted int64
	Counters int
	// Over is the worst counter's admissions beyond the limit; OverCount
	// how many counters went beyond it; OverTotal their sum.
	Over, OverCount, OverTotal int64
	// FalseRejected counts requests denied that their counter's window had
	// room for: for each counter, its denials up to the part of its limit
	// left unused when the window closed.
	FalseRejected int64
	// ByRegion is what each region admitted, all counters; Shares what
	// it might admit (its allowance) in the middle of the window.
	ByRegion []int64
	Shares   []float64
	// RequestsByRegion is what callers asked of each region, all
	// counters: its demand.
	RequestsByRegion []int64
	// FalseRejectedByRegion splits FalseRejected over the regions: each
	// counter's false rejections in proportion to the requests of it each
	// region denied, rounded so that they sum to FalseRejected. Nil where
	// not known (a live run counts denials by counter, not by region).
	FalseRejectedByRegion []int64
	// Tenants is how the counters asked for more than their limit in the
	// window fared: admitted ÷ limit, over those counters.
	Tenants TenantUse
}

// TenantUse is the distribution of admitted ÷ limit over the counters of
// a window asked for more than their limit.
type TenantUse struct {
	Count            int
	Min, P1, P5, P50 float64
	Worst            string // the key of the one that got least
}

// units is what the report's figures count: requests, or its Unit.
func (r *Report) units() string {
	if r.Unit == "" {
		return "requests"
	}
	return r.Unit
}

// OverPct is the worst counter's over-admission, percent of the limit.
func (w Window) OverPct(limit int64) float64 { return 100 * float64(w.Over) / float64(limit) }

// FalseRejPct is the share of requests denied while there was room.
func (w Window) FalseRejPct() float64 {
	if w.Requests == 0 {
		return 0
	}
	return 100 * float64(w.FalseRejected) / float64(w.Requests)
}

// ShardFigures is one globalsync instance's figures over a run: the most
// counters with budgets of their own its document held, counter windows
// its copy of the usage held, and bytes its document took; how many
// rebalances it ran, and the wall time it spent in them and in taking in
// the gossip and heartbeats (Work, which the report's text leaves out: it
// is the machine's, not the run's).
type ShardFigures struct {
	Budgets, Copied, Largest int
	Rebalances               int
	Work                     time.Duration
}

// Utilization is what the busiest counter admitted, of its limit.
func (w Window) Utilization(limit int64) float64 { return float64(w.Admitted) / float64(limit) }

func (s *sim) report() *Report {
	sc := s.sc
	rep := &Report{Scenario: sc.Name, Description: strings.TrimSpace(sc.Description), Mode: s.mode, Seed: s.seed,
		Regions: sc.Regions, Limit: sc.Rule.Limit, Window: sc.Rule.Window, Algorithm: sc.Rule.Algorithm,
		Duration: s.duration, Gossip: sc.Gossip.Interval, Samples: s.rec.samples, Notes: s.rec.notes,
		Heals: s.rec.heals, Expiries: s.rec.expiries(), Found: s.gs.found, BooksClosed: s.gs.closedThrough,
		ElasticBound: *sc.Expect.MaxElasticOver, StrictBound: sc.Expect.MaxStrictOver,
		MessagesCut: s.net.cut.Load(), MessagesLost: s.net.lost.Load(), Faults: FaultsOf(sc, s.duration)}
	for _, sh := range s.gs.shards {
		rep.Shards = append(rep.Shards, ShardFigures{Budgets: sh.budgets, Copied: sh.copied, Largest: sh.largest,
			Rebalances: sh.rebalances, Work: sh.work})
	}
	rep.Latency = [2]time.Duration{time.Hour, 0}
	for i, a := range sc.Regions {
		for _, b := range sc.Regions[i+1:] {
			d := s.net.Latency(a, b)
			rep.Latency[0], rep.Latency[1] = min(rep.Latency[0], d), max(rep.Latency[1], d)
			rep.Links = append(rep.Links, LinkLatency{A: a, B: b, Latency: d})
		}
	}
	for _, t := range sc.Traffic {
		if t.Tokens != nil {
			rep.Unit = "tokens"
		}
	}
	if sc.Rule.Algorithm == "concurrency" {
		// What a counter admitted of a window is the most streams it had
		// in flight at once in it; the requests, the streams asked for.
		s.truth.streamsInFlight(s.window)
	}
	epochs := map[int64]bool{}
	for e := range s.truth.global {
		epochs[e] = true
	}
	for _, rt := range s.truth.regions {
		for e := range rt.windows {
			epochs[e] = true
		}
	}
	sorted := make([]int64, 0, len(epochs))
	for e := range epochs {
		sorted = append(sorted, e)
	}
	slices.Sort(sorted)
	w := sc.Rule.Window
	for _, e := range sorted {
		start := time.UnixMicro(e * s.window).Sub(epoch0)
		win := Window{Start: start, Full: start >= 0 && start+w <= s.duration, ByRegion: make([]int64, len(s.regions)),
			RequestsByRegion: make([]int64, len(s.regions))}
		// falseBy is each region's part of the false rejections, before
		// rounding.
		falseBy := make([]float64, len(s.regions))
		if g := s.truth.global[e]; g != nil {
			win.Tenants = s.tenantUse(g)
			for k, n := range g.admitted {
				adm := int64(n)
				if adm > 0 {
					win.Counters++
				}
				win.Admitted = max(win.Admitted, adm)
				if over := adm - sc.Rule.Limit; over > 0 {
					win.Over = max(win.Over, over)
					win.OverCount++
					win.OverTotal += over
				}
				falseRej := min(int64(g.denied[k]), max(0, sc.Rule.Limit-adm))
				win.FalseRejected += falseRej
				if falseRej == 0 {
					continue
				}
				for i, denied := range g.deniedIn {
					if denied != nil && denied[k] > 0 {
						falseBy[i] += float64(falseRej) * float64(denied[k]) / float64(g.denied[k])
					}
				}
			}
		}
		win.FalseRejectedByRegion = apportion(win.FalseRejected, falseBy)
		rep.FalseRejected += win.FalseRejected
		for i, rt := range s.truth.regions {
			if c := rt.windows[e]; c != nil {
				win.Requests += c.requests
				win.ByRegion[i] = c.admitted
				win.RequestsByRegion[i] = c.requests
				rep.Requests += c.requests
				rep.Admitted += c.admitted
			}
		}
		win.Shares = s.sharesAt(start + w/2)
		rep.Windows = append(rep.Windows, win)
	}
	return rep
}

// apportion rounds parts that sum to total (or all but) to whole numbers
// that sum to it exactly: each its whole part, and what is left one by
// one to the largest fractions (the first of equal ones).
func apportion(total int64, parts []float64) []int64 {
	out := make([]int64, len(parts))
	left := total
	for i, p := range parts {
		out[i] = int64(math.Floor(p))
		left -= out[i]
	}
	order := make([]int, len(parts))
	for i := range order {
		order[i] = i
	}
	frac := func(i int) float64 { return parts[i] - math.Floor(parts[i]) }
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(frac(b), frac(a)) })
	for j := 0; left > 0 && len(order) > 0; j = (j + 1) % len(order) {
		out[order[j]]++
		left--
	}
	return out
}

// tenantUse is how the counters asked for more than the limit in a window
// fared.
func (s *sim) tenantUse(g *counterCounts) TenantUse {
	return TenantUseOf(s.sc.Rule.Limit, func(add func(string, int64, int64)) {
		for k, n := range g.admitted {
			add(s.keys[k], int64(n), int64(g.denied[k]))
		}
	})
}

// TenantUseOf is how the counters of a window asked for more than the
// limit fared: counts adds each counter's key, admitted and denied.
func TenantUseOf(limit int64, counts func(add func(key string, admitted, denied int64))) TenantUse {
	var use []float64
	var out TenantUse
	counts(func(key string, adm, den int64) {
		if adm+den <= limit {
			return
		}
		u := float64(adm) / float64(limit)
		if len(use) == 0 || u < out.Min || (u == out.Min && key < out.Worst) {
			out.Min, out.Worst = u, key
		}
		use = append(use, u)
	})
	if len(use) == 0 {
		return TenantUse{}
	}
	slices.Sort(use)
	out.Count, out.P1, out.P5, out.P50 = len(use), use[len(use)/100], use[len(use)*5/100], use[len(use)/2]
	return out
}

// sharesAt returns the sample nearest before t.
func (s *sim) sharesAt(t time.Duration) []float64 {
	smp := s.rec.samples
	i, _ := slices.BinarySearchFunc(smp, t, func(x Sample, t time.Duration) int { return int(x.At - t) })
	if i < len(smp) && smp[i].At == t {
		return smp[i].Shares
	}
	if i > 0 {
		return smp[i-1].Shares
	}
	return make([]float64, len(s.regions))
}

// WorstOverPct is the worst window's over-admission, percent of the limit.
func (r *Report) WorstOverPct() float64 {
	worst := 0.0
	for _, win := range r.Windows {
		worst = max(worst, win.OverPct(r.Limit))
	}
	return worst
}

// clockString writes a virtual time as m:ss.s.
func clockString(d time.Duration) string {
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	m := d / time.Minute
	sec := float64(d%time.Minute) / float64(time.Second)
	return fmt.Sprintf("%s%d:%04.1f", neg, m, sec)
}

// WriteText writes the report as a table and a summary.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s, %s mode, seed %d\n", r.Scenario, r.Mode, r.Seed)
	if r.Description != "" {
		for _, line := range strings.Split(r.Description, "\n") {
			fmt.Fprintf(&b, "  %s\n", line)
		}
	}
	unit := ""
	if r.Unit != "" {
		unit = " " + r.Unit
	}
	fmt.Fprintf(&b, "%d regions (%s), limit %d%s per %v (%s), %v of virtual time, gossip every %v, links %v to %v one way\n\n",
		len(r.Regions), strings.Join(r.Regions, " "), r.Limit, unit, r.Window, r.Algorithm, r.Duration, r.Gossip, r.Latency[0].Round(time.Millisecond), r.Latency[1].Round(time.Millisecond))
	fmt.Fprintf(&b, "%-8s %8s %9s %8s %6s %10s", "window", "limit", "requests", "admitted", "over%", "false-rej%")
	for _, name := range r.Regions {
		fmt.Fprintf(&b, " %6s", name)
	}
	b.WriteString("\n")
	for _, win := range r.Windows {
		mark := " "
		if !win.Full {
			mark = "*"
		}
		fmt.Fprintf(&b, "%-7s%s %8d %9d %8d %6.2f %10.2f", clockString(win.Start), mark, r.Limit, win.Requests, win.Admitted,
			win.OverPct(r.Limit), win.FalseRejPct())
		for _, sh := range win.Shares {
			fmt.Fprintf(&b, " %6.3f", sh)
		}
		b.WriteString("\n")
	}
	b.WriteString("(* a window the run covers in part; admitted: the busiest counter; region columns: the share of the limit each region might admit mid-window)\n\n")
	tenants := false
	for _, win := range r.Windows {
		tenants = tenants || win.Tenants.Count > 0
	}
	if tenants {
		b.WriteString("counters asked for more than the limit, what they admitted of it:\n")
		fmt.Fprintf(&b, "%-8s %8s %7s %7s %7s %7s  %s\n", "window", "counters", "least", "p1", "p5", "median", "least admitted by")
		for _, win := range r.Windows {
			if t := win.Tenants; t.Count > 0 {
				mark := " "
				if !win.Full {
					mark = "*"
				}
				fmt.Fprintf(&b, "%-7s%s %8d %6.1f%% %6.1f%% %6.1f%% %6.1f%%  %s\n", clockString(win.Start), mark, t.Count, 100*t.Min, 100*t.P1, 100*t.P5, 100*t.P50, t.Worst)
			}
		}
		b.WriteString("\n")
	}
	worst, over, overWindows := r.WorstOverPct(), int64(0), 0
	for _, win := range r.Windows {
		over += win.OverTotal
		if win.Over > 0 {
			overWindows++
		}
	}
	fmt.Fprintf(&b, "requests %d, admitted %d, false rejections %d (%.2f%%)\n", r.Requests, r.Admitted, r.FalseRejected, pct(r.FalseRejected, r.Requests))
	fmt.Fprintf(&b, "over-admission: %d in %d windows, worst %.2f%% of the limit\n", over, overWindows, worst)
	var found, wasOver int64
	for _, f := range r.Found {
		found += f.Amount
	}
	for _, win := range r.Windows {
		if win.Start+r.Window <= r.BooksClosed {
			wasOver += win.OverTotal
		}
	}
	fmt.Fprintf(&b, "globalsync closed the books of the windows that ended by %s: found %d over-admitted (%d were)",
		clockString(r.BooksClosed), found, wasOver)
	if len(r.Found) > 0 {
		by := map[string]int64{}
		for _, f := range r.Found {
			by[f.Region] += f.Amount
		}
		var parts []string
		for _, name := range sortedNames(by) {
			parts = append(parts, fmt.Sprintf("%s %d", name, by[name]))
		}
		fmt.Fprintf(&b, " (%s)", strings.Join(parts, ", "))
	}
	b.WriteString("\n")
	for _, h := range r.Heals {
		if h.Converged < 0 {
			fmt.Fprintf(&b, "heal at %s: copies did not agree within a minute\n", clockString(h.At))
		} else {
			fmt.Fprintf(&b, "heal at %s: every copy agreed %v later\n", clockString(h.At), h.Converged)
		}
	}
	switch {
	case r.Live:
		b.WriteString("lease expiries and messages: not seen live\n")
	case len(r.Expiries) == 0:
		b.WriteString("lease expiries: none\n")
	default:
		var parts []string
		for _, e := range r.Expiries {
			parts = append(parts, fmt.Sprintf("%s at %s", e.Region, clockString(e.At)))
		}
		fmt.Fprintf(&b, "lease expiries: %s\n", strings.Join(parts, ", "))
	}
	if !r.Live {
		fmt.Fprintf(&b, "messages cut %d, lost %d\n", r.MessagesCut, r.MessagesLost)
	}
	if len(r.Shards) > 1 {
		fmt.Fprintf(&b, "globalsync as %d instances, each the leader of a slice of the counters (the most of each):\n", len(r.Shards))
		for i, sh := range r.Shards {
			fmt.Fprintf(&b, "  %d: %d counters with budgets of their own, %d counter windows in its copy, a document of %d KB\n",
				i, sh.Budgets, sh.Copied, sh.Largest>>10)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  %s %s\n", clockString(n.At), n.Text)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// WriteCSV writes one row per window.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := []string{"window_start_s", "full", "limit", "requests", "admitted", "counters", "over", "over_pct", "over_counters",
		"false_rejected", "false_rejection_pct"}
	for _, name := range r.Regions {
		head = append(head, "admitted_"+name)
	}
	for _, name := range r.Regions {
		head = append(head, "share_"+name)
	}
	for _, name := range r.Regions {
		head = append(head, "requests_"+name)
	}
	for _, name := range r.Regions {
		head = append(head, "false_rejected_"+name)
	}
	cw.Write(head)
	f := func(v float64, prec int) string { return strconv.FormatFloat(v, 'f', prec, 64) }
	i := strconv.FormatInt
	for _, win := range r.Windows {
		row := []string{f(win.Start.Seconds(), 3), strconv.FormatBool(win.Full), i(r.Limit, 10), i(win.Requests, 10), i(win.Admitted, 10),
			strconv.Itoa(win.Counters), i(win.Over, 10), f(win.OverPct(r.Limit), 3), i(win.OverCount, 10),
			i(win.FalseRejected, 10), f(win.FalseRejPct(), 3)}
		for _, n := range win.ByRegion {
			row = append(row, i(n, 10))
		}
		for _, sh := range win.Shares {
			row = append(row, f(sh, 4))
		}
		for _, by := range [][]int64{win.RequestsByRegion, win.FalseRejectedByRegion} {
			for j := range r.Regions {
				if j < len(by) {
					row = append(row, i(by[j], 10))
				} else {
					row = append(row, "") // not known
				}
			}
		}
		cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}

// sharesCSV writes every sample: its time in seconds, then each region's
// share of the limit.
func (r *Report) sharesCSV() string {
	var b strings.Builder
	b.WriteString("at_s")
	for _, name := range r.Regions {
		b.WriteString("," + name)
	}
	b.WriteString("\n")
	for _, smp := range r.Samples {
		fmt.Fprintf(&b, "%.3f", smp.At.Seconds())
		for _, sh := range smp.Shares {
			fmt.Fprintf(&b, ",%.4f", sh)
		}
		b.WriteString("\n")
	}
	return b.String()
}
