package main

import (
	_ "embed"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
)

// dashboardHistory is how many samples the dashboard keeps: ten minutes
// at one rebalance a second.
const dashboardHistory = 600

// maxFaults bounds the faults and leader changes the dashboard keeps.
const maxFaults = 200

// DashboardSample is what the leader granted every region (its lease's
// share of the limit, floor included), and what the region was asked for
// and admitted (in limits per window), rule by rule, at one time.
type DashboardSample struct {
	AtMillis int64                              `json:"at_ms"`
	Rules    map[string]map[string]coord.Figure `json:"rules"` // rule → region
}

// The kinds of Fault.
const (
	FaultSilent  = "silent"  // a region is no longer heard: cut off, or down
	FaultHeard   = "heard"   // a region silent is heard again
	FaultLapsed  = "lapsed"  // a region reports its lease lapsed: it is on its floor
	FaultRenewed = "renewed" // a region whose lease lapsed holds one again
	FaultLeader  = "leader"  // another instance leads
)

// Fault is a fault this instance saw, or a leader change, for the
// dashboard's list and its charts' markers.
type Fault struct {
	AtMillis int64  `json:"at_ms"`
	Kind     string `json:"kind"`
	Region   string `json:"region,omitempty"`
	Rule     string `json:"rule,omitempty"` // FaultLapsed and FaultRenewed
	Text     string `json:"text"`
}

// faultLog finds faults and leader changes by comparing each sample's
// state with the one before.
type faultLog struct {
	faults []Fault
	silent map[string]int64 // regions found silent: when last heard (Unix ms)
	lapsed map[[2]string]bool
	leader string // the last instance known to lead
}

// note records what changed at now: regions silent or heard again,
// leases lapsed or held again (as the regions report them), and the
// leader.
func (f *faultLog) note(now time.Time, regions []coord.RegionStatus, enforced map[string]map[string]coord.Enforced, leader string) {
	if f.silent == nil {
		f.silent, f.lapsed = map[string]int64{}, map[[2]string]bool{}
	}
	add := func(at int64, kind, region, rule, text string) {
		fault := Fault{AtMillis: at, Kind: kind, Region: region, Rule: rule, Text: text}
		i := len(f.faults)
		for i > 0 && f.faults[i-1].AtMillis > at {
			i--
		}
		f.faults = slices.Insert(f.faults, i, fault)
	}
	ms := now.UnixMilli()
	if leader != "" && leader != f.leader {
		if f.leader != "" {
			add(ms, FaultLeader, "", "", fmt.Sprintf("%s leads (was %s)", leader, f.leader))
		}
		f.leader = leader
	}
	for _, st := range regions {
		// A region falls silent when it was last heard: that is when
		// the fault is marked, though it shows a few rebalances later.
		since, silent := f.silent[st.Region]
		switch {
		case st.Suspect && st.LastHeardMS != nil && !silent:
			heard := *st.LastHeardMS
			f.silent[st.Region] = ms - heard
			add(ms-heard, FaultSilent, st.Region, "", fmt.Sprintf("%s not heard from then on (noticed %.1f s later): cut off, or down",
				st.Region, float64(heard)/1000))
		case !st.Suspect && silent:
			delete(f.silent, st.Region)
			add(ms, FaultHeard, st.Region, "", fmt.Sprintf("%s heard again, after %.0f s", st.Region, float64(ms-since)/1000))
		}
	}
	for _, rule := range slices.Sorted(maps.Keys(enforced)) {
		byRegion := enforced[rule]
		for _, region := range slices.Sorted(maps.Keys(byRegion)) {
			e, k := byRegion[region], [2]string{rule, region}
			switch {
			case e.State == coord.EnforcingLapsed && !f.lapsed[k]:
				f.lapsed[k] = true
				text := fmt.Sprintf("%s's lease of %s lapsed, by its last report: on its floor", region, rule)
				if e.Allowance != nil {
					text += fmt.Sprintf(", %s of the limit", percent(*e.Allowance))
				}
				add(ms, FaultLapsed, region, rule, text)
			case e.State == coord.EnforcingLease && f.lapsed[k]:
				delete(f.lapsed, k)
				add(ms, FaultRenewed, region, rule, fmt.Sprintf("%s holds a lease of %s again", region, rule))
			}
		}
	}
}

// trim drops the faults before from, and the oldest beyond maxFaults.
func (f *faultLog) trim(from int64) {
	f.faults = trimmed(f.faults, from, maxFaults, func(f Fault) int64 { return f.AtMillis })
}

// trimmed drops the entries of s (oldest first) before from, by at, and
// the oldest beyond most.
func trimmed[T any](s []T, from int64, most int, at func(T) int64) []T {
	i := 0
	for i < len(s) && (at(s[i]) < from || len(s)-i > most) {
		i++
	}
	return slices.Delete(s, 0, i)
}

// sample records the figures of the moment for the dashboard, and the
// faults, leader changes and lease moves since the last.
func (s *Service) sample(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history = append(s.history, DashboardSample{AtMillis: now.UnixMilli(), Rules: s.coord.Figures(now)})
	if len(s.history) > dashboardHistory {
		s.history = slices.Delete(s.history, 0, len(s.history)-dashboardHistory)
	}
	leader := ""
	if !s.claimAt.IsZero() {
		leader = s.claim.ID
	}
	status := s.coord.Status(now)
	s.faults.note(now, status, s.coord.Enforced(now), leader)
	s.faults.trim(s.history[0].AtMillis)
	s.moves.note(now, s.coord.Budgets(), s.cfg.Budget.Hysteresis, silent(status))
	s.moves.trim(s.history[0].AtMillis)
}

// Dashboard is what the dashboard page shows: who leads, the regions, the
// leases of every global rule as the leader granted them and as the
// regions report they enforce them, the figures of the last minutes, and
// the faults, leader changes and lease moves seen in them.
type Dashboard struct {
	ID     string `json:"id"`
	Leader bool   `json:"leader"`
	// Ready, Role, LeaderID, LeaderURL and NotReady are Readiness's: a
	// follower names the instance that leads.
	Ready     bool                 `json:"ready"`
	Role      string               `json:"role,omitempty"`
	LeaderID  string               `json:"leader_id,omitempty"`
	LeaderURL string               `json:"leader_url,omitempty"`
	NotReady  string               `json:"not_ready,omitempty"`
	NowMS     int64                `json:"now_ms"`
	Regions   []coord.RegionStatus `json:"regions"`
	// Leases are every rule's leases now, by rule then region.
	Leases map[string]map[string]RegionLease `json:"leases"`
	// OwnBudgets counts, by rule, the counters with budgets of their own
	// in the leader's last document: leased apart, they are in none of
	// the rule's figures.
	OwnBudgets map[string]int    `json:"own_budgets,omitempty"`
	History    []DashboardSample `json:"history"`
	Faults     []Fault           `json:"faults"`
	// Moves are the changes of what the leader granted, with why,
	// oldest first.
	Moves    []Move `json:"moves"`
	Interval int64  `json:"interval_ms"`
	// BooksClosedMS: every window that ended by then has had its books
	// closed (by this instance or the leaders before it); 0 if none.
	BooksClosedMS int64 `json:"books_closed_ms"`
}

// RegionLease is one region's lease of one rule now: what the leader
// granted it (nil if nothing this instance knows of), and what its
// replicas report they enforce (nil if none reported the rule), with the
// figures of the moment.
type RegionLease struct {
	coord.Figure
	Granted  *Granted        `json:"granted,omitempty"`
	Enforced *coord.Enforced `json:"enforced,omitempty"`
}

// Granted is a region's lease as the leader last published it.
type Granted struct {
	Seq       uint64  `json:"seq"`
	Allowance float64 `json:"allowance"`
	Floor     float64 `json:"floor"`
	ExpiresMS int64   `json:"expires_ms"`
	Valid     bool    `json:"valid"`
	By        string  `json:"by"` // the instance that published it
	// Reason is why the leader granted what it did (budget.Reason), and
	// Why that in words; both absent if the leader gave no reason.
	Reason *budget.Reason `json:"reason,omitempty"`
	Why    string         `json:"why,omitempty"`
}

// Dashboard returns the dashboard's data.
func (s *Service) Dashboard() Dashboard {
	now := s.cfg.Clock()
	rd := s.Readiness()
	d := Dashboard{ID: s.cfg.ID, Leader: s.Leader(), Ready: rd.Ready, Role: rd.Role, LeaderID: rd.Leader, LeaderURL: rd.LeaderURL,
		NotReady: rd.Reason, NowMS: now.UnixMilli(), Regions: s.Regions(), Interval: s.cfg.Rebalance.Milliseconds(),
		Leases: map[string]map[string]RegionLease{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	enforced := s.coord.Enforced(now)
	unheard := silent(d.Regions)
	for rule, byRegion := range s.coord.Figures(now) {
		doc := s.coord.Budget(rule)
		if n := len(doc.Counters); n > 0 {
			if d.OwnBudgets == nil {
				d.OwnBudgets = map[string]int{}
			}
			d.OwnBudgets[rule] = n
		}
		out := map[string]RegionLease{}
		for region, f := range byRegion {
			rl := RegionLease{Figure: f}
			if l, ok := doc.Lease(region); ok {
				rl.Granted = &Granted{Seq: l.Seq, Allowance: l.Allowance(), Floor: l.Floor, ExpiresMS: l.Expires.UnixMilli(),
					Valid: l.Holds(now), By: doc.Leader, Why: explain(l, len(doc.Counters), s.cfg.Budget.Hysteresis, unheard[region])}
				if l.Reason.Why != "" {
					rl.Granted.Reason = &l.Reason
				}
			}
			out[region] = rl
		}
		for region, e := range enforced[rule] {
			rl := out[region]
			rl.Enforced = &e
			out[region] = rl
		}
		d.Leases[rule] = out
	}
	d.History = slices.Clone(s.history)
	d.Faults = orEmpty(slices.Clone(s.faults.faults))
	d.Moves = orEmpty(slices.Clone(s.moves.moves))
	if bc := s.coord.BooksClosed(); !bc.IsZero() {
		d.BooksClosedMS = bc.UnixMilli()
	}
	return d
}

// silent are the regions of regions not heard lately.
func silent(regions []coord.RegionStatus) map[string]bool {
	out := map[string]bool{}
	for _, st := range regions {
		if st.Suspect {
			out[st.Region] = true
		}
	}
	return out
}

//go:embed dashboard.html
var dashboardPage []byte

// serveDashboard serves the page: self-contained, it draws what
// /v1/dashboard returns, every two seconds.
func serveDashboard(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'")
	w.Write(dashboardPage)
}
