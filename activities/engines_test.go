package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakesglang"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/internal/policytest"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestGatesAnswerOnTheDeploymentsOwnEngine: a release of an upstream
// deployment is judged on that deployment's server, never on the policy's
// model server; a deployment no engine here serves is not evaluated, and
// an upstream is not asked to answer as a weights version it cannot pin.
func TestGatesAnswerOnTheDeploymentsOwnEngine(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	fx := &fakevllm.Fixture{}
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	_, err := store.CreateUpstreamDeployment(ctx, db, "team", deployment.Settings{BaseURL: srv.URL + "/v1", Model: "served-name"})
	require.NoError(t, err)
	policy := policytest.Start(t, db, policytest.Options{Name: "dep"})
	// A row from before the model server: the policy of a process this
	// worker cannot reach.
	require.NoError(t, store.UpsertDeployment(ctx, db, "elsewhere", deployment.BackendPolicy, nil, ""))
	r := &Release{DB: db, Backend: &Engines{DB: db}}
	seedBananaSuite(t, db, "team", "say banana")
	seedBananaSuite(t, db, "elsewhere", "say banana")

	a, err := store.CreateArtefact(ctx, db, "team", "harness", []byte(`{"system_prompt":"Be brief."}`), "k1")
	require.NoError(t, err)
	gp := deployment.ReleasePolicy{MaxRewardDrop: 0.05, AnchorBudget: 0.05, Alpha: 0.05}
	in := flow.GateInput{Deployment: "team", Layer: artefact.LayerHarness, Candidate: fmt.Sprint(a.Version), Gate: flow.GateRegression, Policy: gp}
	in.ReleaseID = beginRelease(t, r, flow.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err := r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.NotEvaluated, res.Reason)
	require.Equal(t, 1.0, res.Metrics["candidate_pass_rate"], "the fixture echoes the prompt, so it says banana")
	require.GreaterOrEqual(t, fx.Requests.Load(), int64(30), "the upstream answered the suite")
	require.Equal(t, "served-name", fx.LastRequest()["model"])
	require.Zero(t, policy.Completions.Load(), "the policy's model server was not asked about another model")

	// A policy no engine here reaches: nothing can answer for it.
	in.Deployment, in.Layer, in.Candidate = "elsewhere", artefact.LayerWeights, "elsewhere@v2"
	in.ReleaseID = beginRelease(t, r, flow.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.NotEvaluated)
	require.False(t, res.Passed)
	require.Contains(t, res.Reason, "no engine on this worker serves this deployment")
	require.Zero(t, policy.Completions.Load())

	// An upstream cannot answer as a weights candidate: that is an error
	// of the candidate's side, never the serving weights' answer.
	_, err = r.Backend.Complete(ctx, &inference.Request{Model: "team", Version: "team@v2",
		Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.True(t, rejected(err), "%v", err)
	resp, err := r.Backend.Complete(ctx, &inference.Request{Model: "dep", Version: "dep@v1",
		Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.NoError(t, err)
	require.Equal(t, "dep@v1", resp.ModelVersion, "the policy's model goes to the policy's model server")
	require.Equal(t, int64(1), policy.Completions.Load())
}

// TestWeightsCandidateAnswersAsItsAdapter: an upstream deployment whose
// versions reach vLLM as LoRA adapters (weight_sync vllm_lora) has its
// weights candidate judged on that adapter, by its name, beside the base
// that serves; the answers are the adapter's own.
func TestWeightsCandidateAnswersAsItsAdapter(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	fx := &fakevllm.Fixture{RuntimeLoRA: true, Model: "Qwen/Qwen3-8B",
		AdapterReply: func(adapter, last string) string { return "banana from " + adapter }}
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	settings := deployment.Settings{BaseURL: srv.URL + "/v1", Model: "Qwen/Qwen3-8B", WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncVLLMLoRA}}
	_, err := store.CreateUpstreamDeployment(ctx, db, "qwen", settings)
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"r":8}`), 0o644))
	_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path) VALUES ('qwen@v1', 'qwen', 'candidate', $1)`, dir)
	require.NoError(t, err)
	seedBananaSuite(t, db, "qwen", "name a fruit")
	r := &Release{DB: db, Backend: &Engines{DB: db}}
	sync, err := r.SyncWeights(ctx, flow.SyncWeightsInput{Deployment: "qwen", Candidate: "qwen@v1"})
	require.NoError(t, err)
	require.Equal(t, []string{"qwen@v1"}, sync.Loaded, "the release loads its candidate first")
	gp := deployment.ReleasePolicy{MaxRewardDrop: 0.05, AnchorBudget: 0.05, Alpha: 0.05}
	in := flow.GateInput{Deployment: "qwen", Layer: artefact.LayerWeights, Candidate: "qwen@v1", Gate: flow.GateRegression, Policy: gp}
	in.ReleaseID = beginRelease(t, r, flow.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err := r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.NotEvaluated, res.Reason)
	require.Equal(t, 1.0, res.Metrics["candidate_pass_rate"], "the adapter answers banana")
	require.Equal(t, 0.0, res.Metrics["baseline_pass_rate"], "the base echoes the prompt")

	resp, err := r.Backend.Complete(ctx, &inference.Request{Model: "qwen", Version: "qwen@v1",
		Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.NoError(t, err)
	require.Equal(t, "qwen@v1", fx.LastRequest()["model"], "asked for by the adapter's name")
	require.Equal(t, "qwen@v1", resp.ModelVersion)
	require.Equal(t, "banana from qwen@v1", resp.Message.Content)

	// A version the engine does not hold is vLLM's 404: an error, never
	// the base answering in its place.
	_, err = r.Backend.Complete(ctx, &inference.Request{Model: "qwen", Version: "qwen@v9",
		Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.ErrorContains(t, err, "The model `qwen@v9` does not exist")
}

// TestInPlaceCandidatesFailClosed: an SGLang deployment syncs full
// weights in place (sglang_disk), so a weights candidate cannot answer
// beside the serving version on its engine. Its offline gates say so and
// do not pass: they neither judge the serving weights as the candidate
// nor pass on two sides the engine refused alike. An artefact candidate
// is judged on the serving weights, which the engine does hold.
func TestInPlaceCandidatesFailClosed(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	fake := &fakesglang.Fake{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	settings := deployment.Settings{BaseURL: srv.URL + "/v1", Model: "Qwen/Qwen3-8B", WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncSGLangDisk}}
	_, err := store.CreateUpstreamDeployment(ctx, db, "qwen", settings)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `UPDATE deployments SET serving_version = 'qwen@v1' WHERE name = 'qwen'`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status) VALUES ('qwen@v1', 'qwen', 'serving'), ('qwen@v2', 'qwen', 'candidate')`)
	require.NoError(t, err)
	seedBananaSuite(t, db, "qwen", "say banana")
	r := &Release{DB: db, Backend: &Engines{DB: db}}
	gp := deployment.ReleasePolicy{MaxRewardDrop: 0.05, AnchorBudget: 0.05, Alpha: 0.05}
	for _, gate := range []string{flow.GateShadow, flow.GateReplay, flow.GateRegression, flow.GateSafety} {
		in := flow.GateInput{Deployment: "qwen", Layer: artefact.LayerWeights, Candidate: "qwen@v2", Baseline: "qwen@v1", Gate: gate, Policy: gp, Final: true}
		in.ReleaseID = beginRelease(t, r, flow.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
		res, err := r.EvaluateGate(ctx, in)
		require.NoError(t, err, gate)
		require.False(t, res.Passed, "%s: %s", gate, res.Reason)
		require.True(t, res.NotEvaluated, "%s: %s", gate, res.Reason)
		require.Contains(t, res.Reason, "cannot answer beside", gate)
		require.Zero(t, res.Metrics["evaluated"], gate)
	}
	require.Empty(t, fake.Generates(), "the serving weights were never asked to stand in for the candidate")
	require.Zero(t, fake.Chat.Requests.Load())

	// The engine holds the serving version: a request pinned to it is
	// answered, one pinned to another version refused.
	resp, err := r.Backend.Complete(ctx, &inference.Request{Model: "qwen", Version: "qwen@v1", Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.NoError(t, err)
	require.Equal(t, "echo: x", resp.Message.Content)
	_, err = r.Backend.Complete(ctx, &inference.Request{Model: "qwen", Version: "qwen@v2", Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.True(t, rejected(err), "%v", err)

	// A harness candidate answers on the serving weights beside the
	// serving harness: judged, on the deployment's own engine.
	a, err := store.CreateArtefact(ctx, db, "qwen", "harness", []byte(`{"system_prompt":"Be brief."}`), "k1")
	require.NoError(t, err)
	in := flow.GateInput{Deployment: "qwen", Layer: artefact.LayerHarness, Candidate: fmt.Sprint(a.Version), Gate: flow.GateRegression, Policy: gp}
	in.ReleaseID = beginRelease(t, r, flow.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err := r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.NotEvaluated, res.Reason)
	require.Equal(t, 1.0, res.Metrics["candidate_pass_rate"], "the fake echoes the prompt, so it says banana")
	require.NotEmpty(t, fake.Generates())
}

// TestDeploymentGatesWin: a deployment's own gate thresholds (its
// settings' gates) judge its releases in place of the release's: here it
// allows unevaluated gates, which an SGLang deployment needs to promote.
func TestDeploymentGatesWin(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	srv := httptest.NewServer(&fakesglang.Fake{})
	t.Cleanup(srv.Close)
	settings := deployment.Settings{BaseURL: srv.URL + "/v1", Model: "Qwen/Qwen3-8B", WeightSync: &deployment.WeightSync{Kind: deployment.WeightSyncSGLangDisk},
		BaseModel: "Qwen/Qwen3-8B", Gates: json.RawMessage(`{"allow_unevaluated": true, "max_reward_drop": 0}`)}
	require.NoError(t, settings.Validate())
	_, err := store.CreateUpstreamDeployment(ctx, db, "qwen", settings)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status) VALUES ('qwen@v1', 'qwen', 'serving'), ('qwen@v2', 'qwen', 'candidate')`)
	require.NoError(t, err)
	r := &Release{DB: db, Backend: &Engines{DB: db}}
	in := flow.GateInput{Deployment: "qwen", Layer: artefact.LayerWeights, Candidate: "qwen@v2", Baseline: "qwen@v1",
		Gate: flow.GateShadow, Policy: deployment.ReleasePolicy{MaxRewardDrop: 0.05}, Final: true}
	in.ReleaseID = beginRelease(t, r, flow.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err := r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.NotEvaluated)
	require.True(t, res.Passed, "the deployment allows unevaluated gates: %s", res.Reason)
	p, err := gatePolicy(ctx, db, "qwen", in.Policy)
	require.NoError(t, err)
	require.Zero(t, p.MaxRewardDrop, "an explicit 0 is kept, not defaulted")
	require.Equal(t, 0.05, p.AnchorBudget, "what the deployment does not set stays the release's, with defaults")

	settings.Gates = json.RawMessage(`{"max_safety_drop": 2}`)
	require.ErrorContains(t, settings.Validate(), "gates.max_safety_drop")
	settings.Gates = json.RawMessage(`{"shadow_duration": 5}`)
	require.ErrorContains(t, settings.Validate(), `gates.shadow_duration 5: want a duration such as "90s"`)
	settings.Gates = json.RawMessage(`{"shadow": "1m"}`)
	require.ErrorContains(t, settings.Validate(), "gates.shadow: unknown threshold")
	settings.Gates = json.RawMessage(`{"alpha": "high"}`)
	require.ErrorContains(t, settings.Validate(), "gates.alpha")
}

// seedBananaSuite registers 30 regression prompts on dep ("<ask> <i>"),
// each expecting "banana".
func seedBananaSuite(t *testing.T, db store.DBTX, dep, ask string) {
	t.Helper()
	for i := range 30 {
		msgs, _ := json.Marshal([]inference.Message{{Role: "user", Content: fmt.Sprintf("%s %d", ask, i)}})
		_, err := db.Exec(context.Background(), `INSERT INTO eval_prompts (deployment, suite, messages, expect) VALUES ($1, 'regression', $2, 'banana')`, dep, msgs)
		require.NoError(t, err)
	}
}
