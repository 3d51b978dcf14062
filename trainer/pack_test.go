package trainer

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// groupBatch builds groups of size g whose members share the first
// shared tokens and then diverge for tail tokens (the completion).
func groupBatch(rng *rand.Rand, groups, g, shared, tail int) *Batch {
	b := &Batch{}
	for gi := 0; gi < groups; gi++ {
		prefix := make([]int, shared)
		for i := range prefix {
			prefix[i] = rng.IntN(256)
		}
		for j := 0; j < g; j++ {
			n := shared + tail
			s := Sample{GroupID: string(rune('a' + gi)), TaskID: "task", TokenIDs: append([]int{}, prefix...),
				LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n), Reward: float64(rng.IntN(2))}
			for t := 0; t < tail; t++ {
				s.TokenIDs = append(s.TokenIDs, rng.IntN(VocabSize))
			}
			for t := shared; t < n; t++ {
				s.LossMask[t] = 1
				s.Logprobs[t] = -float32(rng.Float64()*3 + 2)
			}
			b.Samples = append(b.Samples, s)
		}
	}
	return b
}

func TestPackedLossAndGradientEqualUnpacked(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 64, Layers: 2, Heads: 2, DModel: 16, FFN: 32}, 9)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(4, 4))
	b := groupBatch(rng, 2, 4, 12, 6)
	// A multi-turn sample: its first turn is another sample's whole sequence,
	// with a loss mask on a token inside the shared part too.
	first := b.Samples[0]
	mt := Sample{TaskID: "mt", TokenIDs: append(append([]int{}, first.TokenIDs...), 5, 6, 7, 8),
		Reward: 1}
	n := len(mt.TokenIDs)
	mt.LossMask, mt.Logprobs, mt.Versions = make([]uint8, n), make([]float32, n), make([]int64, n)
	for _, t := range []int{len(first.TokenIDs) - 2, n - 2, n - 1} {
		mt.LossMask[t], mt.Logprobs[t] = 1, -2.5
	}
	b.Samples = append(b.Samples, mt)

	run := func(noPacking bool) (StepResult, []float32) {
		l, err := NewLocal(m, 0, Config{NoPacking: noPacking, Loss: LossConfig{KLCoef: 0.1, KPop: true, KPopPhi: 0.5}}, nil)
		require.NoError(t, err)
		samples := append([]Sample{}, b.Samples...)
		_, err = ComputeAdvantages(samples, l.cfg.Advantage, l.base)
		require.NoError(t, err)
		var res StepResult
		pb, err := l.packBatch(samples)
		require.NoError(t, err)
		grad, err := l.lossAndGrad(context.Background(), l.cfg.Loss, samples, pb, nil, 1, false, &res)
		require.NoError(t, err)
		return res, grad
	}
	packed, gp := run(false)
	plain, gu := run(true)
	require.Less(t, packed.UniqueTokens, plain.UniqueTokens)
	require.Equal(t, plain.TotalTokens, plain.UniqueTokens)
	require.InDelta(t, plain.Loss, packed.Loss, 1e-5)
	require.Equal(t, plain.TrainedTokens, packed.TrainedTokens)
	require.Equal(t, plain.KPopMasked, packed.KPopMasked)
	var maxAbs float32
	for i := range gu {
		if d := gu[i] - gp[i]; d > maxAbs || -d > maxAbs {
			maxAbs = max(d, -d)
		}
	}
	var norm float32
	for _, g := range gu {
		norm = max(norm, max(g, -g))
	}
	require.Greater(t, norm, float32(1e-3), "the gradient must not be trivially zero")
	require.Less(t, maxAbs, 1e-5*max(1, norm), "packed and unpacked gradients differ")
}

func TestBuildPackSharesPrefixes(t *testing.T) {
	pk, err := BuildPack([][]int{{1, 2, 3}, {1, 2, 4}, {5}, {1, 2, 3, 9}}, true)
	require.NoError(t, err)
	require.Equal(t, 6, pk.NumNodes()) // 1,2,3,4,9 and 5
	require.Equal(t, 11, pk.NumSampleTokens())
	require.Len(t, pk.Trees, 2)
	require.Equal(t, pk.SampleNodes[0][:2], pk.SampleNodes[1][:2])
	require.Equal(t, pk.SampleNodes[0], pk.SampleNodes[3][:3])
	for s, nodes := range pk.SampleNodes {
		for i, n := range nodes {
			require.Equal(t, i, pk.Pos[n], "sample %d token %d", s, i)
		}
	}
	// Segments: the shared 1,2; then 3,9 and 4 below it; the lone 5.
	require.Equal(t, []segment{
		{Start: 0, L: 2, P: 2},
		{Start: 2, L: 2, Path: [][2]int{{0, 2}}, P: 4},
		{Start: 4, L: 1, Path: [][2]int{{0, 2}}, P: 3},
		{Start: 5, L: 1, P: 1},
	}, pk.Segs)
	_, err = BuildPack([][]int{{}}, true)
	require.Error(t, err)
}
