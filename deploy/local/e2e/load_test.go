//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// admission is one request the clients saw admitted.
type admission struct {
	region, replica string
	window          int64     // start of the window it counted in, Unix ms
	at              time.Time // when the answer arrived
	degraded        bool      // decided without the region's store
}

// ledger is what the clients saw: every admission, and per window and
// region the calls whose outcome they could not see. Safe for concurrent
// use.
type ledger struct {
	window time.Duration
	// degradedOK: the rule admits without the store (its default), and
	// counts what it admits so.
	degradedOK bool

	mu         sync.Mutex
	admissions []admission
	ambiguous  map[int64]map[string]int // window → region → calls that may have counted
	denied     map[string]int           // region → 429s
	failed     map[string]int           // region → calls with no answer
	closed     map[string]int           // region → 503s (fail_closed)
	degraded   map[string]int           // region → degraded admissions
	problems   []string                 // answers that break the HTTP contract
}

func newLedger(window time.Duration) *ledger {
	return &ledger{window: window, ambiguous: map[int64]map[string]int{}, denied: map[string]int{},
		failed: map[string]int{}, closed: map[string]int{}, degraded: map[string]int{}}
}

// windowOf is the start (Unix ms) of the window that holds t: fixed
// windows are aligned to the epoch.
func (l *ledger) windowOf(t time.Time) int64 {
	w := l.window.Milliseconds()
	return t.UnixMilli() / w * w
}

// windowEnding is the start of the window a reset_at belongs to: its end
// is reset_at rounded up to a whole window, whether reset_at was rounded
// down to a second or up.
func (l *ledger) windowEnding(resetAt time.Time) int64 {
	w := l.window.Milliseconds()
	end := (resetAt.UnixMilli() + w - 1) / w * w
	return end - w
}

// unseen records a call whose outcome the client could not see, in every
// window it may have counted in: those of its sending and of its end.
func (l *ledger) unseen(region string, sent, done time.Time) {
	windows := []int64{l.windowOf(sent)}
	if w := l.windowOf(done); w != windows[0] {
		windows = append(windows, w)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range windows {
		if l.ambiguous[w] == nil {
			l.ambiguous[w] = map[string]int{}
		}
		l.ambiguous[w][region]++
	}
}

func (l *ledger) problem(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.problems) < 20 {
		l.problems = append(l.problems, fmt.Sprintf(format, args...))
	}
}

// checkAnswer is what POST /v1/check answers, allowed or not.
type checkAnswer struct {
	Allowed  bool   `json:"allowed"`
	Rule     string `json:"rule"`
	Limit    int64  `json:"limit"`
	ResetAt  string `json:"reset_at"`
	Degraded bool   `json:"degraded"`
	Error    *struct {
		Code    string `json:"code"`
		Details struct {
			Rule    string `json:"rule"`
			Limit   int64  `json:"limit"`
			ResetAt string `json:"reset_at"`
		} `json:"details"`
	} `json:"error"`
}

// record files one answer of a replica of region to a call sent at sent.
func (l *ledger) record(region, replica string, sent, done time.Time, status int, body []byte) {
	var a checkAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		l.problem("%s: %d with a body that is not JSON: %q", replica, status, body)
		l.unseen(region, sent, done)
		return
	}
	switch status {
	case http.StatusOK:
		if !a.Allowed {
			l.problem("%s: 200 with allowed false: %s", replica, body)
			return
		}
		if a.Degraded {
			// Admitted without the store: a global rule counts it in the
			// replica's memory, and in the store once it is back.
			l.mu.Lock()
			l.degraded[region]++
			l.mu.Unlock()
		}
		reset, err := time.Parse(time.RFC3339, a.ResetAt)
		if err != nil {
			l.problem("%s: 200 with reset_at %q: %v", replica, a.ResetAt, err)
			l.unseen(region, sent, done)
			return
		}
		w := l.windowEnding(reset)
		// The window counted in must hold part of the call's life.
		if w > done.Add(time.Second).UnixMilli() || w+l.window.Milliseconds() < sent.Add(-time.Second).UnixMilli() {
			l.problem("%s: admitted at %s in the window ending %s", replica, done.Format(time.StampMilli), a.ResetAt)
		}
		l.mu.Lock()
		l.admissions = append(l.admissions, admission{region: region, replica: replica, window: w, at: done, degraded: a.Degraded})
		l.mu.Unlock()
	case http.StatusTooManyRequests:
		if a.Error == nil || a.Error.Code != "RATE_LIMIT_EXCEEDED" || a.Error.Details.ResetAt == "" {
			l.problem("%s: 429 without the error body of the HTTP API: %s", replica, body)
		}
		l.mu.Lock()
		l.denied[region]++
		l.mu.Unlock()
	case http.StatusServiceUnavailable:
		// fail_closed: the store did not answer in time, but may have
		// counted the call.
		if a.Error == nil || a.Error.Code != "RATE_LIMITER_UNAVAILABLE" {
			l.problem("%s: 503 without code RATE_LIMITER_UNAVAILABLE: %s", replica, body)
		}
		l.mu.Lock()
		l.closed[region]++
		l.mu.Unlock()
		l.unseen(region, sent, done)
	default:
		l.problem("%s: unexpected %d: %s", replica, status, body)
		l.unseen(region, sent, done)
	}
}

// failedCall records a call that got no answer.
func (l *ledger) failedCall(region string, sent, done time.Time) {
	l.mu.Lock()
	l.failed[region]++
	l.mu.Unlock()
	l.unseen(region, sent, done)
}

// admitted returns, per region, what the clients saw admitted in window w.
func (l *ledger) admitted(w int64) map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int64{}
	for _, a := range l.admissions {
		if a.window == w {
			out[a.region]++
		}
	}
	return out
}

// admittedBefore counts region's admissions in window w answered before t.
func (l *ledger) admittedBefore(region string, w int64, t time.Time) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, a := range l.admissions {
		if a.region == region && a.window == w && a.at.Before(t) {
			n++
		}
	}
	return n
}

// count counts the admissions for which f holds.
func (l *ledger) count(f func(admission) bool) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, a := range l.admissions {
		if f(a) {
			n++
		}
	}
	return n
}

// admittedBy counts what one replica was seen to admit in window w.
func (l *ledger) admittedBy(replica string, w int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, a := range l.admissions {
		if a.replica == replica && a.window == w {
			n++
		}
	}
	return n
}

// unknown returns, per region, the calls of window w whose outcome the
// clients could not see.
func (l *ledger) unknown(w int64) map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int64{}
	for r, n := range l.ambiguous[w] {
		out[r] = int64(n)
	}
	return out
}

// windows lists every window the clients saw activity in, oldest first.
func (l *ledger) windows() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := map[int64]bool{}
	for _, a := range l.admissions {
		set[a.window] = true
	}
	for w := range l.ambiguous {
		set[w] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// summary says what the clients saw, for the test's log.
func (l *ledger) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	per := map[string]int{}
	for _, a := range l.admissions {
		per[a.region]++
	}
	return fmt.Sprintf("admitted %v, denied %v, unavailable (503) %v, no answer %v, degraded %v",
		per, l.denied, l.closed, l.failed, l.degraded)
}

// outcomes returns, per region, the calls that got no answer, the 503s
// and the degraded admissions.
func (l *ledger) outcomes() (failed, closed, degraded map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.failed), maps.Clone(l.closed), maps.Clone(l.degraded)
}

// contractBreaks returns the answers that broke the HTTP contract.
func (l *ledger) contractBreaks() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.problems)
}

// load is the clients: per region, workers sending POST /v1/check for one
// key at a steady rate, spread over the region's replicas, each worker
// moving on to the next replica when one does not answer.
type load struct {
	ledger *ledger
	stop   chan struct{}
	wg     sync.WaitGroup
	client *http.Client
	once   sync.Once
}

// loadWorkers is the number of workers per region.
const loadWorkers = 3

// startLoad sends rate checks a second for api_key key to every region's
// replicas, until Stop (called at the latest when the test ends).
func startLoad(t *testing.T, d *harness.Deployment, key string, window time.Duration, rate int) *load {
	t.Helper()
	rates := map[string]int{}
	for _, r := range d.Regions {
		rates[r.Name] = rate
	}
	return startLoadAt(t, d, key, window, rates)
}

// startLoadAt sends rates[region] checks a second for api_key key to each
// region named, until Stop.
func startLoadAt(t *testing.T, d *harness.Deployment, key string, window time.Duration, rates map[string]int) *load {
	t.Helper()
	ld := &load{ledger: newLedger(window), stop: make(chan struct{}),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: loadWorkers}}}
	body := []byte(fmt.Sprintf(`{"descriptors":{"api_key":%q,"endpoint":"/x"},"cost":1}`, key))
	for _, r := range d.Regions {
		rate := rates[r.Name]
		if rate <= 0 {
			continue
		}
		every := time.Duration(loadWorkers) * time.Second / time.Duration(rate)
		for i := range loadWorkers {
			ld.wg.Add(1)
			go ld.work(r, i, body, every)
		}
	}
	t.Cleanup(ld.Stop)
	return ld
}

func (ld *load) work(r *harness.DeployedRegion, worker int, body []byte, every time.Duration) {
	defer ld.wg.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	next := worker % len(r.Replicas)
	for {
		select {
		case <-ld.stop:
			return
		case <-tick.C:
		}
		rep := r.Replicas[next]
		if !ld.call(r.Name, rep, body) {
			next = (next + 1) % len(r.Replicas) // fail over to the sibling
		}
	}
}

// call sends one check and records its outcome; false if the replica
// did not answer.
func (ld *load) call(region string, rep *harness.Daemon, body []byte) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sent := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rep.HTTPAddr+"/v1/check", bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ld.client.Do(req)
	if err != nil {
		ld.ledger.failedCall(region, sent, time.Now())
		return false
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	done := time.Now()
	if err != nil {
		ld.ledger.failedCall(region, sent, done)
		return false
	}
	ld.ledger.record(region, rep.Name, sent, done, resp.StatusCode, b)
	return true
}

// Stop stops the clients and waits for their last calls.
func (ld *load) Stop() {
	ld.once.Do(func() {
		close(ld.stop)
		ld.wg.Wait()
		ld.client.CloseIdleConnections()
	})
}

// getJSON GETs url, wants 200, and decodes the body into v unless v is
// nil; with a timeout.
func getJSON(url string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(b, v)
}

// noKeepAlive serves the tests' own queries: no connection outlives one,
// so none is left behind when a test ends.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// usage is GET /v1/usage for a global rule.
type usage struct {
	Rule        string `json:"rule"`
	WindowStart string `json:"window_start"`
	Limit       int64  `json:"limit"`
	GlobalUsed  int64  `json:"global_used"`
	Regions     []struct {
		Region      string  `json:"region"`
		Used        int64   `json:"used"`
		Share       float64 `json:"share"`
		LastHeardMS int64   `json:"last_heard_ms"`
		Stale       bool    `json:"stale"`
	} `json:"regions"`
}

// usageOf asks a replica for the usage of rule g by api_key key.
func usageOf(rep *harness.Daemon, key string) (usage, error) {
	var u usage
	err := getJSON("http://"+rep.HTTPAddr+"/v1/usage?rule=g&api_key="+key, &u)
	return u, err
}

// ownShare is the share of the limit a region's replica enforces now (its
// lease's, or its floor), from /v1/usage; -1 if it cannot tell.
func ownShare(r *harness.DeployedRegion, rep *harness.Daemon, key string) float64 {
	u, err := usageOf(rep, key)
	if err != nil {
		return -1
	}
	for _, x := range u.Regions {
		if x.Region == r.Name {
			return x.Share
		}
	}
	return -1
}
