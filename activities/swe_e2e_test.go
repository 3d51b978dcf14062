package activities_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tclient "go.temporal.io/sdk/client"
	tworker "go.temporal.io/sdk/worker"

	fwworker "github.com/flywheel-ai/flywheel/worker"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/sandbox/sandboxtest"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent/sweagenttest"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/workflows"
)

// TestSWERolloutEndToEnd is the whole path with every real component that
// runs here: a Temporal dev server and worker run SWERolloutWorkflow; the
// built-in agent works in a Docker sandbox of a shipped task and calls the
// real gateway (on a real Postgres), whose upstream is the fixture model
// (a deterministic scripted stand-in for an LLM); hidden tests grade the
// sandbox; the pass rate lands in Postgres as the session's final reward.
func TestSWERolloutEndToEnd(t *testing.T) {
	tc := testenv.Temporal(t)
	pool := testenv.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	tk, err := tasks.Find("word-count")
	require.NoError(t, err)
	fixture := &sweagenttest.FixtureModel{Script: sweagenttest.SolveScript(tk.Solution)}
	upstream := httptest.NewServer(fixture)
	t.Cleanup(upstream.Close)

	cfg := config.Default().Gateway
	cfg.UpstreamURL = upstream.URL + "/v1"
	cfg.UpstreamModels = []string{"fixture"}
	cfg.UpstreamRetries = 0
	cfg.RateLimitRPS = 0
	gw, err := gateway.New(cfg, gateway.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	gwSrv := httptest.NewServer(gw.Handler())
	t.Cleanup(func() { gwSrv.Close(); gw.Close() })
	require.NoError(t, store.EnsureTenant(ctx, pool, "acme"))
	key, err := store.CreateKey(ctx, pool, "acme", "", "swe e2e")
	require.NoError(t, err)

	cli := sandboxtest.Docker(t)
	// Built the way a worker builds it.
	a, closeSWE, err := activities.NewSWEActivities(ctx, activities.SWEConfig{GatewayURL: gwSrv.URL, APIKey: key, Model: "fixture", PoolSize: 1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, closeSWE(context.Background())) })
	w := tworker.New(tc, flow.SWETaskQueue, tworker.Options{})
	workflows.RegisterSWEWorkflows(w)
	fwworker.RegisterSWE(w, a)
	require.NoError(t, w.Start())
	t.Cleanup(w.Stop)

	run, err := tc.ExecuteWorkflow(ctx, tclient.StartWorkflowOptions{ID: "swe-rollout-it", TaskQueue: flow.SWETaskQueue},
		flow.SWERolloutWorkflowName, flow.SWERolloutInput{TaskID: tk.ID})
	require.NoError(t, err)
	var out flow.SWERolloutResult
	require.NoError(t, run.Get(ctx, &out))
	require.Equal(t, sweagent.StopSubmitted, out.StopReason)
	require.True(t, out.Resolved)
	require.Equal(t, 1.0, out.Reward)

	// Every model call was captured under the rollout's session...
	var calls int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM interactions WHERE session_id = $1`, out.SessionID).Scan(&calls))
	require.Equal(t, len(fixture.Script), calls)
	// ...and the grade is the session's final reward.
	var value float64
	var source string
	var final bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT value, source, final FROM rewards WHERE session_id = $1`, out.SessionID).Scan(&value, &source, &final))
	require.Equal(t, 1.0, value)
	require.Equal(t, flow.SWERewardSource, source)
	require.True(t, final)
	requireRemoved(t, cli, out.SandboxID)
	testenv.RecordHistory(t, tc, run.GetID(), filepath.Join("..", "workflows", "testdata", "swe_rollout_e2e.history.json"))
}
