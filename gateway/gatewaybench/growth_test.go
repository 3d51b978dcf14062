package gatewaybench

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
)

// TestSessionGrowthStoresEachByteOnce runs `flywheel bench session-growth`
// small: through an upstream in vLLM's dialect, a session's later turns
// store only what they add, so the session stores about what it holds.
func TestSessionGrowthStoresEachByteOnce(t *testing.T) {
	res, err := RunGrowth(context.Background(), GrowthConfig{Pool: testenv.Pool(t), Turns: 6, TurnKB: 4, Out: io.Discard})
	require.NoError(t, err)
	require.Len(t, res.PerTurn, 6)
	require.Less(t, res.Ratio, 1.05, "stored ÷ unique")
	last, second := res.PerTurn[5], res.PerTurn[1]
	require.Less(t, last.StoredBytes, 2*second.StoredBytes, "turn 6 stores about what turn 2 does, not the conversation so far")
}
