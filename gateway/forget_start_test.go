package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/testenv"
)

// TestForgetStartsTheRetireWorkflow: POST /v1/forget deletes the data and
// starts, on a real Temporal dev server, the workflow that retires the
// versions trained on it.
func TestForgetStartsTheRetireWorkflow(t *testing.T) {
	c := testenv.Temporal(t)
	e := newEnv(t, envOpts{forgets: gateway.TemporalForgets{Client: c}})
	_, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"end_user": "dave"})
	st, _ := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("dave's data"))
	require.Equal(t, 200, st)

	st, res := e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"end_user": "dave"})
	require.Equal(t, 200, st, res)
	id := flow.ForgetWorkflowID(int64(res["forget_request_id"].(float64)))
	require.Equal(t, id, res["retire_workflow_id"])
	desc, err := c.DescribeWorkflowExecution(context.Background(), id, "")
	require.NoError(t, err)
	require.Equal(t, flow.ForgetWorkflowName, desc.GetWorkflowExecutionInfo().GetType().GetName())

	again, err := gateway.TemporalForgets{Client: c}.StartForget(context.Background(), int64(res["forget_request_id"].(float64)))
	require.NoError(t, err, "starting the same request twice is not an error")
	require.Equal(t, id, again)
}

type failingForgets struct{}

func (failingForgets) StartForget(context.Context, int64) (string, error) {
	return "", errors.New("temporal unavailable")
}

func TestForgetWithTemporalDownStillForgetsAndSaysWhatIsPending(t *testing.T) {
	e := newEnv(t, envOpts{forgets: failingForgets{}})
	_, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"end_user": "erin"})
	st, _ := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("erin's data"))
	require.Equal(t, 200, st)
	st, res := e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"end_user": "erin"})
	require.Equal(t, 200, st, res)
	require.Equal(t, fmt.Sprintf("run `flywheel forget retire %d`", int64(res["forget_request_id"].(float64))), res["retire_pending"])
	require.Equal(t, 0, e.countInteractions(), "the data is deleted whatever Temporal does")
}
