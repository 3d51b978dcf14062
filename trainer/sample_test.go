package trainer

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// The sampler's behaviour log-probs must be what the trainer recomputes for
// the same tokens, or every importance ratio would be off from the start.
func TestDecodeLogprobsMatchTrainingForward(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 64, Layers: 2, Heads: 2, DModel: 16, FFN: 32}, 5)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	temp := 0.8
	// Repeated prompts share one prefill (a GRPO group).
	prompts := [][]int{{TokImStart, 'a', 'b', 'c'}, {TokImStart, 'x'}, {TokImStart}, {TokImStart, 'a', 'b', 'c'}, {TokImStart, 'x'}}
	gens, err := m.Generate(context.Background(), prompts, SampleOptions{Temperature: &temp, MaxTokens: 20}, rng, nil)
	require.NoError(t, err)
	for _, g := range gens {
		require.Len(t, g.Logprobs, len(g.IDs))
		seq := append(append([]int{}, g.PromptIDs...), g.IDs...)
		pk, err := BuildPack([][]int{seq}, false)
		require.NoError(t, err)
		targets := pk.SampleNodes[0][len(g.PromptIDs):]
		st := m.forward(pk, targets, float32(temp))
		for i := range g.IDs {
			require.InDelta(t, st.TargetLogp[i], g.Logprobs[i], 1e-4)
		}
	}
}

func TestGenerateRejectsBadInput(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 8, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 5)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	ctx := context.Background()
	_, err = m.Generate(ctx, [][]int{{}}, SampleOptions{}, rng, nil)
	require.ErrorContains(t, err, "empty")
	_, err = m.Generate(ctx, [][]int{{1, 2, 3, 4, 5, 6, 7, 8}}, SampleOptions{}, rng, nil)
	require.ErrorContains(t, err, "context")
	_, err = m.Generate(ctx, [][]int{{9999}}, SampleOptions{}, rng, nil)
	require.ErrorContains(t, err, "vocabulary")
	bad := -1.0
	_, err = m.Generate(ctx, [][]int{{1}}, SampleOptions{Temperature: &bad}, rng, nil)
	require.ErrorContains(t, err, "temperature")
	gens, err := m.Generate(ctx, [][]int{{1, 2, 3}}, SampleOptions{MaxTokens: 100}, rng, nil)
	require.NoError(t, err)
	require.LessOrEqual(t, len(gens[0].PromptIDs)+len(gens[0].IDs), 8)
	require.Equal(t, "length", gens[0].Finish)
}
