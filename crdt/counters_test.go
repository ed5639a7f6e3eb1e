package crdt

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func newTestCounters(t interface {
	Helper()
	Fatal(...any)
}, self string) *Counters {
	t.Helper()
	c, err := NewCounters(self, testRegions)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// state is a replica's full state, versions aside: what must agree.
func state(c *Counters) []Entry { return c.DeltaSince(0).Entries }

func TestNewCountersRejectsBadRegions(t *testing.T) {
	for _, tc := range []struct {
		self    string
		regions []string
	}{
		{"us-east", nil},
		{"us-east", []string{"eu-west"}},
		{"us-east", []string{"us-east", "us-east"}},
		{"", []string{"", "us-east"}},
	} {
		if _, err := NewCounters(tc.self, tc.regions); !errors.Is(err, ErrInvalidRegions) {
			t.Errorf("NewCounters(%q, %q) = %v, want ErrInvalidRegions", tc.self, tc.regions, err)
		}
	}
}

func TestCountersIncDecValue(t *testing.T) {
	c := newTestCounters(t, "us-east")
	id := ID{Key: "k", Epoch: 60_000}
	c.Inc(id, 5)
	c.Dec(id, 2)
	c.Inc(id, 0) // no change, no version
	if got := c.Value(id); got != 3 {
		t.Fatalf("Value = %d, want 3", got)
	}
	if got := c.Version(); got != 2 {
		t.Fatalf("Version = %d, want 2 (one per change)", got)
	}
	got := c.Get(id)
	if got.P.Get("us-east") != 5 || got.N.Get("us-east") != 2 || got.Value() != 3 {
		t.Fatalf("Get = %+v", got)
	}
	if c.Value(ID{Key: "other"}) != 0 || c.Len() != 1 {
		t.Fatalf("unexpected counters: len %d", c.Len())
	}
}

// TestAppendCounts: every region's count of a window, in region order,
// none below zero; nothing for a window not held.
func TestAppendCounts(t *testing.T) {
	c := newTestCounters(t, "us-east")
	id := ID{Key: "k", Epoch: 1}
	c.Inc(id, 5)
	c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "eu-west", P: 2, N: 3}, {Region: "ap-south", P: 7, N: 1}}}}})
	if got := c.AppendCounts([]int64{9}, []byte("k"), 1); !slices.Equal(got, []int64{9, 6, 0, 5}) {
		t.Fatalf("AppendCounts = %v, want [9 6 0 5]: ap-south, eu-west (below zero: 0), us-east after what was there", got)
	}
	if got := c.AppendCounts(nil, []byte("k"), 2); len(got) != 0 {
		t.Fatalf("AppendCounts of a window not held = %v", got)
	}
}

func TestMergeReportsAndIgnoresBadSlots(t *testing.T) {
	c := newTestCounters(t, "us-east")
	id := ID{Key: "k", Epoch: 1}
	r := c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "eu-west", P: 10, N: 1}}}}})
	if r != (MergeReport{Applied: 1}) {
		t.Fatalf("first merge: %+v", r)
	}
	before := state(c)
	v := c.Version()

	// Same again: a duplicate. Lower: a regression. Unknown region: refused.
	r = c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: id, Slots: []Slot{
		{Region: "eu-west", P: 10, N: 1},
		{Region: "mars-1", P: 99},
	}}, {ID: ID{Key: "k2"}, Slots: []Slot{{Region: "eu-west", P: 0}}}}})
	if r != (MergeReport{Duplicate: 2, UnknownRegion: 1}) {
		t.Fatalf("duplicate merge: %+v", r)
	}
	r = c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "eu-west", P: 9, N: 1}}}}})
	if r != (MergeReport{Regressed: 1}) || r.Rejected() != 1 {
		t.Fatalf("regressing merge: %+v", r)
	}
	// An unknown origin, or none, is refused whole, even for slots of
	// known regions.
	for _, origin := range []string{"mars-1", ""} {
		r = c.Merge(Delta{Origin: origin, Entries: []Entry{{ID: id, Slots: []Slot{{Region: "eu-west", P: 50}, {Region: "ap-south", P: 1}}}}})
		if r != (MergeReport{UnknownRegion: 2}) {
			t.Fatalf("origin %q: %+v", origin, r)
		}
	}
	if !reflect.DeepEqual(state(c), before) || c.Version() != v {
		t.Fatalf("rejected slots changed the state: %+v (version %d -> %d)", state(c), v, c.Version())
	}

	// A slot that regresses in one total and grows in the other: counted as
	// a regression, and only the growth is taken.
	r = c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "eu-west", P: 7, N: 4}}}}})
	if r != (MergeReport{Regressed: 1}) {
		t.Fatalf("mixed merge: %+v", r)
	}
	if g := c.Get(id); g.P.Get("eu-west") != 10 || g.N.Get("eu-west") != 4 {
		t.Fatalf("mixed merge state: %+v", g)
	}
}

func TestRelayedOlderSlotsAreStaleNotRegressed(t *testing.T) {
	us, eu, ap := newTestCounters(t, "us-east"), newTestCounters(t, "eu-west"), newTestCounters(t, "ap-south")
	id := ID{Key: "k"}
	us.Inc(id, 1)
	eu.Merge(us.OwnDeltaSince(0))
	ap.Merge(us.OwnDeltaSince(0))
	us.Inc(id, 1)
	ap.Merge(us.OwnDeltaSince(0))
	// eu-west is a round behind; its full state relays us-east's older slot.
	if r := ap.Merge(eu.DeltaSince(0)); r != (MergeReport{Stale: 1}) || r.Rejected() != 0 {
		t.Fatalf("relayed older slot: %+v", r)
	}
	// us-east itself sending less than before is a regression.
	old := Delta{Origin: "us-east", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "us-east", P: 1}}}}}
	if r := ap.Merge(old); r != (MergeReport{Regressed: 1}) || r.Rejected() != 1 {
		t.Fatalf("own slot going back: %+v", r)
	}
}

func TestDeltaMergeRefusesWhatItCannotSay(t *testing.T) {
	slot := []Slot{{Region: "us-east", P: 1}}
	a := Delta{Origin: "us-east", From: 0, To: 5, Entries: []Entry{{ID: ID{Key: "a"}, Slots: slot}}}
	for name, o := range map[string]Delta{
		"another origin": {Origin: "eu-west", From: 5, To: 9, Entries: []Entry{{ID: ID{Key: "b"}, Slots: slot}}},
		"a version gap":  {Origin: "us-east", From: 20, To: 30, Entries: []Entry{{ID: ID{Key: "b"}, Slots: slot}}},
	} {
		d := a
		d.Entries = slices.Clone(a.Entries)
		if err := d.Merge(o); !errors.Is(err, ErrInvalidDelta) || !reflect.DeepEqual(d, a) {
			t.Errorf("%s: Merge = %v, delta now %+v", name, err, d)
		}
	}
	d := a
	d.Entries = slices.Clone(a.Entries)
	if err := d.Merge(Delta{Origin: "us-east", From: 5, To: 9, Entries: []Entry{{ID: ID{Key: "b"}, Slots: slot}}}); err != nil || d.From != 0 || d.To != 9 || len(d.Entries) != 2 {
		t.Fatalf("touching ranges: %v, %+v", err, d)
	}
}

func TestMergeRestoresOwnSlotAfterLoss(t *testing.T) {
	// A region that lost its store gets its own counts back from a peer.
	us := newTestCounters(t, "us-east")
	id := ID{Key: "k", Epoch: 1}
	us.Inc(id, 42)
	eu := newTestCounters(t, "eu-west")
	eu.Merge(us.OwnDeltaSince(0))

	fresh := newTestCounters(t, "us-east")
	repair := eu.RegionState("us-east")
	if repair.Origin != "eu-west" || repair.To != 0 {
		t.Fatalf("RegionState = %+v, want eu-west's copy, over no versions", repair)
	}
	fresh.Merge(repair)
	if got := fresh.Get(id).P.Get("us-east"); got != 42 {
		t.Fatalf("recovered own slot = %d, want 42", got)
	}
	fresh.Inc(id, 1)
	if got := fresh.Value(id); got != 43 {
		t.Fatalf("after recovery and one more: %d, want 43", got)
	}
}

func TestDeltaSince(t *testing.T) {
	us := newTestCounters(t, "us-east")
	a, b, x := ID{Key: "a"}, ID{Key: "b"}, ID{Key: "x"}
	us.Inc(b, 1)
	us.Inc(a, 1)
	v := us.Version()
	us.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: a, Slots: []Slot{{Region: "eu-west", P: 7}}}}})
	us.Inc(x, 2)

	all := us.DeltaSince(v)
	want := []Entry{
		{ID: a, Slots: []Slot{{Region: "eu-west", P: 7}, {Region: "us-east", P: 1}}}, // a changed: every slot of it
		{ID: x, Slots: []Slot{{Region: "us-east", P: 2}}},
	}
	if !reflect.DeepEqual(all.Entries, want) || all.From != v || all.To != us.Version() || all.Origin != "us-east" {
		t.Fatalf("DeltaSince(%d) = %+v", v, all)
	}
	own := us.OwnDeltaSince(v)
	if !reflect.DeepEqual(own.Entries, want[1:]) { // a's own slot is older than v
		t.Fatalf("OwnDeltaSince(%d) = %+v", v, own.Entries)
	}
	if d := us.DeltaSince(us.Version()); len(d.Entries) != 0 {
		t.Fatalf("nothing changed, yet DeltaSince = %+v", d)
	}
	if err := all.Validate(); err != nil {
		t.Fatalf("DeltaSince is not canonical: %v", err)
	}
}

func TestExpire(t *testing.T) {
	c := newTestCounters(t, "us-east")
	for epoch := range int64(5) {
		c.Inc(ID{Key: "k", Epoch: epoch * 60_000}, 1)
	}
	v := c.Version()
	n := c.Expire(func(id ID) bool { return id.Epoch < 3*60_000 })
	if n != 3 || c.Len() != 2 || c.Version() != v {
		t.Fatalf("Expire removed %d, left %d, version %d->%d", n, c.Len(), v, c.Version())
	}
	if got := state(c); len(got) != 2 || got[0].Epoch != 3*60_000 {
		t.Fatalf("state after expiry: %+v", got)
	}
	// What changed is still found after removals from a key's windows.
	c.Inc(ID{Key: "k", Epoch: 3 * 60_000}, 1)
	if d := c.DeltaSince(v); len(d.Entries) != 1 || d.Entries[0].Slots[0].P != 2 {
		t.Fatalf("DeltaSince after expiry: %+v", d)
	}
}

// TestReplicasConverge drives three replicas through random increments,
// gossip of own deltas (encoded and decoded), and deliveries that are
// reordered, duplicated or lost; then one round of anti-entropy. Every
// replica must end with exactly what was counted, and all must agree.
func TestReplicasConverge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		reps := make([]*Counters, len(testRegions))
		for i, r := range testRegions {
			reps[i] = newTestCounters(t, r)
		}
		type counts struct{ p, n uint64 }
		truth := map[ID][]counts{}
		published := make([]uint64, len(reps))
		type message struct {
			from, to int
			msg      []byte
		}
		// have[i][j] is the version up to which i holds j's own slots
		// without a gap: what i asks j for the rest from.
		have := make([][]uint64, len(reps))
		for i := range have {
			have[i] = make([]uint64, len(reps))
		}
		var inflight []message
		ids := rapid.SampledFrom([]ID{{"a", 0}, {"a", 60}, {"b", 0}, {"tenant/c", 60}})

		for range rapid.IntRange(0, 150).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 5).Draw(t, "op"); {
			case op <= 1: // count at a replica
				r := rapid.IntRange(0, len(reps)-1).Draw(t, "replica")
				id, n := ids.Draw(t, "id"), rapid.Uint64Range(1, 50).Draw(t, "n")
				if truth[id] == nil {
					truth[id] = make([]counts, len(reps))
				}
				if op == 0 {
					reps[r].Inc(id, n)
					truth[id][r].p += n
				} else {
					reps[r].Dec(id, n)
					truth[id][r].n += n
				}
			case op == 2: // gossip own changes
				r := rapid.IntRange(0, len(reps)-1).Draw(t, "replica")
				d := reps[r].OwnDeltaSince(published[r])
				published[r] = d.To
				msg, err := AppendDelta(nil, d)
				if err != nil {
					t.Fatal(err)
				}
				for to := range reps {
					if to != r {
						inflight = append(inflight, message{r, to, msg})
					}
				}
			case len(inflight) == 0:
			case op == 3: // deliver one, in any order
				i := rapid.IntRange(0, len(inflight)-1).Draw(t, "deliver")
				m := inflight[i]
				inflight = append(inflight[:i], inflight[i+1:]...)
				d, err := DecodeDelta(m.msg)
				if err != nil {
					t.Fatal(err)
				}
				if rep := reps[m.to].Merge(d); rep.UnknownRegion != 0 {
					t.Fatalf("unknown region in %+v", rep)
				}
				if d.From <= have[m.to][m.from] {
					have[m.to][m.from] = max(have[m.to][m.from], d.To)
				}
			case op == 4: // duplicate one
				inflight = append(inflight, inflight[rapid.IntRange(0, len(inflight)-1).Draw(t, "dup")])
			case op == 5: // lose one
				i := rapid.IntRange(0, len(inflight)-1).Draw(t, "lose")
				inflight = append(inflight[:i], inflight[i+1:]...)
			}
		}

		// Anti-entropy: each replica asks every other for its own slots
		// changed since the version it holds them to, through the wire.
		parts := rapid.IntRange(1, 3).Draw(t, "entries per part")
		for i := range reps {
			for j := range reps {
				if i != j {
					pull(t, reps[i], reps[j], have[i][j], parts)
				}
			}
		}
		for id, want := range truth {
			for k, rep := range reps {
				got := rep.Get(id)
				for r, region := range testRegions {
					if got.P.Get(region) != want[r].p || got.N.Get(region) != want[r].n {
						t.Fatalf("replica %s, counter %v, slot %s: got (%d, %d), want (%d, %d)",
							testRegions[k], id, region, got.P.Get(region), got.N.Get(region), want[r].p, want[r].n)
					}
				}
			}
		}
		for k := 1; k < len(reps); k++ {
			if !reflect.DeepEqual(state(reps[k]), state(reps[0])) {
				t.Fatalf("replicas %s and %s disagree", testRegions[k], testRegions[0])
			}
		}
	})
}

// pull repairs dst from src by anti-entropy: src's own slots changed
// since version since, in parts, through the wire encoding.
func pull(t *rapid.T, dst, src *Counters, since uint64, max int) {
	for _, d := range src.OwnDeltas(since, max) {
		msg, err := AppendDelta(nil, d)
		if err != nil {
			t.Fatal(err)
		}
		if d, err = DecodeDelta(msg); err != nil {
			t.Fatal(err)
		}
		dst.Merge(d)
	}
}

func TestDeltaMergeEqualsFullStateMerge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		us, eu, ap := newTestCounters(t, "us-east"), newTestCounters(t, "eu-west"), newTestCounters(t, "ap-south")
		randomOps(t, "us1", us)
		randomOps(t, "eu1", eu)
		eu.Merge(us.DeltaSince(0))
		synced := us.Version()
		randomOps(t, "us2", us)
		randomOps(t, "ap", ap)
		us.Merge(ap.DeltaSince(0))
		randomOps(t, "us3", us)

		viaDelta, viaFull := clone(t, eu), clone(t, eu)
		viaDelta.Merge(us.DeltaSince(synced))
		viaFull.Merge(us.DeltaSince(0))
		if !reflect.DeepEqual(state(viaDelta), state(viaFull)) {
			t.Fatalf("delta merge differs from full-state merge")
		}
		// Own deltas carry exactly the sender's own slots.
		viaOwn := clone(t, eu)
		viaOwn.Merge(us.OwnDeltaSince(synced))
		for _, e := range state(us) {
			if got, want := viaOwn.Get(e.ID).P.Get("us-east"), us.Get(e.ID).P.Get("us-east"); got != want {
				t.Fatalf("%v: own delta gave %d, sender has %d", e.ID, got, want)
			}
		}
	})
}

func TestDeltaJoinEqualsSequentialMerge(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := newTestCounters(t, "us-east")
		randomOps(t, "base", base)
		d1, d2 := genDelta(true).Draw(t, "d1"), genDelta(true).Draw(t, "d2")
		if rapid.IntRange(0, 3).Draw(t, "same origin, touching") > 0 {
			d2.Origin = d1.Origin
			d2.From = rapid.Uint64Range(0, d1.To).Draw(t, "d2 from")
			d2.To = d2.From + rapid.Uint64Range(0, 50).Draw(t, "d2 span")
		}
		seq := clone(t, base)
		seq.Merge(d1)
		seq.Merge(d2)
		joined := Delta{Origin: d1.Origin, From: d1.From, To: d1.To, Entries: append([]Entry(nil), d1.Entries...)}
		if err := joined.Merge(d2); err != nil {
			if d1.Origin == d2.Origin && d2.From <= d1.To && d1.From <= d2.To {
				t.Fatalf("joinable deltas refused: %v", err)
			}
			return
		}
		if d1.Origin != d2.Origin {
			t.Fatalf("deltas from %q and %q joined", d1.Origin, d2.Origin)
		}
		if err := joined.Validate(); err != nil {
			t.Fatalf("joined delta not canonical: %v", err)
		}
		once := clone(t, base)
		once.Merge(joined)
		if !reflect.DeepEqual(state(seq), state(once)) {
			t.Fatalf("joined delta differs from merging both")
		}
	})
}

func randomOps(t *rapid.T, label string, c *Counters) {
	for range rapid.IntRange(0, 20).Draw(t, label+" ops") {
		id := ID{Key: rapid.SampledFrom([]string{"a", "b", "c", "d"}).Draw(t, label+" key"), Epoch: rapid.Int64Range(0, 2).Draw(t, label+" epoch")}
		n := rapid.Uint64Range(1, 100).Draw(t, label+" n")
		if rapid.Bool().Draw(t, label+" dec") {
			c.Dec(id, n)
		} else {
			c.Inc(id, n)
		}
	}
}

func clone(t *rapid.T, c *Counters) *Counters {
	out, err := NewCounters(c.Self(), c.Regions())
	if err != nil {
		t.Fatal(err)
	}
	out.Merge(c.DeltaSince(0))
	return out
}

// genDelta draws a delta over the test regions (and, if wild, others),
// canonical or not.
func genDelta(wild bool) *rapid.Generator[Delta] {
	regions := testRegions
	if wild {
		regions = append(regions[:len(regions):len(regions)], "mars-1", "x")
	}
	return rapid.Custom(func(t *rapid.T) Delta {
		d := Delta{Origin: rapid.SampledFrom(regions).Draw(t, "origin")}
		d.From = rapid.Uint64Range(0, 100).Draw(t, "from")
		d.To = d.From + rapid.Uint64Range(0, 100).Draw(t, "span")
		for range rapid.IntRange(0, 8).Draw(t, "entries") {
			e := Entry{ID: ID{
				Key:   rapid.SampledFrom([]string{"a", "b", "tenant/sk_1", "tenant/sk_2", "tenant/sk_10"}).Draw(t, "key"),
				Epoch: rapid.SampledFrom([]int64{-60, 0, 60, 1 << 40}).Draw(t, "epoch"),
			}}
			for range rapid.IntRange(1, 4).Draw(t, "slots") {
				e.Slots = append(e.Slots, Slot{
					Region: rapid.SampledFrom(regions).Draw(t, "region"),
					P:      genAmount().Draw(t, "p"),
					N:      rapid.OneOf(rapid.Just(uint64(0)), genAmount()).Draw(t, "n"),
				})
			}
			d.Entries = append(d.Entries, e)
		}
		return d
	})
}

func ExampleCounters() {
	us, _ := NewCounters("us-east", []string{"us-east", "eu-west"})
	eu, _ := NewCounters("eu-west", []string{"us-east", "eu-west"})
	id := ID{Key: "tenant-global/sk_prod_1", Epoch: 1_767_225_600_000}

	us.Inc(id, 3)
	eu.Inc(id, 4)

	// Each region gossips its own changes; the other merges them.
	msg, _ := AppendDelta(nil, us.OwnDeltaSince(0))
	d, _ := DecodeDelta(msg)
	report := eu.Merge(d)
	fmt.Println("eu-west sees", eu.Value(id), "after", report.Applied, "applied slot")

	// Delivering the same message again changes nothing.
	fmt.Println("duplicates:", eu.Merge(d).Duplicate, "value:", eu.Value(id))
	// Output:
	// eu-west sees 7 after 1 applied slot
	// duplicates: 1 value: 7
}

func TestObserveRaisesOwnSlotOnly(t *testing.T) {
	c, err := NewCounters("eu", testRegions[:0:0])
	if err == nil {
		t.Fatal("no regions: want an error")
	}
	c, _ = NewCounters("eu-west", testRegions)
	id := ID{Key: "k", Epoch: 1}
	if !c.Observe(id, 5, 1) || c.Value(id) != 4 {
		t.Fatalf("observe 5/1: value %d", c.Value(id))
	}
	v := c.Version()
	if c.Observe(id, 3, 1) || c.Version() != v || c.Value(id) != 4 {
		t.Fatalf("a lower observation changed the slot: value %d, version %d → %d", c.Value(id), v, c.Version())
	}
	if !c.Observe(id, 3, 2) || c.Value(id) != 3 {
		t.Fatalf("observe N 2: value %d, want 3", c.Value(id))
	}
	d := c.OwnDeltaSince(v)
	if len(d.Entries) != 1 || d.Entries[0].Slots[0] != (Slot{Region: "eu-west", P: 5, N: 2}) {
		t.Fatalf("delta after observe: %+v", d)
	}
	if c.Observe(ID{Key: "none", Epoch: 1}, 0, 0) || c.Len() != 1 {
		t.Fatal("observing nothing created a counter")
	}
}

// TestOwnDeltasCoverTheirRanges checks the promise of OwnDeltas: parts of
// at most max entries, chained From to To from v to the latest version,
// together the own slots OwnDeltaSince gives; and a receiver that held
// the sender's own slots as of version v and merged the parts up to one
// needs only what changed after that part's To to hold them all.
func TestOwnDeltasCoverTheirRanges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := newTestCounters(t, "us-east")
		other := newTestCounters(t, "eu-west")
		// own[v] is the sender's own state as of version v.
		own := map[uint64][]Entry{0: nil}
		for range rapid.IntRange(0, 60).Draw(t, "ops") {
			id := ID{Key: fmt.Sprint("k", rapid.IntRange(0, 9).Draw(t, "key")), Epoch: 1}
			if rapid.Bool().Draw(t, "remote") {
				other.Inc(id, 1)
				c.Merge(other.OwnDeltaSince(0))
			} else {
				c.Inc(id, uint64(rapid.IntRange(1, 3).Draw(t, "n")))
			}
			own[c.Version()] = c.OwnDeltaSince(0).Entries
		}
		v := rapid.Uint64Range(0, c.Version()).Draw(t, "since")
		maxEntries := rapid.IntRange(0, 4).Draw(t, "max")
		parts := c.OwnDeltas(v, maxEntries)
		from := min(v, c.Version())
		var all Delta
		for i, p := range parts {
			if p.From != from || p.To < p.From || (maxEntries > 0 && len(p.Entries) > maxEntries) {
				t.Fatalf("part %d runs (%d, %d] with %d entries, want from %d, at most %d", i, p.From, p.To, len(p.Entries), from, maxEntries)
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("part %d: %v", i, err)
			}
			from = p.To
			all.Entries = append(all.Entries, p.Entries...)
		}
		if from != c.Version() {
			t.Fatalf("parts run to %d, want %d", from, c.Version())
		}
		all.Normalize()
		if want := c.OwnDeltaSince(v).Entries; !reflect.DeepEqual(all.Entries, want) {
			t.Fatalf("parts hold %v, want %v", all.Entries, want)
		}
		// The receiver as of v: the state last recorded at or before it.
		base := v
		for _, ok := own[base]; !ok; _, ok = own[base] {
			base--
		}
		want := c.OwnDeltaSince(0).Entries
		r := newTestCounters(t, "ap-south")
		r.Merge(Delta{Origin: "us-east", Entries: own[base]})
		for i, p := range parts {
			r.Merge(p)
			rest := newTestCounters(t, "ap-south")
			rest.Merge(Delta{Origin: "us-east", Entries: state(r)})
			rest.Merge(c.OwnDeltaSince(p.To))
			if got := rest.OwnDeltaSince(0).Entries; len(got) != 0 {
				t.Fatalf("the receiver counts as its own %v", got)
			}
			for _, e := range want {
				if got := rest.Get(e.ID).P.Get("us-east"); got != e.Slots[0].P {
					t.Fatalf("after part %d (to %d) and what changed since, the receiver holds %s at %d, want %d", i, p.To, e.Key, got, e.Slots[0].P)
				}
			}
		}
	})
}

// TestMemoryPerCounter holds what a counter costs in a collection: with
// five regions' slots and a 33-byte key, about 226 bytes (the entry and its
// slots in one allocation of 144, the map's slot and the key); the test
// allows 240. A second window of the same key shares the map's slot and
// the key: 144 bytes, and the test allows 150.
func TestMemoryPerCounter(t *testing.T) {
	regions := []string{"af", "ap", "eu", "sa", "us"}
	const n = 50_000
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	c, err := NewCounters("eu", regions)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := ID{Key: fmt.Sprintf("gq:{tenants-global:tenant-%06d}", i), Epoch: 1}
		for _, r := range regions {
			c.Merge(Delta{Origin: r, Entries: []Entry{{ID: id, Slots: []Slot{{Region: r, P: 5}}}}})
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per counter", per)
	if per > 240 {
		t.Fatalf("a counter of five regions costs %.0f bytes, want at most 240", per)
	}
	before = after
	for i := range n {
		id := ID{Key: fmt.Sprintf("gq:{tenants-global:tenant-%06d}", i), Epoch: 2}
		c.Merge(Delta{Origin: "us", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "us", P: 5}}}}})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per = float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per second window", per)
	if per > 150 {
		t.Fatalf("a counter's second window costs %.0f bytes, want at most 150", per)
	}
	runtime.KeepAlive(c)
}

// TestWindowsOfAKey checks the windows a key holds against a plain map:
// windows made in any order, by counting and by merging, and expired from
// the newest, the oldest or the middle.
func TestWindowsOfAKey(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := newTestCounters(t, "us-east")
		model := map[ID][2]uint64{} // this region's P and eu-west's
		ids := rapid.Custom(func(t *rapid.T) ID {
			return ID{Key: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "key"), Epoch: rapid.Int64Range(0, 5).Draw(t, "epoch")}
		})
		for range rapid.IntRange(1, 60).Draw(t, "steps") {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				id := ids.Draw(t, "inc")
				m := model[id]
				m[0]++
				switch rapid.IntRange(0, 2).Draw(t, "by") {
				case 0:
					c.Inc(id, 1)
				case 1:
					if p, n := c.IncKey([]byte(id.Key), id.Epoch, 1); p != m[0] || n != 0 {
						t.Fatalf("IncKey %v: %d/%d, want %d/0", id, p, n, m[0])
					}
				case 2:
					if !c.ObserveKey([]byte(id.Key), id.Epoch, m[0], 0) || c.ObserveKey([]byte(id.Key), id.Epoch, m[0], 0) {
						t.Fatalf("ObserveKey %v to %d: raised it not once", id, m[0])
					}
				}
				model[id] = m
			case 1:
				id := ids.Draw(t, "merge")
				m := model[id]
				m[1]++
				c.Merge(Delta{Origin: "eu-west", Entries: []Entry{{ID: id, Slots: []Slot{{Region: "eu-west", P: m[1]}}}}})
				model[id] = m
			case 2:
				lo, hi := rapid.Int64Range(0, 5).Draw(t, "lo"), rapid.Int64Range(0, 5).Draw(t, "hi")
				out := func(id ID) bool { return id.Epoch >= lo && id.Epoch <= hi }
				want := 0
				for id := range model {
					if out(id) {
						delete(model, id)
						want++
					}
				}
				if got := c.Expire(out); got != want {
					t.Fatalf("Expire(%d..%d) removed %d, want %d", lo, hi, got, want)
				}
			case 3:
				id := ids.Draw(t, "read")
				m := model[id]
				p, n := c.Own(id)
				op, on := c.Others(id)
				if p != m[0] || n != 0 || op != m[1] || on != 0 || c.Value(id) != int64(m[0]+m[1]) {
					t.Fatalf("%v: own %d/%d others %d/%d value %d, want %v", id, p, n, op, on, c.Value(id), m)
				}
				if got := c.Tally([]byte(id.Key), id.Epoch); got != (Tally{P: m[0], OthersP: m[1]}) {
					t.Fatalf("Tally %v: %+v, want %v", id, got, m)
				}
				if p, _ := c.IncKey([]byte(id.Key), id.Epoch, 0); p != m[0] || c.Len() != len(model) {
					t.Fatalf("IncKey %v by 0: %d, %d windows; want %d, %d", id, p, c.Len(), m[0], len(model))
				}
			}
			if c.Len() != len(model) {
				t.Fatalf("Len %d, want %d", c.Len(), len(model))
			}
		}
		got := state(c)
		if len(got) != len(model) {
			t.Fatalf("state holds %d windows, want %d", len(got), len(model))
		}
		for _, en := range got {
			var sum uint64
			for _, s := range en.Slots {
				sum += s.P
			}
			if m := model[en.ID]; sum != m[0]+m[1] {
				t.Fatalf("%v: %+v, want %v", en.ID, en.Slots, m)
			}
		}
	})
}

// TestOwnDeltasFromRecentChanges checks that OwnDeltas, which reads the
// list of own changes, gives what a scan of every counter changed after
// the version gives: counting, merging, observing and expiring in any
// order.
func TestOwnDeltasFromRecentChanges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := newTestCounters(t, "us-east")
		other := newTestCounters(t, "eu-west")
		ids := rapid.Custom(func(t *rapid.T) ID {
			return ID{Key: fmt.Sprint("k", rapid.IntRange(0, 5).Draw(t, "key")), Epoch: rapid.Int64Range(0, 3).Draw(t, "epoch")}
		})
		for range rapid.IntRange(0, 80).Draw(t, "ops") {
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0:
				c.Inc(ids.Draw(t, "inc"), uint64(rapid.IntRange(0, 3).Draw(t, "n")))
			case 1:
				c.Dec(ids.Draw(t, "dec"), 1)
			case 2:
				other.Inc(ids.Draw(t, "remote"), 1)
				c.Merge(other.OwnDeltaSince(0))
			case 3:
				id := ids.Draw(t, "observe")
				p, n := c.Own(id)
				c.Observe(id, p+uint64(rapid.IntRange(0, 2).Draw(t, "p")), n)
			case 4:
				epoch := rapid.Int64Range(0, 3).Draw(t, "expire")
				c.Expire(func(id ID) bool { return id.Epoch == epoch })
			}
		}
		v := rapid.Uint64Range(0, c.Version()+1).Draw(t, "since")
		maxEntries := rapid.IntRange(0, 4).Draw(t, "max")
		if got, want := c.OwnDeltas(v, maxEntries), ownDeltasByScan(c, v, maxEntries); !reflect.DeepEqual(got, want) {
			t.Fatalf("OwnDeltas(%d, %d) = %v, want %v", v, maxEntries, got, want)
		}
	})
}

// ownDeltasByScan is OwnDeltas by a scan of every counter changed after
// v, of any region.
func ownDeltasByScan(c *Counters, v uint64, max int) []Delta {
	from := min(v, c.Version())
	var changed []*entry
	for e := range c.entries() {
		if s := c.slots(e)[c.self]; e.own > v && (s.p != 0 || s.n != 0) {
			changed = append(changed, e)
		}
	}
	if len(changed) == 0 {
		return []Delta{{Origin: c.Self(), From: from, To: c.Version()}}
	}
	if max <= 0 {
		max = len(changed)
	}
	slices.SortFunc(changed, func(a, b *entry) int { return cmp.Compare(a.own, b.own) })
	var out []Delta
	for start := 0; start < len(changed); start += max {
		part := slices.Clone(changed[start:min(len(changed), start+max)])
		to := part[len(part)-1].own
		if start+max >= len(changed) {
			to = c.Version()
		}
		slices.SortFunc(part, func(a, b *entry) int { return a.id.Compare(b.id) })
		d := Delta{Origin: c.Self(), From: from, To: to}
		for _, e := range part {
			s := c.slots(e)[c.self]
			d.Entries = append(d.Entries, Entry{ID: e.id, Slots: []Slot{{Region: c.Self(), P: s.p, N: s.n}}})
		}
		out = append(out, d)
		from = to
	}
	return out
}
