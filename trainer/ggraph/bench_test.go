package ggraph

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunBench runs the benchmark when FLYWHEEL_BENCH=1 (it takes minutes);
// it checks that both paths ran, never how fast.
func TestRunBench(t *testing.T) {
	if os.Getenv("FLYWHEEL_BENCH") != "1" {
		t.Skip("set FLYWHEEL_BENCH=1 to run the gorgonia vs hand-written benchmark")
	}
	var w io.Writer = os.Stdout
	res, err := RunBench(context.Background(), BenchConfig{}, w)
	require.NoError(t, err)
	require.Len(t, res.Cases, 3)
	for _, c := range res.Cases {
		require.Positive(t, c.HandTokensPerS)
		require.Positive(t, c.GraphTokensPerS)
	}
	t.Log(res.JSON())
}
