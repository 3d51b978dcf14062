package trainer

import "math"

const rmsEps = 1e-5

// rmsNorm writes y = x / rms(x) · g for each row of x (rows×d) and keeps the
// inverse rms per row for the backward pass.
func rmsNorm(y, inv, x, g []float32, rows, d int) {
	for i := 0; i < rows; i++ {
		xr := x[i*d : i*d+d]
		var ss float32
		for _, v := range xr {
			ss += v * v
		}
		r := float32(1 / math.Sqrt(float64(ss/float32(d))+rmsEps))
		inv[i] = r
		yr := y[i*d : i*d+d]
		for j, v := range xr {
			yr[j] = v * r * g[j]
		}
	}
}

// rmsNormBack adds the gradient with respect to x into dx and to g into dg.
func rmsNormBack(dx, dg, dy, x, inv, g []float32, rows, d int) {
	for i := 0; i < rows; i++ {
		xr, dyr, r := x[i*d:i*d+d], dy[i*d:i*d+d], inv[i]
		var dot float32
		for j := range xr {
			a := dyr[j] * g[j]
			dot += a * xr[j]
			dg[j] += dyr[j] * xr[j] * r
		}
		c := r * r * dot / float32(d)
		dxr := dx[i*d : i*d+d]
		for j := range xr {
			dxr[j] += r * (dyr[j]*g[j] - xr[j]*c)
		}
	}
}

const geluC = 0.7978845608028654 // √(2/π)

// geluT is the tanh inside GELU, kept so backward need not recompute it.
func geluT(x float32) float32 { return tanhf(geluC * (x + 0.044715*x*x*x)) }

func gelu(x, t float32) float32 { return 0.5 * x * (1 + t) }

func geluGrad(x, t float32) float32 {
	return 0.5*(1+t) + 0.5*x*(1-t*t)*geluC*(1+3*0.044715*x*x)
}

// logSoftmaxRow writes log softmax(z·invT) into out.
func logSoftmaxRow(out, z []float32, invT float32) {
	mx := float32(math.Inf(-1))
	for _, v := range z {
		if v*invT > mx {
			mx = v * invT
		}
	}
	var s float64 // float32 terms (each within 2e-7), summed in float64
	for _, v := range z {
		s += float64(expf(v*invT - mx))
	}
	lse := mx + float32(math.Log(s))
	for i, v := range z {
		out[i] = v*invT - lse
	}
}

// softmaxPrefix turns the first k scores of row into probabilities and
// zeroes the rest (keys a query may not see).
func softmaxPrefix(row []float32, k int) {
	mx := float32(math.Inf(-1))
	for _, v := range row[:k] {
		if v > mx {
			mx = v
		}
	}
	var s float32
	for j, v := range row[:k] {
		e := expf(v - mx)
		row[j] = e
		s += e
	}
	inv := 1 / s
	for j := range row[:k] {
		row[j] *= inv
	}
	for j := k; j < len(row); j++ {
		row[j] = 0
	}
}
