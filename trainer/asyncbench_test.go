package trainer

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAsyncBenchTrainsBothModes runs `flywheel bench async` small: both
// modes make their steps on samples within their staleness bound. Its
// figures are measured, not asserted.
func TestAsyncBenchTrainsBothModes(t *testing.T) {
	cfg := AsyncBenchConfig{Model: ModelConfig{Context: 64, Layers: 1, Heads: 1, DModel: 16}, Batch: 4, Slots: 3, Steps: 3, Eta: 2, MaxTokens: 24}
	res, err := RunAsyncBench(context.Background(), cfg, io.Discard)
	require.NoError(t, err)
	for _, m := range []AsyncModeResult{res.Sync, res.Async} {
		require.Equal(t, 3, m.Steps)
		require.Equal(t, 12, m.Samples)
		require.Positive(t, m.SamplesPerSec)
		require.Greater(t, m.TrainerBusy, 0.0)
		require.LessOrEqual(t, m.TrainerBusy, 1.0)
	}
	require.Zero(t, res.Sync.MeanStaleness, "sync trains only on its own weights' samples")
	require.Equal(t, 12, res.Sync.Generated)
	require.LessOrEqual(t, res.Async.MeanStaleness, 2.0)
	require.GreaterOrEqual(t, res.Async.Generated, 12)
	require.LessOrEqual(t, res.P50Tokens, res.P99Tokens)
	require.LessOrEqual(t, res.P99Tokens, 24)
}
