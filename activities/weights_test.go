package activities

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// adapterDir writes a PEFT adapter directory as vLLM expects one.
func adapterDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"r":8,"peft_type":"LORA"}`), 0o644))
	return dir
}

// TestSyncWeightsKeepsWhatRoutesNameAndUnloadsTheRest drives the activity
// against the fake vLLM's dynamic LoRA endpoints: the candidate and the
// serving version are loaded under their version ids, a rolled-back
// candidate is unloaded once its release's drain has passed, another team's adapter on the
// same server is left alone, a second sync is a no-op, and the engine's
// refusals and failures come back as final and retryable errors.
func TestSyncWeightsKeepsWhatRoutesNameAndUnloadsTheRest(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	fx := &fakevllm.Fixture{RuntimeLoRA: true, Model: "meta-llama/Llama-3.1-8B"}
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	settings := deployment.Settings{BaseURL: srv.URL + "/v1", Model: "meta-llama/Llama-3.1-8B", WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}}
	_, err := store.CreateUpstreamDeployment(ctx, db, "llama", settings)
	require.NoError(t, err)
	v1, v2, foreign := adapterDir(t), adapterDir(t), adapterDir(t)
	_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path) VALUES
		('llama@v1', 'llama', 'serving', $1), ('llama@v2', 'llama', 'candidate', $2), ('llama@v3', 'llama', 'candidate', '')`, v1, v2)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE deployments SET serving_version = 'llama@v1' WHERE name = 'llama'`)
	require.NoError(t, err)
	eng, err := weightsync.New(*settings.WeightSync, settings.BaseURL, "", nil)
	require.NoError(t, err)
	require.NoError(t, eng.Load(ctx, "their-adapter", foreign))

	r := &Release{DB: db}
	out, err := r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Candidate: "llama@v2"})
	require.NoError(t, err)
	require.True(t, out.Synced)
	require.Equal(t, []string{"llama@v1", "llama@v2"}, out.Loaded)
	calls := fx.AdapterCalls()
	require.Equal(t, "/v1/load_lora_adapter", calls[len(calls)-1].Path)
	require.Equal(t, map[string]any{"lora_name": "llama@v2", "lora_path": v2}, calls[len(calls)-1].Body, "vLLM's documented body")

	_, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Candidate: "llama@v3"})
	var app *temporal.ApplicationError
	require.True(t, errors.As(err, &app) && app.NonRetryable() && app.Type() == "WeightSync", "a candidate with no checkpoint fails for good: %v", err)

	// llama@v2 was rolled back a moment ago: a request routed to it may
	// still run, so it stays for the drain; once that has passed it goes.
	_, err = db.Exec(ctx, `INSERT INTO releases (deployment, layer, candidate, baseline, status, finished_at)
		VALUES ('llama', 'weights', 'llama@v2', 'llama@v1', 'rolled_back', now())`)
	require.NoError(t, err)
	out, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Unload: true, Drain: time.Minute})
	require.NoError(t, err)
	require.Empty(t, out.Unloaded)
	require.Contains(t, fx.Adapters(), "llama@v2", "still draining")
	_, err = db.Exec(ctx, `UPDATE releases SET finished_at = now() - interval '2 minutes' WHERE deployment = 'llama'`)
	require.NoError(t, err)
	out, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Unload: true, Drain: time.Minute})
	require.NoError(t, err)
	require.Equal(t, []string{"llama@v2"}, out.Unloaded)
	require.Equal(t, map[string]string{"llama@v1": v1, "their-adapter": foreign}, fx.Adapters())
	n := len(fx.AdapterCalls())
	out, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Unload: true})
	require.NoError(t, err)
	require.Equal(t, []string{"llama@v1"}, out.Kept)
	require.Len(t, fx.AdapterCalls(), n, "a second sync asks the engine nothing")

	// The engine fails (500): worth a retry, not a final refusal.
	fx.FailLoRA.Store(1)
	_, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Candidate: "llama@v2"})
	require.Error(t, err)
	require.False(t, errors.As(err, &app) && app.NonRetryable(), "a 500 is retried: %v", err)
	_, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "llama", Candidate: "llama@v2"})
	require.NoError(t, err, "the retry loads it")
	require.Contains(t, fx.Adapters(), "llama@v2")

	// A deployment without weight sync is left alone.
	_, err = store.CreateUpstreamDeployment(ctx, db, "plain", deployment.Settings{BaseURL: srv.URL + "/v1"})
	require.NoError(t, err)
	out, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "plain", Candidate: "plain@v2"})
	require.NoError(t, err)
	require.False(t, out.Synced)
	out, err = r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "nobody"})
	require.NoError(t, err)
	require.False(t, out.Synced)
}
