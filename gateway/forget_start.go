package gateway

import (
	"context"
	"errors"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/flow"
)

const msgForgetStartFailed = "starting the forget workflow failed; versions not yet retired"

// ForgetStarter starts the workflow that finishes a forget request.
type ForgetStarter interface {
	StartForget(ctx context.Context, requestID int64) (workflowID string, err error)
}

// TemporalForgets starts workflows.ForgetWorkflow, one per request id (a
// repeated start of the same request is not an error).
type TemporalForgets struct {
	Client client.Client
}

// StartForget implements ForgetStarter.
func (t TemporalForgets) StartForget(ctx context.Context, requestID int64) (string, error) {
	id := flow.ForgetWorkflowID(requestID)
	_, err := t.Client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.TaskQueue},
		flow.ForgetWorkflowName, flow.ForgetInput{RequestID: requestID})
	var started *serviceerror.WorkflowExecutionAlreadyStarted
	if err != nil && !errors.As(err, &started) {
		return "", err
	}
	return id, nil
}
