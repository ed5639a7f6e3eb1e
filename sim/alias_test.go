package sim

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The alias table draws each column as often as its weight says, and never
// one of no weight.
func TestAliasDrawsByWeight(t *testing.T) {
	w := []float64{1, 2, 3, 4, 0, 10, 0.5}
	a := newAlias(w)
	total := 0.0
	for _, x := range w {
		total += x
	}
	r := rand.New(rand.NewPCG(1, 2))
	const draws = 400_000
	got := make([]int, len(w))
	for range draws {
		got[a.draw(r)]++
	}
	for i, x := range w {
		want := x / total
		f := float64(got[i]) / draws
		if x == 0 && got[i] != 0 {
			t.Errorf("column %d has no weight, drawn %d times", i, got[i])
		}
		// Four standard deviations of a binomial share.
		if tol := 4 * math.Sqrt(want*(1-want)/draws); math.Abs(f-want) > tol+1e-9 {
			t.Errorf("column %d drawn %.4f of the time, want %.4f ± %.4f", i, f, want, tol)
		}
	}
}
