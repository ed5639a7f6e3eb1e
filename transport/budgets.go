package transport

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/geoquota/geoquota/budget"
	"github.com/geoquota/geoquota/regional"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BudgetsBucket is the JetStream KV bucket where globalsync publishes the
// leases of every global rule, one key per rule (BudgetKey), and every
// regiond watches it.
const BudgetsBucket = "geoquota-budgets"

// BudgetHistory is how many revisions of each rule's leases the bucket
// keeps: enough to cover a lease's life at one rebalance a second, so that
// a globalsync taking over knows every lease still in force.
const BudgetHistory = 64

// BudgetKey is a rule's key in the bucket: its id, base64url-encoded, so
// that any rule id makes a valid key.
func BudgetKey(rule string) string { return "r." + base64.RawURLEncoding.EncodeToString([]byte(rule)) }

// BudgetDoc is one global rule's leases, one per region, as published.
type BudgetDoc struct {
	Rule   string              `json:"rule"`
	Seq    uint64              `json:"seq"`
	Leader string              `json:"leader"`
	Issued time.Time           `json:"issued"`
	Leases map[string]LeaseDoc `json:"leases"` // by region
	// Marks and Acked are the allocator's snapshot (budget.Snapshot), for
	// a globalsync that takes over: marks by window epoch (decimal), then
	// region.
	Marks     map[string]map[string]float64 `json:"marks,omitempty"`
	Acked     map[string]uint64             `json:"acked,omitempty"`
	Debt      map[string]float64            `json:"debt,omitempty"`
	Held      map[string]float64            `json:"held,omitempty"`
	HeldEpoch int64                         `json:"held_epoch,omitempty"`
	// BooksClosed is how far the leader has closed the books: every
	// window that ended by then is reconciled, and a leader taking over
	// does not count it again.
	BooksClosed time.Time `json:"books_closed,omitzero"`
}

// SetSnapshot puts an allocator's snapshot in the document.
func (d *BudgetDoc) SetSnapshot(s budget.Snapshot) {
	d.Acked, d.Debt, d.Held, d.HeldEpoch = s.Acked, s.Debt, s.Held, s.HeldEpoch
	d.Marks = make(map[string]map[string]float64, len(s.Marks))
	for e, m := range s.Marks {
		d.Marks[strconv.FormatInt(e, 10)] = m
	}
}

// Snapshot returns the allocator's snapshot the document carries.
func (d BudgetDoc) Snapshot() budget.Snapshot {
	s := budget.Snapshot{Acked: d.Acked, Marks: make(map[int64]map[string]float64, len(d.Marks)),
		Debt: d.Debt, Held: d.Held, HeldEpoch: d.HeldEpoch}
	for e, m := range d.Marks {
		if n, err := strconv.ParseInt(e, 10, 64); err == nil {
			s.Marks[n] = m
		}
	}
	return s
}

// LeaseDoc is one region's lease in a BudgetDoc.
type LeaseDoc struct {
	Floor   float64   `json:"floor"`
	Share   float64   `json:"share"`
	Debt    float64   `json:"debt,omitempty"`
	Expires time.Time `json:"expires"`
}

// NewBudgetDoc puts one rebalance's leases in a document.
func NewBudgetDoc(leader string, leases []budget.Lease) BudgetDoc {
	d := BudgetDoc{Leader: leader, Leases: make(map[string]LeaseDoc, len(leases))}
	for _, l := range leases {
		d.Rule, d.Seq, d.Issued = l.Rule, l.Seq, l.Issued
		d.Leases[l.Region] = LeaseDoc{Floor: l.Floor, Share: l.Share, Debt: l.Debt, Expires: l.Expires}
	}
	return d
}

// Lease returns region's lease in the document.
func (d BudgetDoc) Lease(region string) (budget.Lease, bool) {
	l, ok := d.Leases[region]
	return budget.Lease{Rule: d.Rule, Region: region, Seq: d.Seq, Floor: l.Floor, Share: l.Share, Debt: l.Debt,
		Issued: d.Issued, Expires: l.Expires}, ok
}

// All returns every lease in the document.
func (d BudgetDoc) All() []budget.Lease {
	out := make([]budget.Lease, 0, len(d.Leases))
	for r := range d.Leases {
		l, _ := d.Lease(r)
		out = append(out, l)
	}
	return out
}

// DecodeBudgetDoc reads a document, refusing one that names no rule or
// holds an impossible lease.
func DecodeBudgetDoc(b []byte) (BudgetDoc, error) {
	var d BudgetDoc
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("transport: budget document: %w", err)
	}
	if d.Rule == "" || d.Seq == 0 {
		return d, errors.New("transport: budget document: rule and seq are required")
	}
	for r, l := range d.Leases {
		if !(l.Floor >= 0 && l.Share >= 0 && l.Debt >= 0 && l.Floor+l.Share <= 1+1e-9) {
			return d, fmt.Errorf("transport: budget document for %s: lease of %s out of range: %+v", d.Rule, r, l)
		}
	}
	return d, nil
}

// RestoreAllocator gives a new leader's allocator what the previous
// leaders published of one rule (its documents, oldest first): every lease
// that expires after the latest document's rebalance, less the skew
// allowance, may still be in force (windows may have begun since, under
// it), and the latest document's snapshot holds the marks and
// acknowledgements.
func RestoreAllocator(a *budget.Allocator, history []BudgetDoc, skew time.Duration) {
	if len(history) == 0 {
		return
	}
	latest := history[len(history)-1]
	var live []budget.Lease
	for _, d := range history {
		for _, l := range d.All() {
			if l.Expires.After(latest.Issued.Add(-skew)) {
				live = append(live, l)
			}
		}
	}
	a.Restore(latest.Rule, live)
	a.RestoreSnapshot(latest.Rule, latest.Snapshot())
}

// WatchBudgets keeps the engine's lease current from the bucket until ctx
// ends (and notes the other regions' leases, for usage reports), waiting
// for the bucket if globalsync has not made it yet and watching again
// after errors; and takes the documents globalsync pushes (see
// PushBudgetsSubject) as they come.
func WatchBudgets(ctx context.Context, js jetstream.JetStream, e *regional.Engine, log *slog.Logger, resync *Resync) {
	apply := func(key string, value []byte) {
		d, err := DecodeBudgetDoc(value)
		if err != nil {
			log.Warn("budgets: bad document ignored", "key", key, "err", err)
			return
		}
		for _, l := range d.All() {
			e.SetLease(l) // ours in force (if newer than the one held); the others' noted for usage reports
		}
	}
	if sub, err := js.Conn().Subscribe(PushBudgetsSubject, func(m *nats.Msg) { apply("pushed", m.Data) }); err != nil {
		log.Warn("budgets: not subscribed to pushed documents; the bucket alone keeps the lease", "err", err)
	} else {
		defer sub.Unsubscribe()
	}
	watchKV(ctx, js, BudgetsBucket, jetstream.AllKeys, log, resync, func(en jetstream.KeyValueEntry) { apply(en.Key(), en.Value()) })
}

// watchKV hands every value put under keys (a KV key or wildcard) in
// bucket to handle, the current ones first, until ctx ends: it waits for
// the bucket if it is not there yet and watches again after errors.
// handle runs on this goroutine.
func watchKV(ctx context.Context, js jetstream.JetStream, bucket, keys string, log *slog.Logger, resync *Resync, handle func(jetstream.KeyValueEntry)) {
	for ctx.Err() == nil {
		err := watchOnce(ctx, js, bucket, keys, resync.C(), handle)
		if errors.Is(err, errResync) {
			log.Debug("watching again from the current values", "bucket", bucket)
			continue
		}
		if err != nil && ctx.Err() == nil {
			log.Debug("watching again", "bucket", bucket, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}

var errResync = errors.New("resync")

func watchOnce(ctx context.Context, js jetstream.JetStream, bucket, keys string, resync <-chan struct{}, handle func(jetstream.KeyValueEntry)) error {
	// A resync while the watch is being made (its request to JetStream
	// may be lost on a way still cut) abandons it for a new one.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resynced := make(chan struct{})
	go func() {
		select {
		case <-resync:
			close(resynced)
			cancel()
		case <-ctx.Done():
		}
	}()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return resyncOr(resynced, err)
	}
	w, err := kv.Watch(ctx, keys, jetstream.IgnoreDeletes())
	if err != nil {
		return resyncOr(resynced, err)
	}
	defer w.Stop()
	for {
		select {
		case <-resynced:
			return errResync
		case <-ctx.Done():
			return nil
		case en, ok := <-w.Updates():
			if !ok {
				return resyncOr(resynced, errors.New("watch ended"))
			}
			if en != nil { // nil: the current values are all in
				handle(en)
			}
		}
	}
}

// resyncOr is errResync if a resync came, or else err.
func resyncOr(resynced <-chan struct{}, err error) error {
	select {
	case <-resynced:
		return errResync
	default:
		return err
	}
}

// Resync tells KV watchers to watch again from the current values. A
// watch through a NATS gateway that was cut (a partition) does not
// notice by itself for as long as its consumer's heartbeats take to be
// missed, and meanwhile its region runs on a lapsing lease: the gossip
// fires it when a region silent for a while is heard again. Safe for
// concurrent use; a nil *Resync never fires.
type Resync struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns a channel closed at the next Fire.
func (r *Resync) C() <-chan struct{} {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch == nil {
		r.ch = make(chan struct{})
	}
	return r.ch
}

// Fire tells every watcher waiting on C to watch again.
func (r *Resync) Fire() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ch != nil {
		close(r.ch)
		r.ch = nil
	}
}
