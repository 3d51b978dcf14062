package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/stretchr/testify/require"
)

// TestBenchRuns checks the benchmark harness end to end at a tiny size; the
// figures themselves are printed by `flywheel bench sandbox`, not asserted.
func TestBenchRuns(t *testing.T) {
	cli := dockerClient(t)
	baseImage(t, cli)
	var progress strings.Builder
	res, err := sandbox.RunBench(context.Background(), cli, sandbox.BenchConfig{
		Provisions: 1, PoolSize: 2, Concurrent: 3, Rounds: 2, Hold: 100 * time.Millisecond, Resets: 2,
		AgentExecs: 5, DockerExecs: 2, Forks: 2, Progress: &progress,
	})
	require.NoError(t, err)
	require.Equal(t, 6, res.ReadySamples)
	require.Equal(t, 3, res.ReadyConcurrent)
	// How many sandboxes were alive at once depends on how fast the pool
	// refills on a loaded machine; that it never exceeds the rollouts plus
	// the pool does not.
	require.Positive(t, res.MaxLive)
	require.LessOrEqual(t, res.MaxLive, 3+2)
	require.Positive(t, res.ReadyVsCreate)
	require.Positive(t, res.ResetSpeedup)
	require.Equal(t, 2, res.Forks)
	require.Positive(t, res.ExecAgentP50MS)
	require.Positive(t, res.ExecDockerP50MS)
	require.Contains(t, progress.String(), "ready (3 rollouts in flight, pool of 2 refilling, released sandboxes reset and recycled)")
	require.Equal(t, 6, res.Recycled+res.Removed, "every release is recycled or removed")
	require.Positive(t, res.Recycled, "three held at once: the queue keeps three")
}
