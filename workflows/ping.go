package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// PingWorkflow runs one activity that touches Postgres and returns what it
// saw: `flywheel up` uses it to prove the worker serves, and it is the
// smallest end-to-end check of the worker wiring.
func PingWorkflow(ctx workflow.Context, in flow.PingInput) (flow.PingOutput, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond,
			MaximumAttempts: 3,
		},
	})
	var out flow.PingOutput
	if err := workflow.ExecuteActivity(ctx, aPing.Ping, in).Get(ctx, &out); err != nil {
		return flow.PingOutput{}, err
	}
	return out, nil
}
