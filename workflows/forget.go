package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// ForgetWorkflow names.
const (
	ForgetWorkflowName = "ForgetWorkflow"
	// RetireForgottenActivity is implemented by activities.Forget.
	RetireForgottenActivity = "RetireForgotten"
)

// ForgetWorkflowID is the workflow that finishes one forget request.
func ForgetWorkflowID(requestID int64) string { return fmt.Sprintf("forget-%d", requestID) }

// ForgetInput names a forget request the gateway recorded (POST /v1/forget
// deletes the data and writes forget_requests).
type ForgetInput struct {
	RequestID int64
}

// ForgetResult says which versions were retired and where each affected
// deployment was rolled back to ("" when no clean version was left).
type ForgetResult struct {
	Sessions    int
	Retired     []string
	Rollbacks   map[string]string
	Checkpoints int
	// Restart maps each deployment that had a retired version to the clean
	// version its TrainingWorkflow was told to go on from.
	Restart map[string]string `json:",omitempty"`
}

// forgetChangeRestart tells the training loops to drop retired weights.
const forgetChangeRestart = "forget-restarts-training"

// ForgetWorkflow retires every model version trained on forgotten data,
// found through lineage, rolling serving back to the newest clean version.
func ForgetWorkflow(ctx workflow.Context, in ForgetInput) (ForgetResult, error) {
	if in.RequestID <= 0 {
		return ForgetResult{}, temporal.NewNonRetryableApplicationError("forget needs a RequestID", "BadInput", nil)
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute,
			MaximumAttempts: 20, NonRetryableErrorTypes: []string{"BadInput"}},
	})
	var out ForgetResult
	if err := workflow.ExecuteActivity(ctx, RetireForgottenActivity, in).Get(ctx, &out); err != nil {
		return out, fmt.Errorf("retire versions: %w", err)
	}
	if workflow.GetVersion(ctx, forgetChangeRestart, workflow.DefaultVersion, 1) < 1 {
		return out, nil
	}
	// A trainer may hold weights of a retired candidate ahead of serving:
	// it must go on from the clean serving version, as after a rollback.
	for _, d := range workflow.DeterministicKeys(out.Restart) {
		if out.Restart[d] == "" {
			continue
		}
		err := workflow.SignalExternalWorkflow(ctx, TrainingWorkflowID(d), "", ServingChangedSignal,
			ServingChanged{Version: out.Restart[d], Reason: fmt.Sprintf("forget request %d", in.RequestID)}).Get(ctx, nil)
		if err != nil {
			workflow.GetLogger(ctx).Info("no training loop to restart after the forget", "deployment", d, "error", err)
		}
	}
	return out, nil
}
