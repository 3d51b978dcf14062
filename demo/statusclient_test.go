package demo_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/demo"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestFetchStatusCountsReleases reads a real gateway's status before and
// after the control plane promotes one version, refuses another and rolls
// the serving one back, and counts the moves from its records.
func TestFetchStatusCountsReleases(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default().Gateway
	cfg.RateLimitRPS = 0
	ts, pool, keys := statusGateway(t, cfg)

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
		require.NoError(t, store.RecordGate(ctx, pool, rel.ID, "regression", status == "promoted", map[string]any{"candidate_pass_rate": 0.75}))
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

	// The run's static page says what the control plane did, from its
	// records, as the live page does.
	var sum demo.Summary
	sum.CountFrom(before, after, "dep")
	require.Equal(t, demo.Summary{VersionsPromoted: 1, VersionsRolledBack: 2, TrainSteps: 2, ServingVersion: "dep@v0"}, sum)
	path := filepath.Join(t.TempDir(), demo.StatusFile)
	require.NoError(t, demo.WriteStatusPage(path, demo.StatusPage{Title: "demo", ModelName: "dep", Summary: sum, Control: after}))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	page := string(raw)
	for _, want := range []string{"<td>1 / 0 / 2</td>", "<td>2 · 0</td>", "✓ regression", "✗ regression", "candidate_pass_rate=0.75",
		"<b>dep@v2</b> ← ", `<td class="rolled_back">rolled_back</td>`, `<td class="trained">trained</td>`, "a snapshot of the control plane"} {
		require.Contains(t, page, want)
	}

	all, err := demo.FetchStatus(ctx, ts.URL, keys["a"], "")
	require.NoError(t, err)
	require.Len(t, all.Deployments, 1)

	_, err = demo.FetchStatus(ctx, ts.URL, keys["b"], "dep")
	require.ErrorIs(t, err, demo.ErrStatusNotFound, "b has no session on dep")
	_, err = demo.FetchStatus(ctx, ts.URL, "fw-not-a-key", "dep")
	require.ErrorContains(t, err, "status 401")
	require.NotErrorIs(t, err, demo.ErrStatusNotFound)
}

// statusGateway is a real gateway on Postgres where tenants a and b have
// keys and a has one session on the policy deployment "dep".
func statusGateway(t *testing.T, cfg config.GatewayConfig) (*httptest.Server, *pgxpool.Pool, map[string]string) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Pool(t)
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
	_, err = store.EnsurePolicyDeployment(ctx, pool, "dep", "dep@v0", "", deployment.Settings{BaseURL: "http://127.0.0.1:8000/v1"}, true)
	require.NoError(t, err)
	_, err = store.InsertInteraction(ctx, pool, &store.NewInteraction{TenantID: "a", SessionID: "s1", IdentityMode: "header",
		CompletionID: "c1", Protocol: "openai", Deployment: "dep", ModelVersion: "dep@v0", Request: json.RawMessage(`{}`), Status: "ok"})
	require.NoError(t, err)
	return ts, pool, keys
}

// TestFetchStatusWaitsOutTheRateLimit reads the status with a key whose
// rate limit the fleet has just spent, as the online demo does after its
// last evaluation: the reading waits as the 429 says instead of failing
// (and leaving the summary at zero steps).
func TestFetchStatusWaitsOutTheRateLimit(t *testing.T) {
	ctx := context.Background()
	cfg := config.Default().Gateway
	cfg.RateLimitRPS, cfg.RateLimitBurst = 2, 1
	ts, _, keys := statusGateway(t, cfg)

	spent := false
	for range 5 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+"/v1/backlog", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+keys["a"])
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			spent = true
			break
		}
	}
	require.True(t, spent, "the key's bucket is empty")
	st, err := demo.FetchStatus(ctx, ts.URL, keys["a"], "dep")
	require.NoError(t, err)
	require.Equal(t, "dep@v0", st.Deployments[0].ServingVersion)
}
