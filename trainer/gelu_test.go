package trainer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGeluForward: the batched GELU (vectorized where cgo builds it)
// agrees with the scalar geluT and gelu, from the tails to zero.
func TestGeluForward(t *testing.T) {
	var u []float32
	for x := float32(-12); x < 12; x += 0.0007 {
		u = append(u, x)
	}
	u = append(u, 0, -0, 1e-30, -1e-30, 40, -40, 1e6, -1e6)
	tg, g := make([]float32, len(u)), make([]float32, len(u))
	geluForward(u, tg, g)
	for i, v := range u {
		z := geluC * (float64(v) + 0.044715*float64(v)*float64(v)*float64(v))
		require.InDelta(t, math.Tanh(z), float64(tg[i]), 4e-7, "tanh at %v", v)
		require.InDelta(t, float64(geluT(v)), float64(tg[i]), 4e-7, "against the scalar at %v", v)
		require.InDelta(t, float64(gelu(v, geluT(v))), float64(g[i]), 4e-7*math.Max(1, math.Abs(float64(v))), "gelu at %v", v)
	}
}

func BenchmarkGelu(b *testing.B) {
	u := make([]float32, 1<<16)
	for i := range u {
		u[i] = float32(rand.NormFloat64())
	}
	tg, g := make([]float32, len(u)), make([]float32, len(u))
	b.Run("batched", func(b *testing.B) {
		b.SetBytes(int64(4 * len(u)))
		for b.Loop() {
			geluForward(u, tg, g)
		}
	})
	b.Run("scalar", func(b *testing.B) {
		b.SetBytes(int64(4 * len(u)))
		for b.Loop() {
			for i, v := range u {
				tg[i] = geluT(v)
				g[i] = gelu(v, tg[i])
			}
		}
	})
}
