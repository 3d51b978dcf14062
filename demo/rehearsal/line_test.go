package rehearsal

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/trainer"
)

// batchFrom samples groups of two from m as version v, rewarding the first
// answer of each group, so every group has an advantage.
func batchFrom(t *testing.T, m *trainer.Model, v int64, seed uint64) *trainer.Batch {
	t.Helper()
	temp := 1.0
	prompts := [][]int{{1, 2, 3}, {1, 2, 3}, {4, 5, 6}, {4, 5, 6}}
	gens, err := m.Generate(context.Background(), prompts, trainer.SampleOptions{Temperature: &temp, MaxTokens: 4},
		rand.New(rand.NewPCG(seed, 1)), nil)
	require.NoError(t, err)
	b := &trainer.Batch{Temperature: temp}
	for i, g := range gens {
		s := rlSample(g, v)
		s.GroupID = strconv.Itoa(i / 2)
		if i%2 == 0 {
			s.Reward = 1
		}
		b.Samples = append(b.Samples, s)
	}
	return b
}

// TestLineTrainsAndGoesBack trains the line through the loopback Tinker
// trainer, full weights and LoRA: each step publishes a new version with
// new weights, samples too stale for η are dropped as the in-process
// trainer dropped them, and a restart from a saved state serves exactly
// the saved weights again.
func TestLineTrainsAndGoesBack(t *testing.T) {
	ctx := context.Background()
	for _, rank := range []int{0, 2} {
		t.Run("rank "+strconv.Itoa(rank), func(t *testing.T) {
			base, err := trainer.NewModel(trainer.ModelConfig{Context: 48, Layers: 1, Heads: 2, DModel: 16}, 3)
			require.NoError(t, err)
			cur := &latest{model: base}
			l, err := newLine(ctx, base, trainer.Config{Optim: trainer.OptimConfig{LR: 1e-2}, MaxStaleness: 1, MiniBatches: 2}, rank, 1, cur)
			require.NoError(t, err)
			defer l.close()

			saved, err := l.save(ctx)
			require.NoError(t, err)
			require.NoError(t, l.trainStep(ctx, batchFrom(t, base, 0, 1)))
			require.Equal(t, int64(1), cur.version)
			require.NotEqual(t, base.W, cur.model.W, "the step moved the weights")
			v1 := cur.model
			require.NoError(t, l.trainStep(ctx, batchFrom(t, v1, 1, 2)))
			require.Equal(t, int64(2), cur.version)

			// Staleness counts steps along the line: version 0 is two
			// behind, past η = 1.
			err = l.trainStep(ctx, batchFrom(t, base, 0, 3))
			require.ErrorContains(t, err, "staler than")

			require.NoError(t, l.restart(ctx, saved, 0, 0, false))
			back, err := l.tr.Weights(ctx)
			require.NoError(t, err)
			require.InDeltaSlice(t, base.W, back.W, 1e-6, "the restart went back to the saved weights")
			require.NoError(t, l.trainStep(ctx, batchFrom(t, base, 0, 4)), "back on v0, v0 is not stale")
			require.Equal(t, int64(3), cur.version, "ids move forward after a restart")

			back, err = l.tr.Weights(ctx)
			require.NoError(t, err)
			require.Equal(t, cur.model.W, back.W, "the published weights are the line's")

			// A rollback restarts from v0's state as a new id: v0's
			// samples are fresh there.
			require.NoError(t, l.restart(ctx, saved, 9, 0, true))
			require.NoError(t, l.trainStep(ctx, batchFrom(t, base, 0, 5)), "rolled back to v0, v0 is not stale")
		})
	}
}
