//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/geoquota/geoquota/deploy/local/harness"
)

// deploy starts a deployment for a test, in the test's directory with
// the binaries TestMain built, and stops it when the test ends. If the
// test failed, the warnings and errors in every daemon's log go to the
// test's log first.
func deploy(t *testing.T, opts harness.DeploymentOptions) *harness.Deployment {
	t.Helper()
	opts.Dir, opts.Bin = t.TempDir(), binDir
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	d, err := harness.StartDeployment(ctx, opts)
	if err != nil {
		t.Fatalf("starting the deployment: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stopping the deployment: %v", err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			for _, dm := range d.Daemons() {
				t.Logf("%s log (warnings and errors, last 15):\n%s", dm.Name, logLines(dm.LogPath(), 15))
			}
		}
	})
	t.Logf("deployment of %d regions up in %v, in %s", len(d.Regions), time.Since(start).Round(time.Millisecond), d.Dir())
	return d
}

// logLines returns the last n lines of a daemon's log at level WARN or
// ERROR.
func logLines(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "panic") {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stores reads every region's Redis directly: what each holds of a
// global counter's windows, past ones included.
type stores struct {
	clients map[string]*redis.Client
}

func openStores(t *testing.T, d *harness.Deployment) *stores {
	s := &stores{clients: map[string]*redis.Client{}}
	for _, r := range d.Regions {
		s.clients[r.Name] = redis.NewClient(&redis.Options{Addr: r.Redis.Addr(), DialTimeout: time.Second,
			ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1})
	}
	t.Cleanup(func() {
		for _, c := range s.clients {
			c.Close()
		}
	})
	return s
}

// slots reads one window of counter gq:{g:key} from region's Redis: what
// each region counted in it (P less N, regional/global.go).
func (s *stores) slots(region, key string, window int64) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	raw, err := s.clients[region].HGetAll(ctx, "gq:{g:"+key+"}:"+strconv.FormatInt(window, 10)).Result()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for f, v := range raw {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("field %s=%q: %w", f, v, err)
		}
		if name, ok := strings.CutPrefix(f, "-"); ok {
			out[name] -= n
		} else {
			out[f] += n
		}
	}
	return out, nil
}

// books is what one region's Redis holds of each window.
type books map[int64]map[string]int64

func (s *stores) books(region, key string, windows []int64) (books, error) {
	b := books{}
	for _, w := range windows {
		sl, err := s.slots(region, key, w)
		if err != nil {
			return nil, fmt.Errorf("%s's Redis: %w", region, err)
		}
		b[w] = sl
	}
	return b, nil
}

// agree waits until every region's Redis holds the same count of every
// window, and returns them. Gossip after a fault brings the regions
// together within seconds (two gossip intervals, docs/design.md, once a region
// hears the others again); within is a generous bound for a busy machine.
func agree(t *testing.T, d *harness.Deployment, st *stores, key string, windows []int64, within time.Duration) books {
	t.Helper()
	var last string
	var got books
	defer func() {
		if t.Failed() && last != "" {
			t.Logf("the regions' Redis last held:\n%s", last)
		}
	}()
	start := time.Now()
	harness.WaitFor(t, within, "every region's Redis holding the same count of every window", func() bool {
		var all []books
		var b strings.Builder
		for _, r := range d.Regions {
			bk, err := st.books(r.Name, key, windows)
			if err != nil {
				last = err.Error()
				return false
			}
			all = append(all, bk)
			fmt.Fprintf(&b, "  %s: %s\n", r.Name, bk)
		}
		last = b.String()
		for _, bk := range all[1:] {
			for _, w := range windows {
				if !maps.Equal(bk[w], all[0][w]) {
					return false
				}
			}
		}
		got = all[0]
		return true
	})
	t.Logf("the regions agree on %d windows after %v", len(windows), time.Since(start).Round(time.Millisecond))
	return got
}

func (b books) String() string {
	var parts []string
	for _, w := range slices.Sorted(maps.Keys(b)) {
		parts = append(parts, fmt.Sprintf("%s %v", time.UnixMilli(w).Format("15:04:05"), b[w]))
	}
	return strings.Join(parts, "; ")
}

// judge checks the books the regions agree on against what the clients
// saw: in every window, each region counted what its clients saw it admit
// — no less, and no more than that plus the calls whose outcome they
// could not see — and all regions together no more than limit(window).
func judge(t *testing.T, ld *ledger, b books, windows []int64, limit func(int64) int64) {
	t.Helper()
	for _, p := range ld.contractBreaks() {
		t.Errorf("answer against the HTTP contract: %s", p)
	}
	t.Logf("clients: %s", ld.summary())
	if _, _, degraded := ld.outcomes(); len(degraded) > 0 && !ld.degradedOK {
		t.Errorf("degraded admissions of a rule that fails closed: %v", degraded)
	}
	for _, w := range windows {
		seen, unknown, counted := ld.admitted(w), ld.unknown(w), b[w]
		var total int64
		for _, n := range counted {
			total += n
		}
		t.Logf("window %s: counted %v (total %d of %d), clients saw admitted %v, unseen outcomes %v",
			time.UnixMilli(w).Format("15:04:05"), counted, total, limit(w), seen, unknown)
		if total > limit(w) {
			t.Errorf("window %s: the regions admitted %d, over the strict limit of %d", time.UnixMilli(w).Format("15:04:05"), total, limit(w))
		}
		regions := map[string]bool{}
		for r := range seen {
			regions[r] = true
		}
		for r := range counted {
			regions[r] = true
		}
		for r := range regions {
			if counted[r] < seen[r] {
				t.Errorf("window %s: region %s counted %d, but its clients saw %d admitted: counted usage lost",
					time.UnixMilli(w).Format("15:04:05"), r, counted[r], seen[r])
			}
			if counted[r] > seen[r]+unknown[r] {
				t.Errorf("window %s: region %s counted %d, but its clients saw %d admitted and %d calls unanswered",
					time.UnixMilli(w).Format("15:04:05"), r, counted[r], seen[r], unknown[r])
			}
		}
	}
}

// fixedLimit is a limit that is the same in every window.
func fixedLimit(n int64) func(int64) int64 { return func(int64) int64 { return n } }

// sleepUntil holds the test's timeline: a fault starts or ends at a given
// point of a window.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// nextWindow returns the start of the first window that starts at least
// lead from now.
func nextWindow(window, lead time.Duration) time.Time {
	w := window.Milliseconds()
	at := time.Now().Add(lead).UnixMilli()
	return time.UnixMilli((at + w - 1) / w * w)
}

// waitLeases waits until every region's replicas enforce more than their
// floor: each holds a lease that follows the demand.
func waitLeases(t *testing.T, d *harness.Deployment, key string, floor float64, within time.Duration) {
	t.Helper()
	harness.WaitFor(t, within, "every region holding a lease above its floor", func() bool {
		for _, r := range d.Regions {
			for _, rep := range r.Replicas {
				if rep.Running() && ownShare(r, rep, key) <= floor+0.01 {
					return false
				}
			}
		}
		return true
	})
}
