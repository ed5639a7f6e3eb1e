package sim

import (
	"context"
	"errors"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
)

// faultyStore stands for a region's Redis: the real in-memory store, that
// can fail (every call errs, as with Redis down) and come back empty (as a
// Redis restarted without persistence).
type faultyStore struct {
	region string
	clock  func() time.Time
	mem    *regional.MemoryStore
	down   bool
}

var errStoreDown = errors.New("sim: store down")

func newFaultyStore(region string, clock func() time.Time) *faultyStore {
	f := &faultyStore{region: region, clock: clock}
	f.replace()
	return f
}

func (f *faultyStore) fail() { f.down = true }

// replace brings the store back, empty.
func (f *faultyStore) replace() {
	f.mem = regional.NewMemoryStore(f.clock)
	f.mem.SetRegion(f.region)
	f.down = false
}

func (f *faultyStore) Apply(ctx context.Context, ops []regional.Op, results []regional.Result) (int64, error) {
	if f.down {
		return 0, errStoreDown
	}
	return f.mem.Apply(ctx, ops, results)
}

func (f *faultyStore) Inspect(ctx context.Context, key []byte, p regional.Params) (regional.Result, error) {
	if f.down {
		return regional.Result{}, errStoreDown
	}
	return f.mem.Inspect(ctx, key, p)
}

func (f *faultyStore) Reset(ctx context.Context, key []byte, p regional.Params) error {
	if f.down {
		return errStoreDown
	}
	return f.mem.Reset(ctx, key, p)
}

func (f *faultyStore) Grant(ctx context.Context, key []byte, p regional.Params, n int64) (regional.Result, error) {
	if f.down {
		return regional.Result{}, errStoreDown
	}
	return f.mem.Grant(ctx, key, p, n)
}

func (f *faultyStore) Refund(ctx context.Context, key []byte, p regional.Params, n, at int64) (int64, error) {
	if f.down {
		return 0, errStoreDown
	}
	return f.mem.Refund(ctx, key, p, n, at)
}

func (f *faultyStore) Settle(ctx context.Context, ops []regional.SettleOp, mark string, until, actual int64, out []regional.Settlement) (int64, error) {
	if f.down {
		return 0, errStoreDown
	}
	return f.mem.Settle(ctx, ops, mark, until, actual, out)
}

func (f *faultyStore) MergeGlobal(ctx context.Context, windows []regional.GlobalWindow) (int, error) {
	if f.down {
		return 0, errStoreDown
	}
	return f.mem.MergeGlobal(ctx, windows)
}

func (f *faultyStore) ReadGlobal(ctx context.Context, key []byte, startMillis int64) ([]crdt.Slot, error) {
	if f.down {
		return nil, errStoreDown
	}
	return f.mem.ReadGlobal(ctx, key, startMillis)
}

func (f *faultyStore) AddGlobal(ctx context.Context, adds []regional.GlobalAdd, slots []crdt.Slot) error {
	if f.down {
		return errStoreDown
	}
	return f.mem.AddGlobal(ctx, adds, slots)
}

func (f *faultyStore) Heartbeat(ctx context.Context, replica string, unwritten int64, keep time.Duration) ([]regional.ReplicaState, int64, error) {
	if f.down {
		return nil, 0, errStoreDown
	}
	return f.mem.Heartbeat(ctx, replica, unwritten, keep)
}
