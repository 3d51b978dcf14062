package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// WatchdogWorkflow names. `flywheel up` runs it on a schedule per
// deployment (WatchdogScheduleID); `temporal schedule trigger` runs it now.
const (
	WatchdogWorkflowName = "WatchdogWorkflow"
	// WatchServingActivity re-measures the serving version and rolls back
	// (activities.Release implements it, next to the gates it shares code
	// with).
	WatchServingActivity = "WatchServing"
	// ServingChangedSignal tells a deployment's TrainingWorkflow that
	// something other than its own releases changed the serving version (a
	// watchdog rollback): training goes on from the new serving weights.
	ServingChangedSignal = "serving-changed"
)

// Watchdog verdicts.
const (
	WatchOK           = "ok"
	WatchRolledBack   = "rolled_back"
	WatchNotEvaluated = "not_evaluated"
)

// WatchdogScheduleID is the schedule that runs a deployment's watchdog.
func WatchdogScheduleID(deployment string) string { return "watchdog-" + deployment }

// WatchdogInput asks for one check of a deployment's serving version. The
// policy's AnchorBudget, Alpha, MaxSafetyDrop and MaxRewardDrop are the
// thresholds, the same the release gates use.
type WatchdogInput struct {
	Deployment string
	Policy     ReleasePolicy
}

// WatchdogResult is one check.
type WatchdogResult struct {
	Verdict string
	Serving string
	Anchor  string `json:",omitempty"`
	// RolledBackTo is the version serving after a rollback.
	RolledBackTo string `json:",omitempty"`
	Reason       string
	Metrics      map[string]float64
	// SyncError says why the serving engine could not be given what the
	// routes name before the check, or the rolled-back-to weights after a
	// rollback (the routes moved all the same).
	SyncError string `json:",omitempty"`
}

// watchdogChangeWeightSync: a rollback syncs the serving engine.
const watchdogChangeWeightSync = "watchdog-weight-sync"

// watchdogChangeResync: every check first gives the serving engine what
// the routes name, so an engine that restarted and lost its runtime
// adapters (vLLM keeps none) serves again within one watchdog period.
const watchdogChangeResync = "watchdog-resync-engine"

// ServingChanged is ServingChangedSignal's payload.
type ServingChanged struct {
	Version string
	Reason  string
}

// WatchdogWorkflow re-measures the serving version of a deployment after
// promotion: its held-out suite and safety suite (answered afresh) and its
// live reward, each against the anchor (the best version promoted on the
// held-out suite). A significant drop below the anchor, beyond what the
// release policy allows, rolls the deployment back to the anchor and
// tells the training loop to go on from there. The decision is this run's
// result and search attributes (FlywheelDecision 'rollback' or 'noop').
func WatchdogWorkflow(ctx workflow.Context, in WatchdogInput) (WatchdogResult, error) {
	if in.Deployment == "" {
		return WatchdogResult{}, temporal.NewNonRetryableApplicationError("watchdog needs a Deployment", "BadInput", nil)
	}
	in.Policy = in.Policy.WithDefaults()
	_ = workflow.UpsertTypedSearchAttributes(ctx, DeploymentKey.ValueSet(in.Deployment))
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
		var out SyncWeightsOutput
		sctx := workflow.WithRetryPolicy(weightSyncCtx(actx), temporal.RetryPolicy{MaximumAttempts: 1})
		if err := workflow.ExecuteActivity(sctx, SyncWeightsActivity, SyncWeightsInput{Deployment: in.Deployment}).Get(ctx, &out); err != nil {
			resyncErr = err.Error()
			workflow.GetLogger(ctx).Warn("engine not resynced before the check", "deployment", in.Deployment, "error", err)
		} else if len(out.Loaded) > 0 {
			// A restarted engine, or a release's candidate routed a
			// moment before its own sync loaded it.
			workflow.GetLogger(ctx).Info("loaded routed versions the engine lacked", "deployment", in.Deployment, "loaded", out.Loaded)
		}
	}
	var res WatchdogResult
	if err := workflow.ExecuteActivity(actx, WatchServingActivity, in).Get(ctx, &res); err != nil {
		return res, fmt.Errorf("watch serving version: %w", err)
	}
	res.SyncError = resyncErr
	decision, now := "noop", res.Serving
	if res.Verdict == WatchRolledBack {
		decision, now = "rollback", res.RolledBackTo
		// The training loop may not run (a deployment trained elsewhere):
		// the rollback stands either way.
		err := workflow.SignalExternalWorkflow(ctx, TrainingWorkflowID(in.Deployment), "", ServingChangedSignal,
			ServingChanged{Version: res.RolledBackTo, Reason: res.Reason}).Get(ctx, nil)
		if err != nil {
			workflow.GetLogger(ctx).Info("no training loop to tell about the rollback", "deployment", in.Deployment, "error", err)
		}
		if workflow.GetVersion(ctx, watchdogChangeWeightSync, workflow.DefaultVersion, 1) >= 1 {
			// The routes name the anchor now. An engine that holds one
			// version in place (SGLang) must be given its weights; an
			// adapter engine (vLLM) has the anchor loaded already, and the
			// next release's settle unloads the abandoned line.
			var out SyncWeightsOutput
			if err := workflow.ExecuteActivity(weightSyncCtx(actx), SyncWeightsActivity, SyncWeightsInput{Deployment: in.Deployment}).Get(ctx, &out); err != nil {
				res.SyncError = err.Error()
				workflow.GetLogger(ctx).Error("engine not synced to the rollback", "deployment", in.Deployment, "version", res.RolledBackTo, "error", err)
			}
		}
	}
	_ = workflow.UpsertTypedSearchAttributes(ctx, DecisionKey.ValueSet(decision), ModelVersionKey.ValueSet(now))
	return res, nil
}
