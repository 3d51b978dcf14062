package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// watchdogChangeWeightSync: a rollback syncs the serving engine.
const watchdogChangeWeightSync = "watchdog-weight-sync"

// watchdogChangeResync: every check first gives the serving engine what
// the routes name, so an engine that restarted and lost its runtime
// adapters (vLLM keeps none) serves again within one watchdog period.
const watchdogChangeResync = "watchdog-resync-engine"

// WatchdogWorkflow re-measures the serving version of a deployment after
// promotion: its held-out suite and safety suite (answered afresh) and its
// live reward, each against the anchor (the best version promoted on the
// held-out suite). A significant drop below the anchor, beyond what the
// release policy allows, rolls the deployment back to the anchor and
// tells the training loop to go on from there. The decision is this run's
// result and search attributes (FlywheelDecision 'rollback' or 'noop').
func WatchdogWorkflow(ctx workflow.Context, in flow.WatchdogInput) (flow.WatchdogResult, error) {
	if in.Deployment == "" {
		return flow.WatchdogResult{}, temporal.NewNonRetryableApplicationError("watchdog needs a Deployment", "BadInput", nil)
	}
	in.Policy = in.Policy.WithDefaults()
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.DeploymentKey.ValueSet(in.Deployment))
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Minute,
		HeartbeatTimeout:    time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second, MaximumAttempts: 3,
			NonRetryableErrorTypes: []string{"BadInput", "BadData"},
		},
	})
	var resyncErr string
	if workflow.GetVersion(ctx, watchdogChangeResync, workflow.DefaultVersion, 1) >= 1 {
		// Cheap when nothing is missing: the engine lists what it holds
		// and nothing is loaded. One attempt: the next check tries again,
		// and an engine that is down leaves the check not evaluated.
		var out flow.SyncWeightsOutput
		sctx := workflow.WithRetryPolicy(weightSyncCtx(actx), temporal.RetryPolicy{MaximumAttempts: 1})
		if err := workflow.ExecuteActivity(sctx, aRelease.SyncWeights, flow.SyncWeightsInput{Deployment: in.Deployment}).Get(ctx, &out); err != nil {
			resyncErr = err.Error()
			workflow.GetLogger(ctx).Warn("engine not resynced before the check", "deployment", in.Deployment, "error", err)
		} else if len(out.Loaded) > 0 {
			// A restarted engine, or a release's candidate routed a
			// moment before its own sync loaded it.
			workflow.GetLogger(ctx).Info("loaded routed versions the engine lacked", "deployment", in.Deployment, "loaded", out.Loaded)
		}
	}
	var res flow.WatchdogResult
	if err := workflow.ExecuteActivity(actx, aRelease.WatchServing, in).Get(ctx, &res); err != nil {
		return res, fmt.Errorf("watch serving version: %w", err)
	}
	res.SyncError = resyncErr
	decision, now := "noop", res.Serving
	if res.Verdict == flow.WatchRolledBack {
		decision, now = "rollback", res.RolledBackTo
		// The training loop may not run (a deployment trained elsewhere):
		// the rollback stands either way.
		err := workflow.SignalExternalWorkflow(ctx, flow.TrainingWorkflowID(in.Deployment), "", flow.ServingChangedSignal,
			flow.ServingChanged{Version: res.RolledBackTo, Reason: res.Reason}).Get(ctx, nil)
		if err != nil {
			workflow.GetLogger(ctx).Info("no training loop to tell about the rollback", "deployment", in.Deployment, "error", err)
		}
		if workflow.GetVersion(ctx, watchdogChangeWeightSync, workflow.DefaultVersion, 1) >= 1 {
			// The routes name the anchor now. An engine that holds one
			// version in place (SGLang) must be given its weights; an
			// adapter engine (vLLM) has the anchor loaded already, and the
			// next release's settle unloads the abandoned line.
			var out flow.SyncWeightsOutput
			if err := workflow.ExecuteActivity(weightSyncCtx(actx), aRelease.SyncWeights, flow.SyncWeightsInput{Deployment: in.Deployment}).Get(ctx, &out); err != nil {
				res.SyncError = err.Error()
				workflow.GetLogger(ctx).Error("engine not synced to the rollback", "deployment", in.Deployment, "version", res.RolledBackTo, "error", err)
			}
		}
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, flow.DecisionKey.ValueSet(decision), flow.ModelVersionKey.ValueSet(now))
	return res, nil
}
