package sim

import (
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/geoquota/geoquota/budget/coord"
	"github.com/geoquota/geoquota/transport/gossip"
)

// network carries messages between the regions and globalsync, with a
// latency per pair of regions, jitter, loss, and partitions.
type network struct {
	s       *sim
	rng     *rand.Rand
	latency map[[2]string]time.Duration
	group   map[string]int // endpoints in the same group reach each other
	lost    atomic.Int64
	cut     atomic.Int64
}

func newNetwork(s *sim, rng *rand.Rand) *network {
	n := &network{s: s, rng: rng, latency: map[[2]string]time.Duration{}, group: map[string]int{}}
	lat := s.sc.Network.Latency
	regions := s.sc.Regions
	for i, a := range regions {
		n.latency[[2]string{a, a}] = s.sc.Network.Local
		for _, b := range regions[i+1:] {
			d := lat.Min
			if lat.Max > lat.Min {
				d += time.Duration(rng.Int64N(int64(lat.Max - lat.Min + 1)))
			}
			n.latency[[2]string{a, b}], n.latency[[2]string{b, a}] = d, d
		}
	}
	return n
}

// where is the region an endpoint runs in.
func (n *network) where(name string) string {
	if name == coord.Name {
		return n.s.sc.GlobalSync.Region
	}
	return name
}

func (n *network) reach(a, b string) bool { return n.group[n.where(a)] == n.group[n.where(b)] }

// Latency is the one-way latency between two endpoints, without jitter.
func (n *network) Latency(a, b string) time.Duration {
	return n.latency[[2]string{n.where(a), n.where(b)}]
}

// send delivers a message from one endpoint to another after the link's
// latency, unless the link is cut when it is sent or when it arrives, or
// (lossy messages) it is lost. It is sent at the start of the sender's
// step, with its place's dice.
func (n *network) send(from, to string, lossy bool, deliver func(endpoint)) {
	src := n.s.places[n.s.placeOf[n.s.index(from)]]
	if !n.reach(from, to) {
		n.cut.Add(1)
		return
	}
	if lossy && n.s.sc.Network.Loss > 0 && src.rng.Float64() < n.s.sc.Network.Loss {
		n.lost.Add(1)
		return
	}
	d := n.Latency(from, to)
	if j := n.s.sc.Network.Jitter; j > 0 {
		d += time.Duration(src.rng.Int64N(int64(j) + 1))
	}
	target := n.s.index(to)
	dst := n.s.places[n.s.placeOf[target]]
	dst.push(src, &event{at: src.now + d, target: target, fn: func() {
		if !n.reach(from, to) {
			n.cut.Add(1)
			return
		}
		deliver(n.s.endpoint(to))
	}})
}

// post sends a gossip message to every other endpoint that subscribes to
// its subject, as NATS does: the regions, then globalsync. Gossip may be
// lost.
func (n *network) post(from string, m gossip.Message) {
	deliver := func(to endpoint) { to.step(m) }
	for _, r := range n.s.regions {
		if r.name != from && r.listens(m.Subject) {
			n.send(from, r.name, true, deliver)
		}
	}
	if from != coord.Name && n.s.gs.listens(m.Subject) {
		n.send(from, coord.Name, true, deliver)
	}
}

// partition cuts the regions off from the rest (together).
func (n *network) partition(regions []string) {
	for _, r := range regions {
		n.group[r] = 1
	}
	n.s.rec.note(n.s.now, "partition: %v cut off", regions)
}

// split cuts the groups from each other; regions in none stay with the
// first.
func (n *network) split(groups [][]string) {
	for i, g := range groups {
		for _, r := range g {
			n.group[r] = i
		}
	}
	n.s.rec.note(n.s.now, "split: %v", groups)
}

func (n *network) heal() { clear(n.group) }

// index is an endpoint's index: a region's, or len(regions) for
// globalsync.
func (s *sim) index(name string) int {
	if name == coord.Name {
		return len(s.regions)
	}
	return s.byName[name].idx
}

func (s *sim) endpoint(name string) endpoint {
	if name == coord.Name {
		return s.gs
	}
	return s.byName[name]
}
