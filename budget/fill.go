package budget

import "slices"

// waterFill shares total out among needs: every need is met up to a common
// level, the largest level the total allows, so that small needs are met
// in full and large ones equally. What is left when every need is met goes
// out in proportion to weights (evenly if they are all zero). The result
// sums to total, or less by rounding. Inputs are not changed.
func waterFill(needs, weights []float64, total float64) []float64 {
	n := len(needs)
	out := make([]float64, n)
	if n == 0 || total <= 0 {
		return out
	}
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case needs[a] < needs[b]:
			return -1
		case needs[a] > needs[b]:
			return 1
		}
		return 0
	})
	left := total
	for k, i := range order {
		level := left / float64(n-k)
		give := min(max(needs[i], 0), level)
		out[i] = give
		left -= give
	}
	if left <= 0 {
		return out
	}
	sum := 0.0
	for _, w := range weights {
		sum += max(w, 0)
	}
	for i := range out {
		if sum > 0 {
			out[i] += left * max(weights[i], 0) / sum
		} else {
			out[i] += left / float64(n)
		}
	}
	return out
}
