package tasks_test

import (
	"context"
	"strings"
	"testing"

	"github.com/flywheel-ai/flywheel/sandbox/sandboxtest"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/stretchr/testify/require"
)

// TestRolloutBenchRuns checks the rollout benchmark end to end on two tasks:
// the scripted agent's reference fixes resolve them. Timings are printed by
// `flywheel bench sandbox`, not asserted.
func TestRolloutBenchRuns(t *testing.T) {
	cli := sandboxtest.Docker(t)
	sandboxtest.PythonImage(t, cli)
	var progress strings.Builder
	res, err := tasks.RunRolloutBench(context.Background(), cli, tasks.RolloutBenchConfig{
		Concurrent: 2, Tasks: []string{"slugify", "median"}, Progress: &progress,
	})
	require.NoError(t, err)
	require.Equal(t, 2, res.Rollouts)
	require.Equal(t, 2, res.Resolved, "%s", progress.String())
	require.Positive(t, res.RolloutsPerMin)
	require.Positive(t, res.GradeP50MS)
	require.Contains(t, progress.String(), "rollouts (scripted agent, 2 tasks × 1, 2 at once)")
}
