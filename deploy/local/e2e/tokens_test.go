//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/geoquota/geoquota/deploy/local/harness"
	pb "github.com/geoquota/geoquota/transport/geoquotav1"
)

// TestStrictGlobalTokenLimit: an LLM gateway in each of three regions asks,
// before each request, whether the tenant is over its worldwide token
// limit (a check that counts nothing), and reports the answer's tokens at
// its end (most answers short, a few long). The regions count every token
// reported; in every window the world counts at most the limit and, past
// it, one answer under way per region when it reached its share; the
// tenant gets nearly all of its limit, shared out alike among regions that
// ask alike; globalsync's books list what was counted past the limit as
// debt, never as over-admission.
func TestStrictGlobalTokenLimit(t *testing.T) {
	const limit, window, longest = 1500, 5 * time.Second, 300
	rules := fmt.Sprintf(`rules:
  - { id: g, match: { api_key: "k*" }, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: %d, window: %s, count_over_limit: true }
`, limit, window)
	regions := []string{"us", "eu", "ap"}
	d := deploy(t, harness.DeploymentOptions{Regions: regions, Replicas: 1, GlobalSyncs: 1, Rules: []byte(rules)})
	st := openStores(t, d)
	start := time.Now()
	first := nextWindow(window, window) // a window for the budgets to follow the demand
	end := first.Add(2 * window)
	var mu sync.Mutex
	reported := map[string]int64{} // by region, every token the gateway reported
	var wg sync.WaitGroup
	for i, r := range d.Regions {
		rep := r.Replicas[0]
		conn, err := grpc.NewClient(rep.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		rl := pb.NewRateLimiterClient(conn)
		rng := rand.New(rand.NewPCG(uint64(i), 30))
		wg.Go(func() {
			for time.Now().Before(end) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				res, err := rl.Check(ctx, &pb.CheckRequest{Requests: []*pb.Request{{Descriptors: map[string]string{"api_key": "k1"}, CountNothing: true}}})
				cancel()
				if err != nil {
					t.Errorf("%s: the check before a request: %v", r.Name, err)
					return
				}
				if !res.Decisions[0].Allowed {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				tokens := int64(10 + rng.IntN(40)) // most answers short
				if rng.IntN(5) == 0 {
					tokens = int64(100 + rng.IntN(longest-100+1)) // some long
				}
				time.Sleep(10 * time.Millisecond) // the answer streams
				charged, err := report(rep.HTTPAddr, tokens)
				if err == nil && charged != tokens {
					err = fmt.Errorf("charged %d", charged)
				}
				if err != nil {
					t.Errorf("%s: the report of %d tokens: %v", r.Name, tokens, err)
					return
				}
				mu.Lock()
				reported[r.Name] += tokens
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var windows []int64
	for w := start.Truncate(window); w.Before(end.Add(window)); w = w.Add(window) {
		windows = append(windows, w.UnixMilli())
	}
	got := agree(t, d, st, "k1", windows, 15*time.Second)
	counted, past := map[string]int64{}, map[int64]int64{}
	for _, w := range windows {
		var total int64
		for r, n := range got[w] {
			counted[r] += n
			total += n
		}
		t.Logf("window %s: %d tokens counted (%v)", time.UnixMilli(w).Format("15:04:05"), total, got[w])
		past[w] = max(0, total-limit)
		if total > limit+int64(len(regions))*longest {
			t.Errorf("window %s: %d tokens counted, past the limit of %d by more than one answer of at most %d per region",
				time.UnixMilli(w).Format("15:04:05"), total, limit, longest)
		}
		if w < first.UnixMilli() || w >= end.UnixMilli() {
			continue
		}
		if total < limit*9/10 {
			t.Errorf("window %s: the tenant got %d of its %d tokens, want at least 90%%", time.UnixMilli(w).Format("15:04:05"), total, limit)
		}
		// Asked for alike everywhere, the limit is shared out alike: a
		// region turning its gateway's questions away shows the demand.
		for _, r := range regions {
			if n := got[w][r]; n < limit/int64(2*len(regions)) {
				t.Errorf("window %s: %s counted %d tokens, less than a sixth of the limit, asked for as much as the others", time.UnixMilli(w).Format("15:04:05"), r, n)
			}
		}
	}
	for _, r := range regions {
		if counted[r] != reported[r] {
			t.Errorf("%s: %d tokens counted, %d reported: every token reported counts", r, counted[r], reported[r])
		}
	}
	// The books of the last window close a little after it ends.
	gs := d.GlobalSyncs[0]
	var found []map[string]any
	harness.WaitFor(t, 30*time.Second, "globalsync to close the books of the windows judged", func() bool {
		var docs []map[string]any // first: the books found are read after they are closed
		return getJSON("http://"+gs.HTTPAddr+"/v1/budgets", &docs) == nil && booksClosedBy(docs, end) &&
			getJSON("http://"+gs.HTTPAddr+"/v1/over-admissions", &found) == nil
	})
	booked := map[int64]int64{}
	for _, oa := range found {
		start, err := time.Parse(time.RFC3339Nano, fmt.Sprint(oa["window_start"]))
		amount, _ := oa["amount"].(float64)
		if oa["debt"] != true || err != nil {
			t.Errorf("globalsync's books: %v, want usage counted past the limit of a rule that counts every hit (debt)", oa)
		}
		booked[start.UnixMilli()] += int64(amount)
	}
	for _, w := range windows {
		// Each region's part is rounded down (budget.Attribute).
		if w < end.UnixMilli() && (booked[w] > past[w] || booked[w] < past[w]-int64(len(regions)-1)) {
			t.Errorf("window %s: globalsync booked %d past the limit, the regions counted %d", time.UnixMilli(w).Format("15:04:05"), booked[w], past[w])
		}
	}
	t.Logf("globalsync's books: %d entries of usage counted past the limit, as debt", len(found))
}

// report posts the tokens of an answer to /v1/report and returns what it
// charged.
func report(addr string, tokens int64) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"descriptors":{"api_key":"k1"},"cost":%d}`, tokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/report", bytes.NewReader([]byte(body)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var b struct {
		Charged int64 `json:"charged"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%d %v", resp.StatusCode, err)
	}
	return b.Charged, nil
}

// booksClosedBy reports whether globalsync's budget documents say the
// books are closed of every window that ended by t.
func booksClosedBy(docs []map[string]any, t time.Time) bool {
	for _, doc := range docs {
		closed, _ := doc["books_closed"].(string)
		at, err := time.Parse(time.RFC3339Nano, closed)
		if err != nil || at.Before(t) {
			return false
		}
	}
	return len(docs) > 0
}
