package main

import (
	_ "embed"
	"net/http"
	"slices"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
)

// dashboardHistory is how many samples the dashboard keeps: ten minutes
// at one rebalance a second.
const dashboardHistory = 600

// DashboardSample is what every region may admit (its lease's share of the
// limit, floor included), was asked for and admitted (in limits per
// window), rule by rule, at one time.
type DashboardSample struct {
	AtMillis int64                              `json:"at_ms"`
	Rules    map[string]map[string]coord.Figure `json:"rules"` // rule → region
}

// sample records the figures of the moment for the dashboard.
func (s *Service) sample(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history = append(s.history, DashboardSample{AtMillis: now.UnixMilli(), Rules: s.coord.Figures(now)})
	if len(s.history) > dashboardHistory {
		s.history = slices.Delete(s.history, 0, len(s.history)-dashboardHistory)
	}
}

// Dashboard is what the dashboard page shows: the regions, and the
// figures of the last minutes.
type Dashboard struct {
	ID       string               `json:"id"`
	Leader   bool                 `json:"leader"`
	NowMS    int64                `json:"now_ms"`
	Regions  []coord.RegionStatus `json:"regions"`
	History  []DashboardSample    `json:"history"`
	Interval int64                `json:"interval_ms"`
	// BooksClosedMS: every window that ended by then has had its books
	// closed (by this instance or the leaders before it); 0 if none.
	BooksClosedMS int64 `json:"books_closed_ms"`
}

// Dashboard returns the dashboard's data.
func (s *Service) Dashboard() Dashboard {
	d := Dashboard{ID: s.cfg.ID, Leader: s.Leader(), NowMS: s.cfg.Clock().UnixMilli(), Regions: s.Regions(),
		Interval: s.cfg.Rebalance.Milliseconds()}
	s.mu.Lock()
	d.History = slices.Clone(s.history)
	if bc := s.coord.BooksClosed(); !bc.IsZero() {
		d.BooksClosedMS = bc.UnixMilli()
	}
	s.mu.Unlock()
	return d
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
