package gossip_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
	"github.com/geoquota/geoquota/transport/gossip"
)

// mesh is regions joined by a loss-free network that delivers at once, in
// virtual time, and counts what goes on the wire by kind.
type mesh struct {
	start   time.Time
	now     time.Time
	regions []string
	nodes   []*gossip.Node
	engines []*regional.Engine
	sent    map[string]wire // by kind: delta, ask, repair, heartbeat
	// loss is the chance that a delta is lost on its way to a region.
	loss float64
	rng  *rand.Rand
}

type wire struct{ messages, bytes, entries int }

func newMesh(tb testing.TB, regions []string) *mesh {
	tb.Helper()
	rules, err := regional.Parse("rules.yaml", []byte(
		"rules:\n  - { id: g, by: [api_key], scope: global, mode: strict, algorithm: fixed_window, limit: 1000000000, window: 1h }\n"))
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &mesh{start: start, now: start, regions: regions, sent: map[string]wire{}, rng: rand.New(rand.NewPCG(3, 4))}
	clock := func() time.Time { return m.now }
	for _, r := range regions {
		st := regional.NewMemoryStore(clock)
		st.SetRegion(r)
		e := regional.New(regional.Config{Region: r, Store: st, Clock: clock, Timeout: time.Hour,
			Global: regional.GlobalConfig{Regions: regions}}, rules)
		n, err := gossip.New(gossip.Config{Region: r, Replica: r + "-1", Instance: "1", Counters: e, Engine: e}, m.now)
		if err != nil {
			tb.Fatal(err)
		}
		m.nodes, m.engines = append(m.nodes, n), append(m.engines, e)
	}
	return m
}

// count admits one request for each key in region i.
func (m *mesh) count(tb testing.TB, i int, keys []string) {
	var d regional.Decision
	for _, k := range keys {
		if err := m.engines[i].Check(context.Background(), &regional.Request{APIKey: k, Endpoint: "/"}, &d); err != nil {
			tb.Fatal(err)
		}
	}
}

// run ticks every node when due until end, delivering what is sent.
func (m *mesh) run(tb testing.TB, end time.Time) {
	for {
		next := end.Add(time.Nanosecond)
		for _, n := range m.nodes {
			if t := n.Next(); t.Before(next) {
				next = t
			}
		}
		if next.After(end) {
			break
		}
		m.now = next
		var out []sent
		for i, n := range m.nodes {
			if !n.Next().After(m.now) {
				for _, msg := range n.Tick(m.now) {
					out = append(out, sent{i, msg})
				}
			}
		}
		for len(out) > 0 {
			s := out[0]
			out = out[1:]
			m.account(tb, s.msg)
			_, delta := s.msg.Body.(crdt.Delta)
			delta = delta && strings.Contains(s.msg.Subject, ".delta.")
			for j, n := range m.nodes {
				if j != s.from && listens(n, s.msg.Subject) && !(delta && m.loss > 0 && m.rng.Float64() < m.loss) {
					for _, a := range n.Step(context.Background(), m.now, s.msg) {
						out = append(out, sent{j, a})
					}
				}
			}
		}
	}
	m.now = end
}

type sent struct {
	from int
	msg  gossip.Message
}

// account counts a message's bytes as NATS carries them: subject, the
// three headers, and the body.
func (m *mesh) account(tb testing.TB, msg gossip.Message) {
	body, err := msg.Encode()
	if err != nil {
		tb.Fatal(err)
	}
	headers := fmt.Sprintf("NATS/1.0\r\n%s: %s\r\n%s: %s\r\n%s: %d\r\n\r\n", gossip.HeaderReplica, msg.Header.Replica,
		gossip.HeaderInstance, msg.Header.Instance, gossip.HeaderSeq, msg.Header.Seq)
	kind := strings.Split(msg.Subject, ".")[1]
	w := m.sent[kind]
	w.messages++
	w.bytes += len(msg.Subject) + len(headers) + len(body)
	if d, ok := msg.Body.(crdt.Delta); ok {
		w.entries += d.Slots()
	}
	m.sent[kind] = w
}

// antiEntropy is what goes but deltas and heartbeats: what it costs to
// find and repair what was lost (marks travel as deltas of no entries).
func (m *mesh) antiEntropy() (messages, bytes int) {
	for kind, w := range m.sent {
		if kind != "delta" && kind != "heartbeat" {
			messages, bytes = messages+w.messages, bytes+w.bytes
		}
	}
	return messages, bytes
}

func tenantKeys(n int, random bool) []string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, n)
	for i := range keys {
		if !random {
			keys[i] = fmt.Sprintf("sk_prod_%06d", i)
			continue
		}
		b := []byte("sk_live_")
		for range 24 {
			b = append(b, alphabet[rng.IntN(len(alphabet))])
		}
		keys[i] = string(b)
	}
	return keys
}

// TestIdleAntiEntropyCostsTheSameForAnyNumberOfCounters: regions holding
// 10 or 20,000 counters in sync, idle for a minute, send the same few
// bytes to find that nothing is missing — a mark every anti-entropy round
// — and ask for nothing.
func TestIdleAntiEntropyCostsTheSameForAnyNumberOfCounters(t *testing.T) {
	regions := []string{"af", "ap", "eu", "sa", "us"}
	perRegion := map[int]float64{}
	for _, counters := range []int{10, 20_000} {
		m := newMesh(t, regions)
		keys := tenantKeys(counters, false)
		for i := range regions {
			m.count(t, i, keys)
		}
		m.run(t, m.now.Add(30*time.Second)) // in sync
		for i, e := range m.engines {
			if got := e.GlobalCounter(m.globalID(keys[counters-1])).Value(); got != int64(len(regions)) {
				t.Fatalf("%d counters: %s holds %d of the last counter, want %d", counters, regions[i], got, len(regions))
			}
		}
		clear(m.sent)
		m.run(t, m.now.Add(time.Minute))
		w := m.sent["delta"]
		if w.entries != 0 || m.sent["repair"].messages != 0 || m.sent["ask"].messages != 0 {
			t.Fatalf("%d idle counters in sync: sent %+v", counters, m.sent)
		}
		perRegion[counters] = float64(w.bytes) / 60 / float64(len(regions))
		t.Logf("%d counters in sync, idle: %.0f bytes/s per region (%d marks a minute in all)", counters, perRegion[counters], w.messages)
	}
	// The same but for the digits of the versions and sequence numbers.
	if few, many := perRegion[10], perRegion[20_000]; few == 0 || many > 1.1*few || many > 100 {
		t.Fatalf("idle anti-entropy costs %v bytes/s per region, by counters held: want about the same, under 100", perRegion)
	}
}

// globalID is the counter of key's window in the mesh's first hour.
func (m *mesh) globalID(key string) crdt.ID {
	return crdt.ID{Key: "gq:{g:" + key + "}", Epoch: m.start.UnixMilli()}
}

// BenchmarkGossipTraffic measures what the gossip sends among five
// regions holding 100,000 counters: per changed counter while each region
// counts 1,000 of them every gossip interval; for anti-entropy when 1% of
// deltas are lost; and for anti-entropy with every counter in sync and
// idle. go test ./transport/gossip -run '^$' -bench GossipTraffic -benchtime 1x
func BenchmarkGossipTraffic(b *testing.B) {
	regions := []string{"af", "ap", "eu", "sa", "us"}
	for _, random := range []bool{false, true} {
		b.Run(map[bool]string{false: "sequential-keys", true: "random-keys"}[random], func(b *testing.B) {
			for b.Loop() {
				m := newMesh(b, regions)
				keys := tenantKeys(100_000, random)
				for i := range regions {
					m.count(b, i, keys)
				}
				m.run(b, m.now.Add(30*time.Second))
				// Busy: each region counts 1,000 counters an interval, a
				// tenth of a minute; 1% of deltas lost.
				clear(m.sent)
				m.loss = 0.01
				rng := rand.New(rand.NewPCG(5, 6))
				busy := 6 * time.Second
				for end := m.now.Add(busy); m.now.Before(end); {
					for i := range regions {
						start := rng.IntN(len(keys) - 1000)
						m.count(b, i, keys[start:start+1000])
					}
					m.run(b, m.now.Add(250*time.Millisecond))
				}
				m.loss = 0
				m.run(b, m.now.Add(10*time.Second)) // the last losses found at the next round
				d := m.sent["delta"]
				_, aeBytes := m.antiEntropy()
				b.ReportMetric(float64(d.bytes)/float64(d.entries), "B/changed")
				b.ReportMetric(float64(aeBytes)/float64(m.sent["repair"].entries), "repair-B/changed")
				b.ReportMetric(float64(aeBytes)/(busy+10*time.Second).Seconds()/float64(len(regions)), "busy-AE-B/s/region")
				// Idle, in sync.
				clear(m.sent)
				m.run(b, m.now.Add(time.Minute))
				_, aeBytes = m.antiEntropy()
				marks := m.sent["delta"].bytes // deltas of no entries: nothing changed
				b.ReportMetric(float64(aeBytes+marks)/60/float64(len(regions)), "idle-AE-B/s/region")
			}
		})
	}
}
