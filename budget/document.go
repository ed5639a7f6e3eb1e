package budget

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Document is one global rule's leases, one per region, as globalsync
// publishes them after a rebalance (JSON, one per rule in the budgets
// bucket), with what a globalsync taking over needs: the allocator's
// snapshot, and how far the books are closed.
type Document struct {
	Rule   string              `json:"rule"`
	Seq    uint64              `json:"seq"`
	Leader string              `json:"leader"`
	Issued time.Time           `json:"issued"`
	Leases map[string]LeaseDoc `json:"leases"` // by region
	// Shard and Shards say which slice of the rule's counters the
	// document serves (ShardOf), when globalsync runs as Shards
	// instances: its leases are the rule's on that slice alone, and its
	// counters are all of it. Both 0 when globalsync is not sharded.
	Shard  int `json:"shard,omitempty"`
	Shards int `json:"shards,omitempty"`
	// Marks, Acked, Debt, Held and HeldEpoch are the allocator's snapshot
	// (Snapshot): marks by window epoch (decimal), then region.
	Marks     map[string]map[string]float64 `json:"marks,omitempty"`
	Acked     map[string]uint64             `json:"acked,omitempty"`
	Debt      map[string]float64            `json:"debt,omitempty"`
	Held      map[string]float64            `json:"held,omitempty"`
	HeldEpoch int64                         `json:"held_epoch,omitempty"`
	// BooksClosed is how far the leader has closed the books: every
	// window that ended by then is reconciled, and a leader taking over
	// does not count it again.
	BooksClosed time.Time `json:"books_closed,omitzero"`
	// Counters are the leases of the rule's counters with budgets of
	// their own, by counter key (within the rule), then region; they all
	// expire at CounterExpires. A region enforces them on those counters,
	// and the rule's lease on the others.
	Counters       map[string]map[string]CounterLeaseDoc `json:"counters,omitempty"`
	CounterExpires time.Time                             `json:"counter_expires,omitzero"`
	// CounterSnapshots are the allocator's snapshots of those counters.
	CounterSnapshots map[string]CounterSnapshot `json:"counter_snapshots,omitempty"`
}

// CounterLeaseDoc is one region's lease of a counter's own budget, or,
// with Released set, word that the counter goes back to the rule then —
// with a floor or share too, the counter's last lease (Lease.Last).
type CounterLeaseDoc struct {
	Floor    float64   `json:"floor,omitempty"`
	Share    float64   `json:"share,omitempty"`
	Released time.Time `json:"released,omitzero"`
}

// LeaseDoc is one region's lease in a Document.
type LeaseDoc struct {
	Floor   float64   `json:"floor"`
	Share   float64   `json:"share"`
	Debt    float64   `json:"debt,omitempty"`
	Expires time.Time `json:"expires"`
	// Reason says why the share is what it is; regions do not read it.
	Reason Reason `json:"reason,omitzero"`
}

// NewDocument puts one rebalance's leases of a rule in a document.
func NewDocument(leader string, leases []Lease) Document {
	n := 0 // the rule's leases; the rest are counters'
	for _, l := range leases {
		if l.Key == "" {
			n++
		}
	}
	d := Document{Leader: leader, Leases: make(map[string]LeaseDoc, n)}
	for _, l := range leases {
		d.Rule, d.Seq, d.Issued = l.Rule, l.Seq, l.Issued
		if l.Key != "" {
			if d.Counters == nil {
				d.Counters = map[string]map[string]CounterLeaseDoc{}
			}
			if d.Counters[l.Key] == nil {
				d.Counters[l.Key] = map[string]CounterLeaseDoc{}
			}
			d.Counters[l.Key][l.Region] = CounterLeaseDoc{Floor: l.Floor, Share: l.Share, Released: l.Released}
			if !l.Expires.IsZero() {
				d.CounterExpires = l.Expires
			}
			continue
		}
		d.Leases[l.Region] = LeaseDoc{Floor: l.Floor, Share: l.Share, Debt: l.Debt, Expires: l.Expires, Reason: l.Reason}
	}
	return d
}

// CounterLeases returns the document's leases of counters with budgets of
// their own, by key then region.
func (d Document) CounterLeases() []Lease {
	var out []Lease
	for key, byRegion := range d.Counters {
		for r, c := range byRegion {
			l := Lease{Rule: d.Rule, Key: key, Region: r, Shard: d.Shard, Seq: d.Seq, Floor: c.Floor, Share: c.Share, Issued: d.Issued, Released: c.Released}
			if c.Released.IsZero() || l.Last() {
				l.Expires = d.CounterExpires
			}
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b Lease) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Region, b.Region))
	})
	return out
}

// SetSnapshot puts an allocator's snapshot in the document.
func (d *Document) SetSnapshot(s Snapshot) {
	d.Acked, d.Debt, d.Held, d.HeldEpoch = s.Acked, s.Debt, s.Held, s.HeldEpoch
	d.CounterSnapshots = s.Counters
	d.Marks = make(map[string]map[string]float64, len(s.Marks))
	for e, m := range s.Marks {
		d.Marks[strconv.FormatInt(e, 10)] = m
	}
}

// Snapshot returns the allocator's snapshot the document carries.
func (d Document) Snapshot() Snapshot {
	s := Snapshot{Acked: d.Acked, Marks: make(map[int64]map[string]float64, len(d.Marks)),
		Debt: d.Debt, Held: d.Held, HeldEpoch: d.HeldEpoch, Counters: d.CounterSnapshots}
	for e, m := range d.Marks {
		if n, err := strconv.ParseInt(e, 10, 64); err == nil {
			s.Marks[n] = m
		}
	}
	return s
}

// Lease returns a region's lease in the document.
func (d Document) Lease(region string) (Lease, bool) {
	l, ok := d.Leases[region]
	return Lease{Rule: d.Rule, Region: region, Shard: d.Shard, Seq: d.Seq, Floor: l.Floor, Share: l.Share, Debt: l.Debt,
		Issued: d.Issued, Expires: l.Expires, Reason: l.Reason}, ok
}

// All returns every lease in the document, by region.
func (d Document) All() []Lease {
	out := make([]Lease, 0, len(d.Leases))
	for r := range d.Leases {
		l, _ := d.Lease(r)
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Lease) int { return cmp.Compare(a.Region, b.Region) })
	return out
}

// ErrInvalidDocument is a budget document that names no rule or holds an
// impossible lease.
var ErrInvalidDocument = errors.New("budget: invalid document")

// DecodeDocument reads a document, refusing one that names no rule or
// holds an impossible lease.
func DecodeDocument(b []byte) (Document, error) {
	var d Document
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("%w: %v", ErrInvalidDocument, err)
	}
	if d.Rule == "" || d.Seq == 0 {
		return d, fmt.Errorf("%w: rule and seq are required", ErrInvalidDocument)
	}
	if d.Shards < 0 || d.Shards > MaxShards || d.Shard < 0 || (d.Shard > 0 && d.Shard >= d.Shards) {
		return d, fmt.Errorf("%w: %s: shard %d of %d: want 0 to shards-1, shards at most %d", ErrInvalidDocument, d.Rule, d.Shard, d.Shards, MaxShards)
	}
	for r, l := range d.Leases {
		if !(l.Floor >= 0 && l.Share >= 0 && l.Debt >= 0 && l.Floor+l.Share <= 1+1e-9) {
			return d, fmt.Errorf("%w: %s: lease of %s out of range: %+v", ErrInvalidDocument, d.Rule, r, l)
		}
	}
	if len(d.Counters) > MaxCounters || len(d.CounterSnapshots) > MaxCounters {
		return d, fmt.Errorf("%w: %s: counters: %d, more than %d", ErrInvalidDocument, d.Rule, max(len(d.Counters), len(d.CounterSnapshots)), MaxCounters)
	}
	for key, byRegion := range d.Counters {
		sum := 0.0
		for r, l := range byRegion {
			if !(l.Floor >= 0 && l.Share >= 0 && l.Floor+l.Share <= 1+1e-9) {
				return d, fmt.Errorf("%w: %s: counter %q: lease of %s out of range: %+v", ErrInvalidDocument, d.Rule, key, r, l)
			}
			sum += l.Floor + l.Share
		}
		if sum > 1+1e-6 {
			return d, fmt.Errorf("%w: %s: counter %q: leases sum to %v of the limit", ErrInvalidDocument, d.Rule, key, sum)
		}
	}
	return d, nil
}

// RestoreHistory gives the allocator what the previous leaders published
// of one rule, its documents oldest first: every lease that expires after
// the latest document's rebalance, less the skew allowance, may still be
// in force (windows may have begun since, under it), and the latest
// document's snapshot holds the marks and acknowledgements. Call it before
// the rule's first Rebalance.
func (a *Allocator) RestoreHistory(history []Document) {
	if len(history) == 0 {
		return
	}
	latest := history[len(history)-1]
	var live []Lease
	for _, d := range history {
		for _, l := range append(d.All(), d.CounterLeases()...) {
			if l.Expires.After(latest.Issued.Add(-a.cfg.Skew)) {
				live = append(live, l)
			}
		}
	}
	a.Restore(latest.Rule, live)
	a.RestoreSnapshot(latest.Rule, latest.Snapshot())
}
