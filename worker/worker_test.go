package worker_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/worker"
	"github.com/flywheel-ai/flywheel/workflows"
)

// TestPingWorkflowOnRealDevServer runs a workflow through a worker polling
// a real Temporal dev server, with its activity reading a real Postgres.
func TestPingWorkflowOnRealDevServer(t *testing.T) {
	pool := testenv.Pool(t)
	c := testenv.Temporal(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ping := &activities.Ping{DB: pool, Worker: "test-host", Compute: "cpu"}
	done := make(chan error, 1)
	go func() {
		done <- worker.Run(ctx, c, map[string]worker.Registrar{
			flow.TaskQueue: func(r tworker.Registry) {
				r.RegisterWorkflowWithOptions(workflows.PingWorkflow, workflow.RegisterOptions{Name: flow.PingWorkflowName})
				r.RegisterActivity(ping.Ping)
			},
		}, slog.New(slog.DiscardHandler))
	}()

	runCtx, runCancel := context.WithTimeout(ctx, time.Minute)
	defer runCancel()
	run, err := c.ExecuteWorkflow(runCtx, client.StartWorkflowOptions{ID: "ping-test", TaskQueue: flow.TaskQueue},
		flow.PingWorkflowName, flow.PingInput{Note: "hello"})
	require.NoError(t, err)
	var out flow.PingOutput
	require.NoError(t, run.Get(runCtx, &out))
	require.Equal(t, "hello", out.Note)
	require.Equal(t, "test-host", out.Worker)
	require.Contains(t, out.Postgres, ".", "a server version such as 15.18")

	cancel()
	require.NoError(t, <-done)
}

func TestSetupIsIdempotentAndRegistersSearchAttributes(t *testing.T) {
	c := testenv.Temporal(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, worker.Setup(ctx, c, testenv.TemporalNamespace))
	require.NoError(t, worker.Setup(ctx, c, testenv.TemporalNamespace), "second setup is a no-op")

	// A namespace that does not exist yet is created with the attributes.
	require.NoError(t, worker.Setup(ctx, c, "fresh-ns"))
	var attrs *operatorservice.ListSearchAttributesResponse
	require.Eventually(t, func() bool {
		var err error
		attrs, err = c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: "fresh-ns"})
		return err == nil && len(attrs.GetCustomAttributes()) >= len(flow.SearchAttributes())
	}, 30*time.Second, 200*time.Millisecond)
	for name, typ := range flow.SearchAttributes() {
		require.Equal(t, typ, attrs.GetCustomAttributes()[name], name)
	}
}

func TestRunWithoutQueuesIsAnError(t *testing.T) {
	require.Error(t, worker.Run(context.Background(), nil, nil, slog.New(slog.DiscardHandler)))
}
