package demo_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/demo"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/inference/upstream"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestFetchStatusCountsReleases reads a real gateway's status before and
// after the control plane promotes one version, refuses another and rolls
// the serving one back, and counts the moves from its records.
func TestFetchStatusCountsReleases(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	cfg := config.Default().Gateway
	cfg.RateLimitRPS = 0
	srv, err := gateway.New(cfg, gateway.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	keys := map[string]string{}
	for _, tenant := range []string{"a", "b"} {
		require.NoError(t, store.EnsureTenant(ctx, pool, tenant))
		keys[tenant], err = store.CreateKey(ctx, pool, tenant, "", "test")
		require.NoError(t, err)
	}
	_, err = store.EnsurePolicyDeployment(ctx, pool, "dep", "dep@v0", "", upstream.Settings{BaseURL: "http://127.0.0.1:8000/v1"}, true)
	require.NoError(t, err)
	_, err = store.InsertInteraction(ctx, pool, &store.NewInteraction{TenantID: "a", SessionID: "s1", IdentityMode: "header",
		CompletionID: "c1", Protocol: "openai", Deployment: "dep", ModelVersion: "dep@v0", Request: json.RawMessage(`{}`), Status: "ok"})
	require.NoError(t, err)

	before, err := demo.FetchStatus(ctx, ts.URL+"/v1/", keys["a"], "dep")
	require.NoError(t, err)
	require.Len(t, before.Deployments, 1)
	require.Equal(t, "dep@v0", before.Deployments[0].ServingVersion)

	release := func(version, parent, status string) {
		run, err := store.ClaimBatch(ctx, pool, "dep", "run-"+version, 8, 10, 0)
		require.NoError(t, err)
		require.NoError(t, store.CommitTrainedRun(ctx, pool, store.TrainedRun{RunID: run.ID, Deployment: "dep", Version: version, Parent: parent}))
		rel, err := store.BeginRelease(ctx, pool, store.Release{Deployment: "dep", Layer: "weights", Candidate: version, WorkflowID: "rel-" + version})
		require.NoError(t, err)
		require.NoError(t, store.FinishRelease(ctx, pool, rel.ID, status, "test"))
	}
	release("dep@v1", "dep@v0", "promoted")
	release("dep@v2", "dep@v1", "rolled_back")
	_, err = store.RollbackTo(ctx, pool, "dep", "dep@v0", "worse live reward")
	require.NoError(t, err)

	after, err := demo.FetchStatus(ctx, ts.URL, keys["a"], "dep")
	require.NoError(t, err)
	require.Equal(t, "dep@v0", after.Deployments[0].ServingVersion)
	promoted, rolledBack := demo.WeightsMoves(before, after, "dep")
	require.Equal(t, 1, promoted)
	require.Equal(t, 2, rolledBack, "the refused candidate and the rolled-back serving version")
	promoted, rolledBack = demo.WeightsMoves(nil, after, "dep")
	require.Equal(t, []int{1, 2}, []int{promoted, rolledBack})

	all, err := demo.FetchStatus(ctx, ts.URL, keys["a"], "")
	require.NoError(t, err)
	require.Len(t, all.Deployments, 1)

	_, err = demo.FetchStatus(ctx, ts.URL, keys["b"], "dep")
	require.ErrorIs(t, err, demo.ErrStatusNotFound, "b has no session on dep")
	_, err = demo.FetchStatus(ctx, ts.URL, "fw-not-a-key", "dep")
	require.ErrorContains(t, err, "status 401")
	require.NotErrorIs(t, err, demo.ErrStatusNotFound)
}
