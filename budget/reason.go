package budget

import "math"

// Why names the step of a rebalance that decided a region's share of a
// rule: floors, water-filling by demand, hysteresis or the room the
// high-water marks leave. It explains a lease and changes nothing of it.
type Why string

// The reasons of a lease (Reason.Why).
const (
	// WhyDemand: the region's demand above its floor is met in full.
	WhyDemand Why = "demand"
	// WhySpare: what the regions ask for is met in full and part of the
	// limit is left; the region's share holds its part of that spare, in
	// proportion to its demand (all of its share if its demand is within
	// its floor).
	WhySpare Why = "spare"
	// WhyLevel: the regions ask for more than the limit holds; the
	// region asks more than an equal part, and gets the level every
	// region asking as much gets (water-filling).
	WhyLevel Why = "level"
	// WhyFloor: the region's demand is within its floor, and the others'
	// demand takes all the rest: its floor alone.
	WhyFloor Why = "floor"
	// WhyIdle: the region asks nothing of the rule (its traffic may be on
	// counters with budgets of their own): its floor alone.
	WhyIdle Why = "idle"
	// WhyEven: no region asks anything of the rule; the rest is split
	// evenly over the regions heard within a lease's life.
	WhyEven Why = "even"
	// WhySilent: the region has not been heard for a lease's life (cut
	// off, or down), or, as the coordinator finds it, its replicas have
	// not been heard lately enough for their demand to count: its floor
	// alone, which is never given to another region.
	WhySilent Why = "silent"
	// WhyHeld: water-filling would move the share by less than the
	// hysteresis, so it stays as it was (topped up by what holding
	// shares back leaves over).
	WhyHeld Why = "held"
	// WhyMarks: the region wants more than the room left in the live
	// windows: the other regions may still admit up to their high-water
	// marks under leases they hold, or held, in them. More comes when
	// they acknowledge lower leases, or a new window begins.
	WhyMarks Why = "marks"
)

// Reason says why a region's lease of a rule is what it is: the step of
// the rebalance that decided its share, and the figures that step worked
// from, all fractions of the limit but Demand. Debt withheld is the
// lease's own (Lease.Debt). Leases of counters with budgets of their own
// carry none.
type Reason struct {
	Why Why `json:"why"`
	// Demand is the region's demand as the rebalance took it, in limits
	// per window (smoothed; 0 for a region not heard).
	Demand float64 `json:"demand"`
	// Target is the share water-filling gave the region, before
	// hysteresis; Want the floor plus the share after hysteresis, which
	// the lease falls short of when the marks leave too little room.
	Target float64 `json:"target"`
	Want   float64 `json:"want"`
}

// reasonOf says why region r's lease is f (floor included): want is its
// floor plus its share after hysteresis, target and share its share from
// water-filling and after hysteresis, need what it asks above its floor,
// spare what water-filling had left once every need was met, live the
// regions' demand summed. It reads the rebalance's figures, and changes
// nothing.
func (s *ruleState) reasonOf(r string, f, want, target, share, need, spare, live float64) Reason {
	demand, heard := s.demand[r]
	out := Reason{Demand: demand, Target: target, Want: want}
	switch {
	case f < want-eps:
		out.Why = WhyMarks
	case math.Abs(share-target) > eps:
		out.Why = WhyHeld
	case !heard && target <= eps:
		out.Why = WhySilent
	case live == 0:
		// (Split over every region if none is heard.)
		out.Why = WhyEven
	case demand == 0:
		out.Why = WhyIdle
	case target < need-eps:
		out.Why = WhyLevel
	case spare > eps:
		out.Why = WhySpare
	case need > 0:
		out.Why = WhyDemand
	default:
		out.Why = WhyFloor
	}
	return out
}
