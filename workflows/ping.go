package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// PingWorkflowName is the health-check workflow's registered name.
const PingWorkflowName = "PingWorkflow"

// PingInput asks a worker to prove it can reach its dependencies.
type PingInput struct {
	// Note is echoed back, so a caller can match answers to requests.
	Note string
}

// PingOutput is what the worker saw.
type PingOutput struct {
	Note string
	// Postgres is the database server version the activity read.
	Postgres string
	// Worker identifies the host and compute (GPU model or "cpu").
	Worker  string
	Compute string
}

// PingActivityName is the activity PingWorkflow runs.
const PingActivityName = "Ping"

// PingWorkflow runs one activity that touches Postgres and returns what it
// saw: `flywheel up` uses it to prove the worker serves, and it is the
// smallest end-to-end check of the worker wiring.
func PingWorkflow(ctx workflow.Context, in PingInput) (PingOutput, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond,
			MaximumAttempts: 3,
		},
	})
	var out PingOutput
	if err := workflow.ExecuteActivity(ctx, PingActivityName, in).Get(ctx, &out); err != nil {
		return PingOutput{}, err
	}
	return out, nil
}
