package flow

import "github.com/flywheel-ai/flywheel/deployment"

// WatchdogWorkflow names. `flywheel up` runs it on a schedule per
// deployment (WatchdogScheduleID); `temporal schedule trigger` runs it now.
const (
	WatchdogWorkflowName = "WatchdogWorkflow"
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
	Policy     deployment.ReleasePolicy
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

// ServingChanged is ServingChangedSignal's payload.
type ServingChanged struct {
	Version string
	Reason  string
}
