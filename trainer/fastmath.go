package trainer

import "math"

// expf is e^x in float32 with a relative error below 2e-7: a degree-6
// polynomial after reducing x by multiples of ln 2. The activations call it
// millions of times per step, where math.Exp's float64 path showed up at a
// quarter of the step time.
func expf(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375
		ln2lo = -2.12194440e-4
	)
	if x > 88 {
		return float32(math.Inf(1))
	}
	if x < -87 {
		return 0
	}
	h := float32(0.5)
	if x < 0 {
		h = -0.5
	}
	n := float32(int32(x*log2e + h)) // round to nearest: |r| ≤ ln2/2
	r := x - n*ln2hi - n*ln2lo
	p := float32(1.0 / 720)
	p = p*r + 1.0/120
	p = p*r + 1.0/24
	p = p*r + 1.0/6
	p = p*r + 0.5
	p = p*r + 1
	p = p*r + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// tanhf is tanh through expf, exact enough for GELU and its derivative.
func tanhf(x float32) float32 {
	if x > 9 {
		return 1
	}
	if x < -9 {
		return -1
	}
	e := expf(2 * x)
	return (e - 1) / (e + 1)
}
