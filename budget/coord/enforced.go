package coord

import (
	"cmp"
	"slices"
	"time"

	"github.com/geoquota/geoquota/budget"
)

// What the leader granted and what a region enforces may differ: a lease
// published to a region cut off never reaches it, and the region runs on
// its last lease until that expires, then on its floor. A replica says in
// every heartbeat which lease it holds (RuleReport.Acked, the Seq of the
// newest it has enforced for a while); with the documents that Seq came
// in, the coordinator tells whether that lease still holds. Leading, it
// knows the documents it computed and restored; following, those it is
// given (Observe).

// issuedLeases are the rule's leases of one document: its Seq, and each
// region's lease.
type issuedLeases struct {
	seq    uint64
	leases map[string]budget.LeaseDoc
}

// record keeps a document's leases, by Seq, the History newest of each
// rule: as far back as a lease may still be in force.
func (c *Coordinator) record(doc budget.Document) {
	if doc.Rule == "" || doc.Seq == 0 {
		return
	}
	if c.issued == nil {
		c.issued = map[string][]issuedLeases{}
	}
	list := c.issued[doc.Rule]
	i, found := slices.BinarySearchFunc(list, doc.Seq, func(e issuedLeases, seq uint64) int { return cmp.Compare(e.seq, seq) })
	entry := issuedLeases{seq: doc.Seq, leases: doc.Leases}
	if found {
		list[i] = entry
	} else {
		list = slices.Insert(list, i, entry)
	}
	if len(list) > History {
		list = slices.Delete(list, 0, len(list)-History)
	}
	c.issued[doc.Rule] = list
}

// Observe takes in a document the leading instance published (the
// daemon hears them pushed): a follower's Budgets, Figures and Enforced
// then show the leader's leases. A leading coordinator keeps its own, and
// a document of a rule no region has reported, or of another slice of the
// counters than this coordinator's (Config.Shard), is ignored.
func (c *Coordinator) Observe(doc budget.Document) {
	if c.alloc != nil || doc.Rule == "" || doc.Seq == 0 {
		return
	}
	if doc.Shard != c.cfg.Shard || max(1, doc.Shards) != max(1, c.cfg.Shards) {
		return
	}
	if _, known := c.rules[doc.Rule]; !known {
		// Only the rules the regions report: what a message may make a
		// follower keep is bounded by what its regions run.
		return
	}
	c.record(doc)
	// Seqs grow across leaders (each restores them); another leader's
	// later document with a lower Seq is of a bucket made anew.
	cur, ok := c.docs[doc.Rule]
	if !ok || doc.Seq > cur.Seq || doc.Leader != cur.Leader && doc.Issued.After(cur.Issued) {
		c.docs[doc.Rule] = doc
	}
}

// The states of the lease a region enforces (Enforced.State).
const (
	// EnforcingLease: the lease the region's replicas hold is in force.
	EnforcingLease = "lease"
	// EnforcingLapsed: that lease has expired; the region is on its floor.
	EnforcingLapsed = "lapsed"
	// EnforcingFloor: the replicas hold no lease yet (a region starting,
	// or a replica restarted), and enforce their floor.
	EnforcingFloor = "floor"
	// EnforcingUnknown: the replicas hold a lease of a document this
	// coordinator has not seen (a follower started after it was issued).
	EnforcingUnknown = "unknown"
)

// Enforced is what a region's replicas last reported they enforce of a
// global rule: the lease they hold, and whether it holds at now.
type Enforced struct {
	// State is that of the oldest lease a replica holds (each replica
	// enforces its own): EnforcingLease, EnforcingLapsed, EnforcingFloor
	// or EnforcingUnknown.
	State string `json:"state"`
	// Seq is that lease's Seq, 0 for none.
	Seq uint64 `json:"seq,omitempty"`
	// Allowance is what the region may admit per window under it, as a
	// fraction of the limit: the lease's allowance while it holds, its
	// floor otherwise; nil (absent) if not known (EnforcingUnknown).
	Allowance *float64 `json:"allowance,omitempty"`
	// ExpiresMS is when the lease expires (Unix ms), 0 if not known.
	ExpiresMS int64 `json:"expires_ms,omitempty"`
	// Replicas is how many replicas' reports this is of: those heard
	// lately, or, if none is, every replica last heard (a region cut
	// off: what it said last, which may since have lapsed); OnFloor is
	// how many of them enforce their floor.
	Replicas int `json:"replicas"`
	OnFloor  int `json:"on_floor"`
	// HeardMS is how long ago the newest of those reports came.
	HeardMS int64 `json:"heard_ms"`
}

// Enforced returns, by rule then region, what each region's replicas
// last reported they enforce at now. A region none of whose replicas has
// reported a rule is left out of it.
func (c *Coordinator) Enforced(now time.Time) map[string]map[string]Enforced {
	out := map[string]map[string]Enforced{}
	floor := c.cfg.Budget.Floor(len(c.Regions()))
	for id := range c.rules {
		byRegion := map[string]Enforced{}
		for _, region := range c.Regions() {
			if e, ok := c.enforced(id, region, floor, now); ok {
				byRegion[region] = e
			}
		}
		out[id] = byRegion
	}
	return out
}

// enforced sums a region's replicas' reports on a rule (see Enforced).
func (c *Coordinator) enforced(rule, region string, floor float64, now time.Time) (Enforced, bool) {
	var live, silent []*replica
	for _, r := range c.replicas {
		switch {
		case r.region != region || r.rules[rule] == nil:
		case now.Sub(r.heard) <= c.replicaSilence():
			live = append(live, r)
		default:
			silent = append(silent, r)
		}
	}
	reps := live
	if len(reps) == 0 {
		reps = silent
	}
	if len(reps) == 0 {
		return Enforced{}, false
	}
	var out Enforced
	var newest time.Time
	onFloor := 0
	for i, r := range reps {
		e := c.replicaEnforces(rule, region, r.rules[rule].last.Acked, floor, now)
		if e.State == EnforcingLapsed || e.State == EnforcingFloor {
			onFloor++
		}
		if i == 0 || e.Seq < out.Seq {
			out = e
		}
		if r.heard.After(newest) {
			newest = r.heard
		}
	}
	out.Replicas, out.OnFloor, out.HeardMS = len(reps), onFloor, now.Sub(newest).Milliseconds()
	return out, true
}

// replicaEnforces is what a replica that holds the lease of Seq acked
// enforces at now. A lease's expiry grows with its Seq (every lease of a
// rebalance lasts as long): one whose document was not seen still holds
// if an older one does, and has lapsed if a newer one has.
func (c *Coordinator) replicaEnforces(rule, region string, acked uint64, floor float64, now time.Time) Enforced {
	if acked == 0 {
		return Enforced{State: EnforcingFloor, Allowance: &floor}
	}
	e := Enforced{State: EnforcingUnknown, Seq: acked}
	for _, is := range c.issued[rule] {
		l, ok := is.leases[region]
		if !ok {
			continue
		}
		holds := now.Before(l.Expires)
		switch {
		case is.seq == acked:
			e.ExpiresMS = l.Expires.UnixMilli()
			if holds {
				e.State, e.Allowance = EnforcingLease, ptr(max(0, l.Floor+l.Share-l.Debt))
			} else {
				e.State, e.Allowance = EnforcingLapsed, ptr(l.Floor)
			}
			return e
		case is.seq < acked && holds:
			e.State = EnforcingLease
		case is.seq > acked && !holds && e.State == EnforcingUnknown:
			e.State, e.Allowance = EnforcingLapsed, ptr(l.Floor)
		}
	}
	return e
}

func ptr(f float64) *float64 { return &f }
