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
}

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
	return out, nil
}
