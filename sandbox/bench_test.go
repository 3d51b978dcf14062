package sandbox_test

import (
	"context"
	"strings"
	"testing"

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
		Provisions: 1, PoolSize: 2, AcquireRounds: 1, AgentExecs: 5, DockerExecs: 2, Forks: 2, Concurrent: 2, Progress: &progress,
	})
	require.NoError(t, err)
	require.Equal(t, 2, res.AcquireSamples)
	require.Equal(t, 2, res.Forks)
	require.Equal(t, 2, res.MaxConcurrent)
	require.Positive(t, res.ExecAgentP50MS)
	require.Positive(t, res.ExecDockerP50MS)
	require.Contains(t, progress.String(), "acquire (warm pool of 2)")
}
