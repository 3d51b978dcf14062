//go:build !cgo || noopenblas

package trainer

// geluForward sets t[i] = geluT(u[i]) and g[i] = gelu(u[i], t[i]); g may
// be u.
func geluForward(u, t, g []float32) {
	for i, v := range u {
		t[i] = geluT(v)
		g[i] = gelu(v, t[i])
	}
}
