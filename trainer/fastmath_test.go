package trainer

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFastMathAccuracy(t *testing.T) {
	for x := float32(-87); x < 88; x += 0.0137 {
		want := math.Exp(float64(x))
		require.InEpsilon(t, want, float64(expf(x)), 3e-7, "exp(%v)", x)
	}
	for x := float32(-12); x < 12; x += 0.001 {
		require.InDelta(t, math.Tanh(float64(x)), float64(tanhf(x)), 3e-7, "tanh(%v)", x)
	}
	require.Zero(t, expf(-100))
	require.True(t, math.IsInf(float64(expf(100)), 1))
}
