package gossip_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// TestScripts plays the protocol stories in testdata/*.txt, in virtual
// time, on real engines (in-memory stores) joined by a network the script
// controls: messages wait in flight until delivered, and links can be cut
// one way or both. go test ./transport/gossip -rewrite writes the expected
// outputs anew after a change made on purpose.
//
// Commands:
//
//	start regions=(a,b,…) [replicas=(b2,…)] [observer] [interval=] [anti-entropy=] [heartbeat=]
//	    a node per region (and per extra replica: "b2" is a second replica
//	    of b, on b's store), and with observer, globalsync's node
//	restart node=a                    the node's replica starts again, on an empty store
//	check node=a key=k [n=1]          requests in a node's region
//	tick [for=0s] [heartbeats]        advance time, each node ticking when due; print what is sent (but heartbeats)
//	deliver [only=(a,…)]              hand every message in flight to its receivers; their answers go in flight
//	run for=… [heartbeats]            tick and deliver as time passes (no time on the wire)
//	drop                              lose every message in flight
//	cut from=a to=b | cut a b …       cut links (one way, or between all named)
//	heal [from=a to=b]                heal links (all, or one way)
//	send to=a subject=… replica=… seq=… (delta=(origin,region=p,…) [key=] [versions=(from,to)] | ask=(replica:since,…) | data=…)
//	counters node=a key=k             the node's copy of a counter
//	stats node=a                      the node's counters of what it did and refused
//	heard node=a                      how long ago the node last heard each region
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{t: t, start: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), cut: map[[2]string]bool{}}
		h.now = h.start
		datadriven.RunTest(t, path, h.run)
	})
}

// scriptRules is the rule every node's engine enforces: a global limit in
// strict mode: without leases, each region admits up to its floor (a tenth of the limit, split).
const scriptRules = `
rules:
  - { id: g, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: 1000, window: 1h }
`

type harness struct {
	t      *testing.T
	start  time.Time
	now    time.Time
	order  []string // nodes, in the order started
	nodes  map[string]*scriptNode
	flight []flight
	cut    map[[2]string]bool // from, to
	out    *strings.Builder
	// heartbeats: print them too (the heartbeats argument of tick and run).
	heartbeats bool

	cfg    gossip.Config
	rules  *regional.RuleSet
	all    []string // the regions
	stores map[string]*regional.MemoryStore
}

type scriptNode struct {
	name, region string
	node         *gossip.Node
	engine       *regional.Engine // nil for the observer
	observer     *observerCounters
	instance     int
}

type flight struct {
	from, to string
	m        gossip.Message
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	var b strings.Builder
	h.out = &b
	switch d.Cmd {
	case "start":
		h.startNodes(t, d)
	case "restart":
		var name string
		d.ScanArgs(t, "node", &name)
		h.restart(t, name)
	case "check":
		var name, key string
		n := 1
		d.ScanArgs(t, "node", &name)
		d.ScanArgs(t, "key", &key)
		d.MaybeScanArgs(t, "n", &n)
		sn := h.node(t, name)
		allowed := 0
		for range n {
			var dec regional.Decision
			if err := sn.engine.Check(context.Background(), &regional.Request{APIKey: key, Endpoint: "/"}, &dec); err != nil {
				t.Fatal(err)
			}
			if dec.Allowed {
				allowed++
			}
		}
		fmt.Fprintf(&b, "%s admitted %d of %d\n", name, allowed, n)
	case "tick":
		h.heartbeats = d.HasArg("heartbeats")
		var dur time.Duration
		d.MaybeScanArgs(t, "for", &dur)
		h.advance(h.now.Add(dur), false)
	case "run":
		h.heartbeats = d.HasArg("heartbeats")
		var dur time.Duration
		d.ScanArgs(t, "for", &dur)
		h.advance(h.now.Add(dur), true)
	case "deliver":
		var only []string
		d.MaybeScanArgs(t, "only", &only)
		h.deliver(only, false)
	case "drop":
		fmt.Fprintf(&b, "dropped %d\n", len(h.flight))
		h.flight = nil
	case "cut", "heal":
		h.links(t, d, d.Cmd == "cut")
	case "send":
		h.send(t, d)
	case "counters":
		var name, key string
		d.ScanArgs(t, "node", &name)
		d.ScanArgs(t, "key", &key)
		sn := h.node(t, name)
		var pn crdt.PNCounter
		id := crdt.ID{Key: "gq:{g:" + key + "}", Epoch: h.start.UnixMilli()}
		if sn.engine != nil {
			pn = sn.engine.GlobalCounter(id)
		} else {
			pn = sn.observer.get(id)
		}
		fmt.Fprintf(&b, "%s %s: %s\n", name, key, slotsString(pn))
	case "stats":
		var name string
		d.ScanArgs(t, "node", &name)
		s := h.node(t, name).node.Stats()
		fmt.Fprintf(&b, "received %d applied %d repaired %d asks %d answered %d paced %d marks %d\n", s.Received.Load(),
			s.Applied.Load(), s.Repaired.Load(), s.Asks.Load(), s.AsksAnswered.Load(), s.Paced.Load(), s.Marks.Load())
		fmt.Fprintf(&b, "refused: malformed %d unknown-region %d spoofed %d replayed %d regressed %d\n", s.Malformed.Load(),
			s.UnknownRegion.Load(), s.Spoofed.Load(), s.Replayed.Load(), s.Regressed.Load())
	case "heard":
		var name string
		d.ScanArgs(t, "node", &name)
		sn := h.node(t, name)
		for _, o := range h.regions() {
			if at, ok := sn.node.LastHeard(o); ok && o != sn.region {
				fmt.Fprintf(&b, "%s %v ago\n", o, h.now.Sub(at))
			}
		}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return b.String()
}

func (h *harness) node(t *testing.T, name string) *scriptNode {
	sn := h.nodes[name]
	if sn == nil {
		t.Fatalf("no node %q", name)
	}
	return sn
}

// regions lists the regions of the nodes, in order.
func (h *harness) regions() []string {
	var out []string
	for _, name := range h.order {
		if r := h.nodes[name].region; !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

func (h *harness) clock() time.Time { return h.now }

func (h *harness) startNodes(t *testing.T, d *datadriven.TestData) {
	var regions, replicas []string
	d.ScanArgs(t, "regions", &regions)
	d.MaybeScanArgs(t, "replicas", &replicas)
	cfg := gossip.Config{Interval: 250 * time.Millisecond, AntiEntropy: 10 * time.Second, Heartbeat: 500 * time.Millisecond}
	d.MaybeScanArgs(t, "interval", &cfg.Interval)
	d.MaybeScanArgs(t, "anti-entropy", &cfg.AntiEntropy)
	d.MaybeScanArgs(t, "heartbeat", &cfg.Heartbeat)
	rules, err := regional.Parse("rules.yaml", []byte(scriptRules))
	if err != nil {
		t.Fatal(err)
	}
	h.nodes, h.stores, h.cfg, h.rules, h.all = map[string]*scriptNode{}, map[string]*regional.MemoryStore{}, cfg, rules, regions
	for _, r := range regions {
		h.add(t, r, r, 1)
		h.order = append(h.order, r)
	}
	for _, name := range replicas {
		h.add(t, name, strings.TrimRight(name, "0123456789"), 1)
		h.order = append(h.order, name)
	}
	if d.HasArg("observer") {
		oc := newObserverCounters(regions)
		c := cfg
		c.Region, c.Replica, c.Instance, c.Counters, c.Observer = "globalsync", "globalsync-1", "1", oc, true
		n, err := gossip.New(c, h.now)
		if err != nil {
			t.Fatal(err)
		}
		h.nodes["globalsync"] = &scriptNode{name: "globalsync", region: "globalsync", node: n, observer: oc}
		h.order = append(h.order, "globalsync")
	}
	fmt.Fprintf(h.out, "started %s\n", strings.Join(h.order, " "))
}

// add starts a replica of a region, on the region's store.
func (h *harness) add(t *testing.T, name, region string, instance int) {
	st := h.stores[region]
	if st == nil {
		st = regional.NewMemoryStore(h.clock)
		st.SetRegion(region)
		h.stores[region] = st
	}
	e := regional.New(regional.Config{Region: region, Store: st, Clock: h.clock, Timeout: time.Hour,
		Global: regional.GlobalConfig{Regions: h.all}}, h.rules)
	c := h.cfg
	c.Region, c.Replica, c.Instance, c.Counters, c.Engine = region, name, fmt.Sprint(instance), e, e
	elected := name == region // a region's first replica answers for it
	c.Elected = func() bool { return elected }
	c.OnRejoin = func(from string) { fmt.Fprintf(h.out, "%s %s: %s back\n", h.at(), name, from) }
	n, err := gossip.New(c, h.now)
	if err != nil {
		t.Fatal(err)
	}
	h.nodes[name] = &scriptNode{name: name, region: region, node: n, engine: e, instance: instance}
}

// restart starts a replica again as a new process on an empty store: its
// region's store lost everything (a Redis without persistence).
func (h *harness) restart(t *testing.T, name string) {
	sn := h.node(t, name)
	delete(h.stores, sn.region)
	h.add(t, name, sn.region, sn.instance+1)
	fmt.Fprintf(h.out, "%s started again, on an empty store\n", name)
}

// advance moves time to end, ticking every node when it is due (in the
// order started) and, with deliver, handing what is sent to its receivers
// at once.
func (h *harness) advance(end time.Time, deliver bool) {
	for {
		next := end.Add(time.Nanosecond)
		for _, name := range h.order {
			if n := h.nodes[name].node.Next(); n.Before(next) {
				next = n
			}
		}
		if next.After(end) {
			break
		}
		h.now = next
		for _, name := range h.order {
			sn := h.nodes[name]
			if sn.node.Next().After(h.now) {
				continue
			}
			for _, m := range sn.node.Tick(h.now) {
				h.post(sn, m)
			}
		}
		if deliver {
			h.deliver(nil, true)
		}
	}
	h.now = end
}

// post puts a message in flight to every node that listens to its subject.
func (h *harness) post(from *scriptNode, m gossip.Message) {
	if _, hb := m.Body.(gossip.Heartbeat); !hb || h.heartbeats {
		fmt.Fprintf(h.out, "%s %s: %s > %s\n", h.at(), from.name, subjectOf(m.Subject), describe(m))
	}
	for _, name := range h.order {
		to := h.nodes[name]
		if to == from || !listens(to.node, m.Subject) {
			continue
		}
		h.flight = append(h.flight, flight{from: from.name, to: name, m: m})
	}
}

// deliver hands the messages in flight (to the nodes named, or all) to
// their receivers, and then their answers, until none is left for them.
func (h *harness) deliver(only []string, quiet bool) {
	for {
		var now, later []flight
		for _, f := range h.flight {
			if len(only) == 0 || slices.Contains(only, f.to) {
				now = append(now, f)
			} else {
				later = append(later, f)
			}
		}
		if len(now) == 0 {
			return
		}
		h.flight = later
		for _, f := range now {
			to := h.nodes[f.to]
			if h.cut[[2]string{h.nodes[f.from].region, to.region}] {
				if _, hb := f.m.Body.(gossip.Heartbeat); !hb || h.heartbeats {
					fmt.Fprintf(h.out, "%s %s x %s %s: cut\n", h.at(), f.to, f.from, subjectOf(f.m.Subject))
				}
				continue
			}
			before := *statsOf(to.node)
			answers := to.node.Step(context.Background(), h.now, f.m)
			if got := diffStats(before, *statsOf(to.node)); got != "" || !quiet {
				fmt.Fprintf(h.out, "%s %s < %s %s%s\n", h.at(), f.to, f.from, subjectOf(f.m.Subject), got)
			}
			for _, m := range answers {
				h.post(to, m)
			}
		}
	}
}

func (h *harness) links(t *testing.T, d *datadriven.TestData, cut bool) {
	var from, to string
	if d.MaybeScanArgs(t, "from", &from) {
		d.ScanArgs(t, "to", &to)
		h.cut[[2]string{from, to}] = cut
		return
	}
	if !cut && len(d.CmdArgs) == 0 {
		clear(h.cut)
		return
	}
	var names []string
	for _, a := range d.CmdArgs {
		names = append(names, a.Key)
	}
	for _, a := range names {
		for _, b := range names {
			if a != b {
				h.cut[[2]string{a, b}] = cut
			}
		}
	}
}

// send puts a message of the script's making in flight.
func (h *harness) send(t *testing.T, d *datadriven.TestData) {
	var to, subject, replica string
	var seq uint64
	d.ScanArgs(t, "to", &to)
	d.ScanArgs(t, "subject", &subject)
	d.MaybeScanArgs(t, "replica", &replica)
	d.MaybeScanArgs(t, "seq", &seq)
	m := gossip.Message{Subject: "geoquota." + subject, Header: gossip.Header{Replica: replica, Instance: "x", Seq: seq}}
	switch {
	case d.HasArg("delta"):
		var spec []string
		d.ScanArgs(t, "delta", &spec)
		key := "k"
		d.MaybeScanArgs(t, "key", &key)
		delta := crdt.Delta{Origin: spec[0], To: 1}
		if d.HasArg("versions") {
			var v []uint64
			d.ScanArgs(t, "versions", &v)
			delta.From, delta.To = v[0], v[1]
		}
		e := crdt.Entry{ID: crdt.ID{Key: "gq:{g:" + key + "}", Epoch: h.start.UnixMilli()}}
		for _, s := range spec[1:] {
			var sl crdt.Slot
			region, p, _ := strings.Cut(s, "=")
			fmt.Sscan(p, &sl.P)
			sl.Region = region
			e.Slots = append(e.Slots, sl)
		}
		delta.Entries = []crdt.Entry{e}
		b, err := crdt.AppendDelta(nil, delta)
		if err != nil {
			t.Fatal(err)
		}
		m.Data = b
	case d.HasArg("ask"):
		var spec []string
		d.ScanArgs(t, "ask", &spec)
		var a gossip.Ask
		for _, s := range spec {
			var sa gossip.StreamAsk
			replica, since, _ := strings.Cut(s, ":")
			fmt.Sscan(since, &sa.Since)
			sa.Replica, sa.Instance = replica, "1"
			a.Streams = append(a.Streams, sa)
		}
		m.Body = a
	default:
		var data string
		d.ScanArgs(t, "data", &data)
		m.Data = []byte(data)
	}
	// A message of the script's making comes from no node: it is handed
	// to its receiver at once.
	sn := h.node(t, to)
	before := *statsOf(sn.node)
	answers := sn.node.Step(context.Background(), h.now, m)
	fmt.Fprintf(h.out, "%s < %s%s\n", to, subject, diffStats(before, *statsOf(sn.node)))
	for _, a := range answers {
		h.post(sn, a)
	}
}

func (h *harness) at() string {
	d := h.now.Sub(h.start)
	return fmt.Sprintf("%d:%06.3f", int(d.Minutes()), (d % time.Minute).Seconds())
}

// listens reports whether a node subscribes to a subject (NATS's * stands
// for one token).
func listens(n *gossip.Node, subject string) bool {
	for _, sub := range n.Subscriptions() {
		if matches(sub, subject) {
			return true
		}
	}
	return false
}

func matches(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	if len(p) != len(s) {
		return false
	}
	for i := range p {
		if p[i] != "*" && p[i] != s[i] {
			return false
		}
	}
	return true
}

func subjectOf(s string) string { return strings.TrimPrefix(s, "geoquota.") }

// describe prints a message's body in short.
func describe(m gossip.Message) string {
	switch b := m.Body.(type) {
	case crdt.Delta:
		var parts []string
		for _, e := range b.Entries {
			parts = append(parts, keyOf(e.ID)+" "+slotList(e.Slots))
		}
		return fmt.Sprintf("#%d (%d,%d] {%s}", m.Header.Seq, b.From, b.To, strings.Join(parts, "; "))
	case gossip.Ask:
		var parts []string
		if b.Others {
			parts = append(parts, "others")
		}
		if b.Own {
			parts = append(parts, "own")
		}
		for _, s := range b.Streams {
			parts = append(parts, fmt.Sprintf("%s since %d", s.Replica, s.Since))
		}
		return fmt.Sprintf("#%d ask %s", m.Header.Seq, strings.Join(parts, ", "))
	case gossip.Heartbeat:
		return fmt.Sprintf("#%d heartbeat", m.Header.Seq)
	}
	return fmt.Sprintf("#%d ?", m.Header.Seq)
}

func keyOf(id crdt.ID) string {
	return strings.TrimSuffix(strings.TrimPrefix(id.Key, "gq:{g:"), "}")
}

func slotList(slots []crdt.Slot) string {
	var parts []string
	for _, s := range slots {
		parts = append(parts, fmt.Sprintf("%s=%d", s.Region, s.P))
	}
	return strings.Join(parts, " ")
}

func slotsString(pn crdt.PNCounter) string {
	var parts []string
	for r, p := range pn.P.All() {
		parts = append(parts, fmt.Sprintf("%s=%d", r, p))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// counts is a copy of a node's Stats, for telling what a step changed.
type counts struct {
	malformed, unknown, spoofed, replayed, regressed, applied, repaired int64
}

func statsOf(n *gossip.Node) *counts {
	s := n.Stats()
	return &counts{s.Malformed.Load(), s.UnknownRegion.Load(), s.Spoofed.Load(), s.Replayed.Load(), s.Regressed.Load(),
		s.Applied.Load(), s.Repaired.Load()}
}

func diffStats(a, b counts) string {
	var parts []string
	for _, f := range []struct {
		name string
		a, b int64
	}{{"malformed", a.malformed, b.malformed}, {"unknown-region", a.unknown, b.unknown}, {"spoofed", a.spoofed, b.spoofed},
		{"replayed", a.replayed, b.replayed}, {"regressed", a.regressed, b.regressed}, {"applied", a.applied, b.applied},
		{"repaired", a.repaired, b.repaired}} {
		if f.b != f.a {
			parts = append(parts, fmt.Sprintf("%s %d", f.name, f.b-f.a))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

// observerCounters is globalsync's copy of every region's usage, as an
// observer node keeps it: the crdt collection itself.
type observerCounters struct {
	mu sync.Mutex
	c  *crdt.Counters
}

func newObserverCounters(regions []string) *observerCounters {
	c, err := crdt.NewCounters("globalsync", append(slices.Clone(regions), "globalsync"))
	if err != nil {
		panic(err)
	}
	return &observerCounters{c: c}
}

func (o *observerCounters) get(id crdt.ID) crdt.PNCounter {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.c.Get(id)
}

func (o *observerCounters) OwnDeltas(uint64, int) []crdt.Delta { return nil }

func (o *observerCounters) RegionState(string) crdt.Delta { return crdt.Delta{} }

func (o *observerCounters) MergeRemote(_ context.Context, d crdt.Delta) (crdt.MergeReport, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.c.Merge(d), nil
}

func (o *observerCounters) ObserveOwn(crdt.Delta) {}
