package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/gateway/vllmfixture"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/inference/upstream"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/workflows"
)

// TestGatesAnswerOnTheDeploymentsOwnEngine: a release of an upstream
// deployment is judged on that deployment's server, never on the
// in-process policy; a deployment no engine here serves is not evaluated,
// and an upstream is not asked to answer as a weights version it cannot
// pin.
func TestGatesAnswerOnTheDeploymentsOwnEngine(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	fx := &vllmfixture.Fixture{}
	srv := httptest.NewServer(fx)
	t.Cleanup(srv.Close)
	_, err := store.CreateUpstreamDeployment(ctx, db, "team", upstream.Settings{BaseURL: srv.URL + "/v1", Model: "served-name"})
	require.NoError(t, err)
	seedVersions(t, db, "dep", "dep@v1")
	require.NoError(t, store.UpsertDeployment(ctx, db, "elsewhere", store.BackendPolicy, nil, ""))
	policy := &fakeBackend{}
	r := &Release{DB: db, Backend: &Engines{DB: db, Policy: policy, PolicyModel: "dep"}}
	for _, dep := range []string{"team", "elsewhere"} {
		for i := range 30 {
			msgs, _ := json.Marshal([]inference.Message{{Role: "user", Content: fmt.Sprintf("say banana %d", i)}})
			_, err = db.Exec(ctx, `INSERT INTO eval_prompts (deployment, suite, messages, expect) VALUES ($1, 'regression', $2, 'banana')`, dep, msgs)
			require.NoError(t, err)
		}
	}

	a, err := store.CreateArtefact(ctx, db, "team", "harness", []byte(`{"system_prompt":"Be brief."}`), "k1")
	require.NoError(t, err)
	gp := workflows.ReleasePolicy{MaxRewardDrop: 0.05, AnchorBudget: 0.05, Alpha: 0.05}
	in := workflows.GateInput{Deployment: "team", Layer: workflows.LayerHarness, Candidate: fmt.Sprint(a.Version), Gate: workflows.GateRegression, Policy: gp}
	in.ReleaseID = beginRelease(t, r, workflows.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err := r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.NotEvaluated, res.Reason)
	require.Equal(t, 1.0, res.Metrics["candidate_pass_rate"], "the fixture echoes the prompt, so it says banana")
	require.GreaterOrEqual(t, fx.Requests.Load(), int64(30), "the upstream answered the suite")
	require.Equal(t, "served-name", fx.LastRequest()["model"])
	require.Empty(t, policy.seen, "the in-process policy was not asked about another model")

	// Another worker's policy: nothing here can answer for it.
	in.Deployment, in.Layer, in.Candidate = "elsewhere", workflows.LayerWeights, "elsewhere@v2"
	in.ReleaseID = beginRelease(t, r, workflows.ReleaseInput{Deployment: in.Deployment, Layer: in.Layer, Candidate: in.Candidate}).ReleaseID
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.NotEvaluated)
	require.False(t, res.Passed)
	require.Contains(t, res.Reason, "no engine on this worker serves this deployment")
	require.Empty(t, policy.seen)

	// An upstream cannot answer as a weights candidate: that is an error
	// of the candidate's side, never the serving weights' answer.
	_, err = r.Backend.Complete(ctx, &inference.Request{Model: "team", Version: "team@v2",
		Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.True(t, rejected(err), "%v", err)
	resp, err := r.Backend.Complete(ctx, &inference.Request{Model: "dep", Version: "dep@v1",
		Messages: []inference.Message{{Role: "user", Content: "x"}}})
	require.NoError(t, err)
	require.Equal(t, "dep@v1", resp.ModelVersion, "the policy's model goes to the policy")
}
