package coord_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// TestScripts plays globalsync's stories in testdata/*.txt, in virtual
// time: replicas' heartbeats in, rebalances and books out, leaders
// changing. go test ./budget/coord -rewrite writes the expected outputs
// anew after a change made on purpose.
//
// Commands:
//
//	start regions=(a,b,…) [replicas=(a-1,a-2,…)] [limit=600] [window=10s] [lease-ttl=10s] [carry-debt] [id=gs1] [no-regions]
//	    a leading coordinator, and the rules it closes the books with: a
//	    strict global rule g; a replica per region, named after it, or
//	    those listed (a replica's region is its name up to a dash)
//	region name=a [replica=a] [demand=…] [used=…] [limit=…] [silent] [back]
//	    what a region's replica (its name by default) reports from now on:
//	    demand in limits per window, the most it used of the window in
//	    course (nothing of the windows after), the limit it enforces
//	run for=…                  every replica not silent sends its heartbeat every 500ms (acknowledging the
//	                           lease it held at its previous one); the leader rebalances every second and
//	                           the leases reach the replicas not silent; prints each rebalance that
//	                           changes what a region may admit
//	heartbeat name=a [replica=a] (one heartbeat now)
//	rebalance                  one rebalance now, printed in full
//	usage key=k window=0s a=… b=…   the regions' counts of a window, as gossip brings them
//	rules limit=…              the rules change (the books judge each window by the limits it ran under)
//	leader id=gs2              the leader goes; a new one, which heard the same gossip, takes over from
//	                           the published documents
//	status                     the regions as the leader sees them
//	follower id=gs2            a coordinator that follows: it hears the same heartbeats, and is given
//	                           every document the leader publishes (Observe)
//	enforced [of=gs2]          what each region's replicas report they enforce, beside what the leader
//	                           granted, as the leader (or the follower) sees it
//	marks                      the leader's high-water marks of the live windows
//	why                        why each region's last lease is what it is (budget.Reason)
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		h.now = h.start
		datadriven.RunTest(t, path, h.run)
	})
}

type harness struct {
	start, now time.Time
	c          *coord.Coordinator
	follower   *coord.Coordinator // if any: hears what the leader hears, observes its documents
	cfg        coord.Config
	window     time.Duration
	carryDebt  bool
	replicas   map[string]*scriptReplica // by replica
	history    map[string][]budget.Document
	nextHB     time.Time
	nextRB     time.Time
	out        *strings.Builder
	printed    map[string]string // by rule: the allowances last printed
	heard      []crdt.Delta      // the usage gossiped, for a new leader to hear as it followed
}

type scriptReplica struct {
	name, region string
	demand, used float64
	usedEpoch    int64 // the window used is of: in later ones, it used nothing yet
	limit        int64
	silent       bool
	total        float64   // demand so far, in limits
	last         time.Time // of the last heartbeat
	held, acked  uint64    // the Seq of the lease held, and of the one to acknowledge
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	var b strings.Builder
	h.out = &b
	switch d.Cmd {
	case "start":
		var regions []string
		d.ScanArgs(t, "regions", &regions)
		limit := int64(600)
		d.MaybeScanArgs(t, "limit", &limit)
		h.window = 10 * time.Second
		d.MaybeScanArgs(t, "window", &h.window)
		bc := budget.DefaultConfig()
		d.MaybeScanArgs(t, "lease-ttl", &bc.LeaseTTL)
		h.carryDebt = d.HasArg("carry-debt")
		h.cfg = coord.Config{ID: "gs1", Regions: regions, Budget: bc}
		if d.HasArg("no-regions") {
			h.cfg.Regions = nil
		}
		d.MaybeScanArgs(t, "id", &h.cfg.ID)
		h.replicas, h.history, h.printed = map[string]*scriptReplica{}, map[string][]budget.Document{}, map[string]string{}
		h.follower = nil
		h.c = h.newLeader(t, h.cfg)
		h.c.SetRules(h.now, h.rules(t, limit))
		replicas := regions
		d.MaybeScanArgs(t, "replicas", &replicas)
		for _, name := range replicas {
			region, _, _ := strings.Cut(name, "-")
			h.replicas[name] = &scriptReplica{name: name, region: region, limit: limit}
		}
		h.nextHB, h.nextRB = h.now, h.now.Add(time.Second)
		fmt.Fprintf(&b, "%s leads; regions %s; limit %d per %v\n", h.cfg.ID, strings.Join(regions, " "), limit, h.window)
	case "region":
		var name string
		d.ScanArgs(t, "name", &name)
		replica := name
		d.MaybeScanArgs(t, "replica", &replica)
		r := h.replicas[replica]
		if r == nil {
			t.Fatalf("no replica %q", replica)
		}
		d.MaybeScanArgs(t, "demand", &r.demand)
		if d.MaybeScanArgs(t, "used", &r.used) {
			r.usedEpoch = h.now.UnixMicro() / h.window.Microseconds()
		}
		d.MaybeScanArgs(t, "limit", &r.limit)
		if d.HasArg("silent") {
			r.silent = true
		}
		if d.HasArg("back") {
			r.silent = false
		}
	case "run":
		var dur time.Duration
		d.ScanArgs(t, "for", &dur)
		h.advance(t, h.now.Add(dur))
	case "heartbeat":
		var name string
		d.ScanArgs(t, "name", &name)
		replica := name
		d.MaybeScanArgs(t, "replica", &replica)
		h.heartbeat(h.replicas[replica])
	case "rebalance":
		h.rebalance(t, true)
	case "usage":
		var key string
		var at time.Duration
		d.ScanArgs(t, "key", &key)
		d.ScanArgs(t, "window", &at)
		id := crdt.ID{Key: regional.CounterKey("g", key), Epoch: h.start.Add(at).UnixMilli()}
		for _, a := range d.CmdArgs {
			if a.Key == "key" || a.Key == "window" {
				continue
			}
			var n uint64
			a.Scan(t, 0, &n)
			delta := crdt.Delta{Origin: a.Key, Entries: []crdt.Entry{{ID: id, Slots: []crdt.Slot{{Region: a.Key, P: n}}}}}
			if _, err := h.c.MergeRemote(context.Background(), delta); err != nil {
				t.Fatal(err)
			}
			h.heard = append(h.heard, delta)
		}
		fmt.Fprintf(&b, "%s window %s: %v\n", key, clock(at), h.c.GlobalUsage(id.Key, time.UnixMilli(id.Epoch)))
	case "rules":
		var limit int64
		d.ScanArgs(t, "limit", &limit)
		h.c.SetRules(h.now, h.rules(t, limit))
		fmt.Fprintf(&b, "%s limit %d from now\n", h.at(), limit)
	case "leader":
		var id string
		d.ScanArgs(t, "id", &id)
		cfg := h.cfg
		cfg.ID = id
		old := h.c
		h.c = h.newLeader(t, cfg)
		h.c.SetRules(h.now, old.Rules())
		// The new leader heard the same gossip while it followed.
		for _, delta := range h.heard {
			if _, err := h.c.MergeRemote(context.Background(), delta); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(&b, "%s %s leads, from %d published documents\n", h.at(), id, len(h.history["g"]))
	case "follower":
		cfg := h.cfg
		d.ScanArgs(t, "id", &cfg.ID)
		f, err := coord.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.follower = f
		fmt.Fprintf(&b, "%s follows\n", cfg.ID)
	case "enforced":
		c := h.c
		if d.HasArg("of") {
			c = h.follower
		}
		h.printEnforced(c)
	case "status":
		for _, st := range h.c.Status(h.now) {
			heard := int64(-1)
			if st.LastHeardMS != nil {
				heard = *st.LastHeardMS
			}
			fmt.Fprintf(&b, "%s: last heard %dms ago, %d replicas, suspect %v\n", st.Region, heard, st.Replicas, st.Suspect)
		}
	case "marks":
		doc := h.c.Budget("g")
		for _, e := range slices.Sorted(maps.Keys(doc.Marks)) {
			m := doc.Marks[e]
			var parts []string
			sum := 0.0
			for _, r := range slices.Sorted(maps.Keys(m)) {
				parts = append(parts, fmt.Sprintf("%s %.3f", r, m[r]))
				sum += m[r]
			}
			fmt.Fprintf(&b, "window %s: %s (sum %.3f)\n", e, strings.Join(parts, ", "), sum)
		}
	case "why":
		for _, l := range h.c.Budget("g").All() {
			r := l.Reason
			fmt.Fprintf(&b, "%s %.3f: %s (demand %.3f, target %.3f, want %.3f)\n", l.Region, l.Allowance(), r.Why, r.Demand, r.Target, r.Want)
		}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return b.String()
}

func (h *harness) rules(t *testing.T, limit int64) *regional.RuleSet {
	rs, err := regional.Parse("rules.yaml", fmt.Appendf(nil,
		"rules:\n  - { id: g, by: [api_key], scope: global, algorithm: fixed_window, limit: %d, window: %s, carry_debt: %v }\n",
		limit, h.window, h.carryDebt))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// newLeader starts a coordinator that takes the lead from the documents
// published so far.
func (h *harness) newLeader(t *testing.T, cfg coord.Config) *coord.Coordinator {
	c, err := coord.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var history [][]budget.Document
	for _, id := range slices.Sorted(maps.Keys(h.history)) {
		history = append(history, h.history[id])
	}
	if err := c.Restore(history); err != nil {
		t.Fatal(err)
	}
	return c
}

// advance moves time to end: heartbeats every 500ms, rebalances every
// second.
func (h *harness) advance(t *testing.T, end time.Time) {
	for {
		next := h.nextHB
		if h.nextRB.Before(next) {
			next = h.nextRB
		}
		if next.After(end) {
			break
		}
		h.now = next
		if !h.now.Before(h.nextHB) {
			for _, name := range slices.Sorted(maps.Keys(h.replicas)) {
				if r := h.replicas[name]; !r.silent {
					h.heartbeat(r)
				}
			}
			h.nextHB = h.nextHB.Add(500 * time.Millisecond)
		}
		if !h.now.Before(h.nextRB) {
			h.c.Tick(h.now)
			h.rebalance(t, false)
			h.nextRB = h.nextRB.Add(time.Second)
		}
	}
	h.now = end
}

// heartbeat sends one replica's heartbeat: its demand so far, the lease it
// held at its previous heartbeat, what it used.
func (h *harness) heartbeat(r *scriptReplica) {
	if !r.last.IsZero() {
		r.total += r.demand * h.now.Sub(r.last).Seconds() / h.window.Seconds()
	}
	r.last = h.now
	epoch := h.now.UnixMicro() / h.window.Microseconds()
	used := r.used
	if epoch != r.usedEpoch {
		used = 0
	}
	hb := gossip.Heartbeat{Region: r.region, Replica: r.name, Rules: map[string]gossip.RuleReport{
		"g": {Admitted: r.total, Acked: r.acked, Used: used, UsedEpoch: epoch, WindowMillis: h.window.Milliseconds(),
			Algorithm: "fixed_window", Limit: r.limit}}}
	h.c.Heartbeat(h.now, hb)
	if h.follower != nil {
		h.follower.Heartbeat(h.now, hb)
	}
	r.acked = r.held
}

// rebalance has the leader rebalance, and hands the leases to the
// replicas not silent.
func (h *harness) rebalance(t *testing.T, full bool) {
	docs, found, err := h.c.Rebalance(h.now)
	if err != nil {
		t.Fatal(err)
	}
	for _, oa := range found {
		fmt.Fprintf(h.out, "%s over-admission: %s window %s: %s admitted %d, %d over (carry_debt %v)\n", h.at(),
			strings.TrimSuffix(strings.TrimPrefix(oa.Key, "gq:{g:"), "}"), clock(oa.WindowStart.Sub(h.start)), oa.Region,
			oa.Admitted, oa.Amount, oa.CarryDebt)
	}
	for _, doc := range docs {
		if h.follower != nil {
			h.follower.Observe(doc)
		}
		h.history[doc.Rule] = append(h.history[doc.Rule], doc)
		if len(h.history[doc.Rule]) > coord.History {
			h.history[doc.Rule] = h.history[doc.Rule][1:]
		}
		for _, r := range h.replicas {
			if _, ok := doc.Leases[r.region]; ok && !r.silent {
				r.held = doc.Seq
			}
		}
		var parts []string
		for _, l := range doc.All() {
			if full {
				parts = append(parts, fmt.Sprintf("%s %.3f+%.3f-%.3f until %s", l.Region, l.Floor, l.Share, l.Debt, clock(l.Expires.Sub(h.start))))
			} else {
				parts = append(parts, fmt.Sprintf("%s %.3f", l.Region, l.Allowance()))
			}
		}
		line := strings.Join(parts, ", ")
		if full || line != h.printed[doc.Rule] {
			fmt.Fprintf(h.out, "%s %s #%d: %s\n", h.at(), doc.Rule, doc.Seq, line)
		}
		if !full {
			h.printed[doc.Rule] = line
		}
	}
}

// printEnforced prints what each region enforces of rule g as c sees it,
// and what c knows the leader granted it.
func (h *harness) printEnforced(c *coord.Coordinator) {
	enforced := c.Enforced(h.now)["g"]
	doc := c.Budget("g")
	for _, region := range c.Regions() {
		e, ok := enforced[region]
		var says string
		switch {
		case !ok:
			says = "no report"
		case e.State == coord.EnforcingLease && e.Allowance != nil:
			says = fmt.Sprintf("lease #%d %.3f until %s", e.Seq, *e.Allowance, clock(time.UnixMilli(e.ExpiresMS).Sub(h.start)))
		case e.State == coord.EnforcingLease:
			says = fmt.Sprintf("lease #%d", e.Seq)
		case e.State == coord.EnforcingLapsed && e.ExpiresMS > 0:
			says = fmt.Sprintf("lapsed #%d at %s, floor %.3f", e.Seq, clock(time.UnixMilli(e.ExpiresMS).Sub(h.start)), *e.Allowance)
		case e.State == coord.EnforcingLapsed:
			says = fmt.Sprintf("lapsed #%d, floor %.3f", e.Seq, *e.Allowance)
		case e.State == coord.EnforcingFloor:
			says = fmt.Sprintf("no lease, floor %.3f", *e.Allowance)
		default:
			says = fmt.Sprintf("lease #%d unknown", e.Seq)
		}
		if ok {
			says += fmt.Sprintf(" (%d replicas, %d on floor, heard %dms ago)", e.Replicas, e.OnFloor, e.HeardMS)
		}
		granted := "nothing"
		if l, ok := doc.Lease(region); ok {
			state := "holds"
			if !l.Holds(h.now) {
				state = "expired"
			}
			granted = fmt.Sprintf("#%d %.3f until %s, %s", l.Seq, l.Allowance(), clock(l.Expires.Sub(h.start)), state)
		}
		fmt.Fprintf(h.out, "%s: enforces %s; granted %s\n", region, says, granted)
	}
}

func (h *harness) at() string { return clock(h.now.Sub(h.start)) }

func clock(d time.Duration) string {
	return fmt.Sprintf("%d:%04.1f", int(d.Minutes()), (d % time.Minute).Seconds())
}
