package trainer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func tinyModel(t testing.TB, seed uint64) *Model {
	t.Helper()
	m, err := NewModel(ModelConfig{Context: 16, Layers: 2, Heads: 2, DModel: 8, FFN: 16}, seed)
	require.NoError(t, err)
	// Larger weights than the default init make every path matter in the check.
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range m.W {
		m.W[i] += float32(rng.NormFloat64() * 0.3)
	}
	return m
}

// weightedLogp is Σ c_i·log π(target_i), a loss whose gradient exercises the
// whole network; its derivative per target is just c_i.
func weightedLogp(m *Model, pk *Pack, targets []int, c []float32, temp float32) float64 {
	st := m.forward(pk, targets, temp)
	var s float64
	for i, lp := range st.TargetLogp {
		s += float64(c[i]) * float64(lp)
	}
	return s
}

func allTargets(pk *Pack) []int {
	var ts []int
	for n, p := range pk.Parent {
		if p >= 0 {
			ts = append(ts, n)
		}
	}
	return ts
}

func TestGradientMatchesFiniteDifferences(t *testing.T) {
	m := tinyModel(t, 1)
	seqs := [][]int{{1, 2, 3, 4, 5, 6}, {1, 2, 3, 9, 8}, {1, 2, 7}, {4, 4, 4, 4}}
	pk, err := BuildPack(seqs, true)
	require.NoError(t, err)
	targets := allTargets(pk)
	rng := rand.New(rand.NewPCG(3, 3))
	c := make([]float32, len(targets))
	for i := range c {
		c[i] = float32(rng.NormFloat64())
	}
	const temp = 0.7
	grad := make([]float32, len(m.W))
	m.forward(pk, targets, temp).backward(c, grad)

	// Check a sample of coordinates from every tensor.
	for _, s := range m.lay.Specs {
		for trial := 0; trial < 6; trial++ {
			i := s.Offset + rng.IntN(s.Size)
			if s.Name == "tok_emb" {
				i = s.Offset + seqs[trial%len(seqs)][1]*m.Config.DModel + rng.IntN(m.Config.DModel)
			}
			if s.Name == "pos_emb" {
				i = s.Offset + rng.IntN(5*m.Config.DModel)
			}
			orig := m.W[i]
			const eps = 2e-3
			m.W[i] = orig + eps
			up := weightedLogp(m, pk, targets, c, temp)
			m.W[i] = orig - eps
			down := weightedLogp(m, pk, targets, c, temp)
			m.W[i] = orig
			num := (up - down) / (2 * eps)
			tol := 2e-2 + 2e-2*math.Abs(num)
			require.InDelta(t, num, float64(grad[i]), tol, "param %s index %d", s.Name, i-s.Offset)
		}
	}
}
