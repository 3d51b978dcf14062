package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// forgetChangeRestart tells the training loops to drop retired weights.
const forgetChangeRestart = "forget-restarts-training"

// ForgetWorkflow retires every model version trained on forgotten data,
// found through lineage, rolling serving back to the newest clean version.
func ForgetWorkflow(ctx workflow.Context, in flow.ForgetInput) (flow.ForgetResult, error) {
	if in.RequestID <= 0 {
		return flow.ForgetResult{}, temporal.NewNonRetryableApplicationError("forget needs a RequestID", "BadInput", nil)
	}
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: time.Minute,
			MaximumAttempts: 20, NonRetryableErrorTypes: []string{"BadInput"}},
	})
	var out flow.ForgetResult
	if err := workflow.ExecuteActivity(ctx, aForget.RetireForgotten, in).Get(ctx, &out); err != nil {
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
		err := workflow.SignalExternalWorkflow(ctx, flow.TrainingWorkflowID(d), "", flow.ServingChangedSignal,
			flow.ServingChanged{Version: out.Restart[d], Reason: fmt.Sprintf("forget request %d", in.RequestID)}).Get(ctx, nil)
		if err != nil {
			workflow.GetLogger(ctx).Info("no training loop to restart after the forget", "deployment", d, "error", err)
		}
	}
	return out, nil
}
