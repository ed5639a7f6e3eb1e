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
		err := watchOnce(ctx, js, bucket, keys, resync, handle)
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

func watchOnce(ctx context.Context, js jetstream.JetStream, bucket, keys string, resync *Resync, handle func(jetstream.KeyValueEntry)) error {
	// A resync while the watch is being made (its request to JetStream
	// may be lost on a way still cut) abandons it for a new one.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resynced, madeFirst, watching := make(chan struct{}), make(chan struct{}), make(chan struct{})
	first := resync.C()
	go func() {
		defer close(watching)
		select {
		case <-first:
			close(resynced)
			cancel()
		case <-madeFirst:
		case <-ctx.Done():
		}
	}()
	w, err := makeWatch(ctx, js, bucket, keys)
	close(madeFirst)
	<-watching
	if err != nil {
		return resyncOr(resynced, err)
	}
	select {
	case <-resynced:
		w.Stop()
		return errResync
	default:
	}
	// A resync once the watch is made makes another beside it, and the
	// first value the new one brings retires the old one: a watch that
	// came through a cut by itself keeps serving meanwhile (a new one's
	// requests may take a while to get through a gateway that redialled),
	// and one that did not is replaced.
	var next jetstream.KeyWatcher
	made := make(chan jetstream.KeyWatcher)
	stopMaking := func() {}
	defer func() {
		stopMaking()
		w.Stop()
		if next != nil {
			next.Stop()
		}
	}()
	again := resync.C()
	for {
		var nextUpdates <-chan jetstream.KeyValueEntry
		if next != nil {
			nextUpdates = next.Updates()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-again:
			again = resync.C()
			stopMaking()
			if next != nil {
				next.Stop()
				next = nil
			}
			mctx, stop := context.WithTimeout(ctx, remakeTimeout)
			stopMaking = stop
			go func() {
				nw, err := makeWatch(mctx, js, bucket, keys)
				if err != nil {
					return // the watch in place stays; the next resync tries again
				}
				select {
				case made <- nw:
				case <-mctx.Done():
					nw.Stop()
				}
			}()
		case nw := <-made:
			next = nw
		case en, ok := <-nextUpdates:
			if !ok {
				next.Stop()
				next = nil
				break
			}
			w.Stop()
			w, next = next, nil
			if en != nil {
				handle(en)
			}
		case en, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if en != nil { // nil: the current values are all in
				handle(en)
			}
		}
	}
}

// remakeTimeout bounds the making of a watch beside one in place.
const remakeTimeout = 30 * time.Second

func makeWatch(ctx context.Context, js jetstream.JetStream, bucket, keys string) (jetstream.KeyWatcher, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	return kv.Watch(ctx, keys, jetstream.IgnoreDeletes())
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
// watch through a NATS gateway that was cut (a partition) may not notice
// by itself for as long as its consumer's heartbeats take to be missed,
// and meanwhile its region runs on a lapsing lease: the gossip fires it
// when a region silent for a while is heard again. A watch in place
// keeps serving until the one made again brings its first value. Safe for
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
