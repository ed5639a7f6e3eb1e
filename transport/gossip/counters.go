package gossip

import (
	"context"
	"time"

	"github.com/geoquota/geoquota/crdt"
	"github.com/geoquota/geoquota/regional"
)

// Counters is the copy of the global counters a node keeps in step with
// the other regions': a region's engine (*regional.Engine), or globalsync's
// copy of every region's usage.
//
// A node calls these methods from Step and Tick, without holding its own
// lock, so that a slow merge into a store does not hold up the node: they
// may be called concurrently with each other, and must be safe for that
// (the engine's are, with its checks too).
type Counters interface {
	// OwnDeltas returns the region's own slots changed after version
	// since (0: all), in deltas of at most max entries, each covering a
	// range of versions (crdt.Counters.OwnDeltas); with nothing changed,
	// one delta of no entries that says where the versions stand.
	OwnDeltas(since uint64, max int) []crdt.Delta
	// RegionState returns every slot of one region the copy holds: what
	// is sent back to a region that lost its own.
	RegionState(region string) crdt.Delta
	// MergeRemote takes in another region's slots (per-slot maximum), and
	// says what it made of them.
	MergeRemote(ctx context.Context, d crdt.Delta) (crdt.MergeReport, error)
	// ObserveOwn takes in the region's own slots as a sibling replica saw
	// them counted in the store they share.
	ObserveOwn(d crdt.Delta)
}

// Engine is what a region's replica tells the others besides its counters,
// and what it learns of them. *regional.Engine implements it. Its methods
// are called as Counters' are, and must be as safe.
type Engine interface {
	// GlobalRegions returns every region whose usage the region counts,
	// itself included.
	GlobalRegions() []string
	// HeardFrom notes that a message from a region was accepted now.
	HeardFrom(region string)
	// GlobalReport reports every global rule, for the heartbeat.
	GlobalReport() []regional.RuleReport
}

// Heartbeats hears the replicas' heartbeats: globalsync's coordinator,
// through its observer node. Heartbeat is called as Counters' methods are,
// with the node's time.
type Heartbeats interface {
	Heartbeat(now time.Time, hb Heartbeat)
}

var _ interface {
	Counters
	Engine
} = (*regional.Engine)(nil)
