package workflows_test

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	tlog "go.temporal.io/sdk/log"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/workflows"
)

// TestReplayCommittedHistories replays histories recorded from the
// integration tests (FLYWHEEL_RECORD_HISTORIES=1 rewrites them) against
// today's workflow code: a change that alters the commands an existing
// history expects fails here and needs workflow.GetVersion.
func TestReplayCommittedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*_history.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no committed histories in testdata")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := tworker.NewWorkflowReplayer()
			for name, fn := range map[string]any{
				flow.SessionWorkflowName:   workflows.SessionWorkflow,
				flow.ReleaseWorkflowName:   workflows.ReleaseWorkflow,
				flow.TrainingWorkflowName:  workflows.TrainingWorkflow,
				flow.EvolutionWorkflowName: workflows.EvolutionWorkflow,
				flow.ForgetWorkflowName:    workflows.ForgetWorkflow,
				flow.WatchdogWorkflowName:  workflows.WatchdogWorkflow,
			} {
				r.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: name})
			}
			require.NoError(t, r.ReplayWorkflowHistoryFromJSONFile(tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)), f))
		})
	}
}
