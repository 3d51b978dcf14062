package workflows

import (
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/flow"
)

// EvolutionSweepWorkflow starts an EvolutionWorkflow for every deployment
// with consented sessions in the window, each under its deployment's own
// workflow id, so a deployment whose last evolution still runs (its
// release may take a while) is skipped, not doubled. The runs it starts
// outlive it; it returns which deployments it started and skipped.
func EvolutionSweepWorkflow(ctx workflow.Context, in flow.EvolutionSweepInput) (flow.EvolutionSweepResult, error) {
	var res flow.EvolutionSweepResult
	if in.Window <= 0 {
		in.Window = time.Hour
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 5},
	})
	var deps []string
	if err := workflow.ExecuteActivity(actx, aEvolution.EvolvableDeployments, in.Window).Get(ctx, &deps); err != nil {
		return res, fmt.Errorf("list deployments to evolve: %w", err)
	}
	for _, dep := range deps {
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:            flow.EvolutionScheduleID(dep),
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
			ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
		})
		child := workflow.ExecuteChildWorkflow(cctx, EvolutionWorkflow, flow.EvolutionInput{
			Deployment: dep, Window: in.Window, Thresholds: in.Thresholds, Trigger: "schedule",
			Release: in.Release, Training: in.Training,
		})
		err := child.GetChildWorkflowExecution().Get(ctx, nil)
		var running *temporal.ChildWorkflowExecutionAlreadyStartedError
		switch {
		case errors.As(err, &running):
			res.Skipped = append(res.Skipped, dep)
		case err != nil:
			return res, fmt.Errorf("start the evolution of %s: %w", dep, err)
		default:
			res.Started = append(res.Started, dep)
		}
	}
	return res, nil
}
