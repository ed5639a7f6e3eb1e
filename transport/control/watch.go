package control

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
