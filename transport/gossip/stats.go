package gossip

import "sync/atomic"

// Stats counts what a node did and what it refused. Safe for concurrent
// use.
type Stats struct {
	// Received counts the messages handed to Step, but the node's own;
	// Sent, those the transport sent of what Step and Tick returned.
	Received, Sent atomic.Int64
	// Applied slots raised the copy; Repaired is the part of them that
	// came in answer to asks.
	Applied, Repaired atomic.Int64
	// Refused messages: malformed, from an unknown region, sent under
	// another region's name, or replayed.
	Malformed, UnknownRegion, Spoofed, Replayed atomic.Int64
	// Regressed slots were the sender's own and below what the copy
	// holds: a region replaying old state, or one that lost its own
	// counters — or, now and then, only a repair that relayed its slot and
	// overtook its own older delta. A lasting rise is the sign to heed.
	Regressed atomic.Int64
	// Ahead slots were of windows that start later than the receiver's
	// clock allows (regional.MaxAhead): refused.
	Ahead atomic.Int64
	// UnknownRule slots were of counters of no global rule in force:
	// refused.
	UnknownRule atomic.Int64
	StoreErrors atomic.Int64
	// Asks sent, asks answered, and asks left unanswered because their
	// asker asked too often (or too many asked).
	Asks, AsksAnswered, Paced atomic.Int64
	// Marks sent: how far this replica's versions run, every
	// anti-entropy round.
	Marks atomic.Int64
}

// Refused returns the messages and slots refused as bad.
func (s *Stats) Refused() int64 {
	return s.Malformed.Load() + s.UnknownRegion.Load() + s.Spoofed.Load() + s.Replayed.Load() + s.Regressed.Load() + s.Ahead.Load() +
		s.UnknownRule.Load()
}
