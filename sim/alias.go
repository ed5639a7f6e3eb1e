package sim

import "math/rand/v2"

// alias draws from a discrete distribution in constant time: Vose's alias
// method. Column i is drawn with chance 1/n, and kept with chance prob[i],
// else its alias other[i] is taken.
type alias struct {
	prob  []float64
	other []int32
}

// newAlias returns the table for weights w (not all zero; at most 2³¹).
func newAlias(w []float64) *alias {
	n := len(w)
	a := &alias{prob: make([]float64, n), other: make([]int32, n)}
	total := 0.0
	for _, x := range w {
		total += x
	}
	scaled := make([]float64, n)
	var small, large []int32
	for i, x := range w {
		scaled[i] = x * float64(n) / total
		if scaled[i] < 1 {
			small = append(small, int32(i))
		} else {
			large = append(large, int32(i))
		}
	}
	for len(small) > 0 && len(large) > 0 {
		s, l := small[len(small)-1], large[len(large)-1]
		small = small[:len(small)-1]
		a.prob[s], a.other[s] = scaled[s], l
		if scaled[l] -= 1 - scaled[s]; scaled[l] < 1 {
			large = large[:len(large)-1]
			small = append(small, l)
		}
	}
	// What is left is 1 but for rounding.
	for _, i := range large {
		a.prob[i] = 1
	}
	for _, i := range small {
		a.prob[i] = 1
	}
	return a
}

func (a *alias) draw(r *rand.Rand) int {
	u := r.Float64() * float64(len(a.prob))
	i := min(int(u), len(a.prob)-1)
	if u-float64(i) < a.prob[i] {
		return i
	}
	return int(a.other[i])
}
