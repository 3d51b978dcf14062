package workflows

import (
	"context"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// TestWatchdogTellsTheTrainingLoopAboutARollback: each check first resyncs
// the serving engine (one that restarted gets its versions back), and a
// rollback tells the training loop and syncs the engine to the anchor.
func TestWatchdogTellsTheTrainingLoopAboutARollback(t *testing.T) {
	for _, verdict := range []string{flow.WatchRolledBack, flow.WatchOK} {
		var ts testsuite.WorkflowTestSuite
		env := newWorkflowEnv(&ts)
		env.RegisterWorkflowWithOptions(WatchdogWorkflow, workflow.RegisterOptions{Name: flow.WatchdogWorkflowName})
		var got flow.WatchdogInput
		env.RegisterActivityWithOptions(func(ctx context.Context, in flow.WatchdogInput) (flow.WatchdogResult, error) {
			got = in
			res := flow.WatchdogResult{Verdict: verdict, Serving: "dep@v7", Anchor: "dep@v4", Reason: "held-out suite dropped"}
			if verdict == flow.WatchRolledBack {
				res.RolledBackTo = "dep@v4"
			}
			return res, nil
		}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.WatchServing)})
		var synced []flow.SyncWeightsInput
		env.RegisterActivityWithOptions(func(ctx context.Context, in flow.SyncWeightsInput) (flow.SyncWeightsOutput, error) {
			synced = append(synced, in)
			return flow.SyncWeightsOutput{Synced: true, Loaded: []string{"dep@v4"}}, nil
		}, activity.RegisterOptions{Name: flow.ActivityName(aRelease.SyncWeights)})
		signalled := 0
		env.OnSignalExternalWorkflow(mock.Anything, flow.TrainingWorkflowID("dep"), "", flow.ServingChangedSignal, mock.Anything).
			Return(func(namespace, id, runID, name string, arg any) error {
				signalled++
				require.Equal(t, flow.ServingChanged{Version: "dep@v4", Reason: "held-out suite dropped"}, arg)
				return nil
			})
		env.ExecuteWorkflow(WatchdogWorkflow, flow.WatchdogInput{Deployment: "dep"})
		require.NoError(t, env.GetWorkflowError())
		var res flow.WatchdogResult
		require.NoError(t, env.GetWorkflowResult(&res))
		require.Equal(t, verdict, res.Verdict)
		require.Equal(t, 0.05, got.Policy.AnchorBudget, "the activity gets the policy with its defaults")
		if verdict == flow.WatchRolledBack {
			require.Equal(t, 1, signalled)
			require.Equal(t, []flow.SyncWeightsInput{{Deployment: "dep"}, {Deployment: "dep"}}, synced,
				"the engine is given what the routes name before the check, and the anchor's weights after the rollback")
		} else {
			require.Zero(t, signalled)
			require.Equal(t, []flow.SyncWeightsInput{{Deployment: "dep"}}, synced, "a restarted engine is reloaded before the check")
		}
	}
}

func TestWatchdogNeedsADeployment(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := newWorkflowEnv(&ts)
	env.ExecuteWorkflow(WatchdogWorkflow, flow.WatchdogInput{})
	require.ErrorContains(t, env.GetWorkflowError(), "needs a Deployment")
}
