package workflows_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/workflows"
)

// TestReplaySWEHistories replays SWE rollout and group histories recorded by
// activities/swe_e2e_test.go and swe_test.go on a real dev server
// (FLYWHEEL_RECORD_HISTORIES=1 rewrites them) against today's code. The
// recorded workflow ids are fixed there, because child ids derive from them.
func TestReplaySWEHistories(t *testing.T) {
	for file, id := range map[string]string{
		"swe_rollout_e2e.history.json": "swe-rollout-it",
		"swe_group.history.json":       "swe-group-it",
	} {
		t.Run(file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", file))
			require.NoError(t, err)
			defer f.Close()
			h, err := client.HistoryFromJSON(f, client.HistoryJSONOptions{})
			require.NoError(t, err)
			r := tworker.NewWorkflowReplayer()
			workflows.RegisterSWEWorkflows(r)
			require.NoError(t, r.ReplayWorkflowHistoryWithOptions(tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)), h,
				tworker.ReplayWorkflowHistoryOptions{OriginalExecution: workflow.Execution{ID: id}}))
		})
	}
}
