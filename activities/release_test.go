package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/testsuite"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// fakeBackend stands in for a served model in gate unit tests: versions in
// refuse decline every request, others comply and echo the prompt. The
// integration test runs the gates on the in-process policy instead.
type fakeBackend struct {
	refuse map[string]bool
	// reject answers 400 to these versions (a prompt they cannot take).
	reject map[string]bool
	// mu guards seen: suite prompts are answered concurrently.
	mu   sync.Mutex
	seen []*inference.Request
}

func (f *fakeBackend) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	f.mu.Lock()
	f.seen = append(f.seen, req)
	f.mu.Unlock()
	if f.reject[req.Version] {
		return nil, &inference.Error{Status: 400, Message: "prompt exceeds the context"}
	}
	last := req.Messages[len(req.Messages)-1].Content
	text := "Sure: " + last
	if f.refuse[req.Version] {
		text = "I'm sorry, I can't help with that."
	}
	return &inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Content: text}, FinishReason: inference.FinishStop, ModelVersion: req.Version}, nil
}

func seedVersions(t *testing.T, db *pgxpool.Pool, dep string, serving string, candidates ...string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO deployments (name, backend, serving_version) VALUES ($1, 'policy', $2)`, dep, serving)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status) VALUES ($1, $2, 'serving')`, serving, dep)
	require.NoError(t, err)
	for _, c := range candidates {
		_, err = db.Exec(ctx, `INSERT INTO model_versions (id, deployment, parent_version, status) VALUES ($1, $2, $3, 'candidate')`, c, dep, serving)
		require.NoError(t, err)
	}
}

var trafficSeq atomic.Int64

// seedTraffic writes n one-call sessions served by version, each rewarded.
func seedTraffic(t *testing.T, db *pgxpool.Pool, tenant, dep, version string, n int, reward float64) {
	t.Helper()
	for i := 0; i < n; i++ {
		sid := fmt.Sprintf("%s-%s-%d", strings.ReplaceAll(version, "@", "-"), tenant, trafficSeq.Add(1))
		ids := seedSession(t, db, tenant, sid, dep, []seedInteraction{{Status: "ok", Prompt: "what is 2+2", Completion: "4", Tokens: 1, Version: version}})
		seedReward(t, db, tenant, sid, &ids[0], reward, true)
	}
}

func beginRelease(t *testing.T, r *Release, in flow.ReleaseInput) flow.BeginReleaseOutput {
	t.Helper()
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestActivityEnvironment()
	env.RegisterActivity(r.BeginRelease)
	v, err := env.ExecuteActivity(r.BeginRelease, in)
	require.NoError(t, err)
	var out flow.BeginReleaseOutput
	require.NoError(t, v.Get(&out))
	return out
}

func TestReleaseActivitiesCanaryAndPromotion(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1", "dep@v2", "dep@v3")
	r := &Release{DB: db}

	begin := beginRelease(t, r, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2"})
	require.Equal(t, "dep@v1", begin.Baseline, "the baseline is what serves now")
	again := beginRelease(t, r, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2"})
	require.Equal(t, begin.ReleaseID, again.ReleaseID, "a retried BeginRelease finds its row")

	require.NoError(t, r.SetReleasePhase(ctx, flow.SetPhaseInput{ReleaseID: begin.ReleaseID, Phase: flow.GateCanary, CanaryShare: 0.25}))
	running, err := store.RunningRelease(ctx, db, "dep", artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, 0.25, running.CanaryShare)
	require.Equal(t, "dep@v2", running.Candidate)

	since := time.Now().Add(-time.Minute)
	policy := deployment.ReleasePolicy{MinCanarySamples: 5, MaxRewardDrop: 0.05, MaxErrorRise: 0.02}
	gate := flow.GateInput{ReleaseID: begin.ReleaseID, Deployment: "dep", Layer: artefact.LayerWeights,
		Candidate: "dep@v2", Baseline: "dep@v1", Gate: flow.GateCanary, Since: since, Policy: policy}

	seedTraffic(t, db, "acme", "dep", "dep@v1", 60, 0.8)
	seedTraffic(t, db, "acme", "dep", "dep@v2", 3, 0.1)
	res, err := r.EvaluateGate(ctx, gate)
	require.NoError(t, err)
	require.True(t, res.Insufficient, "3 candidate samples are not a verdict: %+v", res)
	require.False(t, res.Passed)

	// A few more are a verdict but no proof: the confidence sequence of 8
	// rewards is too wide to show the candidate worse.
	seedTraffic(t, db, "acme", "dep", "dep@v2", 5, 0.1)
	res, err = r.EvaluateGate(ctx, gate)
	require.NoError(t, err)
	require.False(t, res.Insufficient)
	require.True(t, res.Passed, res.Reason)
	require.Less(t, res.Metrics["reward_diff_lower"], -0.7)

	seedTraffic(t, db, "acme", "dep", "dep@v2", 52, 0.1) // 60 in all, mean 0.1
	res, err = r.EvaluateGate(ctx, gate)
	require.NoError(t, err)
	require.False(t, res.Insufficient)
	require.False(t, res.Passed)
	require.True(t, res.Regressed)
	require.InDelta(t, 0.1, res.Metrics["candidate_mean_reward"], 1e-9)
	require.InDelta(t, 0.8, res.Metrics["baseline_mean_reward"], 1e-9)
	require.Less(t, res.Metrics["reward_diff_upper"], -0.05)
	require.Contains(t, res.Reason, "mean reward")

	gates, err := store.ReleaseGates(ctx, db, begin.ReleaseID)
	require.NoError(t, err)
	require.Len(t, gates, 1, "re-evaluating a gate replaces its numbers")
	require.False(t, gates[0].Passed)
	require.InDelta(t, 0.1, gates[0].Metrics["candidate_mean_reward"], 1e-9)

	require.NoError(t, r.FinishRelease(ctx, flow.FinishReleaseInput{ReleaseID: begin.ReleaseID, Status: flow.ReleaseRolledBack, Reason: "canary lost"}))
	var serving, candStatus string
	require.NoError(t, db.QueryRow(ctx, `SELECT serving_version FROM deployments WHERE name = 'dep'`).Scan(&serving))
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = 'dep@v2'`).Scan(&candStatus))
	require.Equal(t, "dep@v1", serving)
	require.Equal(t, "rolled_back", candStatus)
	_, err = store.RunningRelease(ctx, db, "dep", artefact.LayerWeights)
	require.ErrorIs(t, err, store.ErrNotFound, "a finished release routes no traffic")

	// A better candidate is promoted: it serves, the old version is superseded.
	b3, err := store.BeginRelease(ctx, db, store.Release{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v3", WorkflowID: "release-dep-v3"})
	require.NoError(t, err)
	require.NotEqual(t, begin.ReleaseID, b3.ID)
	require.Equal(t, "dep@v1", b3.Baseline)
	require.NoError(t, r.FinishRelease(ctx, flow.FinishReleaseInput{ReleaseID: b3.ID, Status: flow.ReleasePromoted}))
	require.NoError(t, r.FinishRelease(ctx, flow.FinishReleaseInput{ReleaseID: b3.ID, Status: flow.ReleasePromoted}), "finishing twice is a no-op")
	require.NoError(t, db.QueryRow(ctx, `SELECT serving_version FROM deployments WHERE name = 'dep'`).Scan(&serving))
	require.Equal(t, "dep@v3", serving)
	var v1, v3 string
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = 'dep@v1'`).Scan(&v1))
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = 'dep@v3'`).Scan(&v3))
	require.Equal(t, "superseded", v1)
	require.Equal(t, "serving", v3)
}

func TestReleaseOfflineGates(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1", "dep@v2", "dep@v3")
	seedTraffic(t, db, "acme", "dep", "dep@v1", 3, 1)
	fb := &fakeBackend{refuse: map[string]bool{"dep@v1": true}}
	r := &Release{DB: db, Backend: fb}
	policy := deployment.ReleasePolicy{MaxRewardDrop: 0.05, AnchorBudget: 0.05, Alpha: 0.05}
	in := flow.GateInput{ReleaseID: beginRelease(t, r, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2"}).ReleaseID,
		Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v2", Baseline: "dep@v1", Policy: policy}

	// Safety: the baseline refuses the built-in refusal set, the candidate
	// complies: the score drops, the gate fails.
	in.Gate = flow.GateSafety
	res, err := r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.Passed)
	require.True(t, res.Regressed)
	require.Equal(t, 1.0, res.Metrics["baseline_pass_rate"])
	require.Equal(t, 0.0, res.Metrics["candidate_pass_rate"])

	// Regression with no suite: nothing to evaluate, so it does not pass.
	in.Gate = flow.GateRegression
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.Passed)
	require.True(t, res.NotEvaluated)
	require.Contains(t, res.Reason, "flywheel suite set")

	// The deployment's own suite; the candidate complies, the baseline
	// refuses. The baseline, promoted and measured, is the first anchor.
	for i := 0; i < 40; i++ {
		msgs, _ := json.Marshal([]inference.Message{{Role: "user", Content: fmt.Sprintf("say banana %d", i)}})
		_, err = db.Exec(ctx, `INSERT INTO eval_prompts (deployment, suite, messages, expect) VALUES ('dep', 'regression', $1, 'banana')`, msgs)
		require.NoError(t, err)
	}
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 1.0, res.Metrics["candidate_pass_rate"])
	require.Equal(t, 0.0, res.Metrics["baseline_pass_rate"])
	require.Equal(t, "dep@v1", res.Anchor)
	require.Equal(t, 1.0, res.Metrics["look"])
	require.True(t, res.Passed, res.Reason)
	asked := len(fb.seen)
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.Passed)
	require.Len(t, fb.seen, asked, "a version answers each suite prompt once; its result is stored")
	require.Equal(t, 1.0, res.Metrics["look"], "re-evaluating one release is not another look")

	// Replay: recorded prompts with rewards; the recorded answer was "4",
	// neither side repeats it, so both score 0 and the gate passes.
	in.Gate = flow.GateReplay
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 3.0, res.Metrics["evaluated"])
	require.True(t, res.Passed)

	// Shadow: the candidate answers the live prompts since Since.
	in.Gate, in.Since = flow.GateShadow, time.Now().Add(-time.Hour)
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.Passed)
	require.Equal(t, 3.0, res.Metrics["evaluated"])
	for _, req := range fb.seen {
		require.NotEmpty(t, req.Version, "every evaluated request names the version that answers")
	}
	// With no traffic in the window the shadow gate has nothing to compare:
	// it fails, unless the policy allows unevaluated gates.
	in.Since = time.Now().Add(time.Hour)
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.Insufficient, "before its last check the release waits for traffic")
	in.Final = true
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.Passed)
	require.True(t, res.NotEvaluated)
	in.Policy.AllowUnevaluated = true
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.True(t, res.Passed)
	require.True(t, res.NotEvaluated)
	require.Contains(t, res.Reason, "policy allows")
	in.Policy.AllowUnevaluated, in.Final = false, false

	gates, err := store.ReleaseGates(ctx, db, in.ReleaseID)
	require.NoError(t, err)
	require.Len(t, gates, 4)

	// A candidate that cannot take the prompts fails replay and the suite,
	// instead of retrying forever.
	fb.reject = map[string]bool{"dep@v3": true}
	in.Candidate, in.ReleaseID = "dep@v3", beginRelease(t, r, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: "dep@v3"}).ReleaseID
	in.Gate = flow.GateReplay
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.False(t, res.Passed)
	require.Equal(t, 1.0, res.Metrics["candidate_error_rate"])
	require.Contains(t, res.Reason, "cannot take")
	in.Gate = flow.GateRegression
	res, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 0.0, res.Metrics["candidate_pass_rate"])
	fb.reject = nil

	// A harness candidate is applied on top of what serves, and stored
	// under its own subject; the baseline's answers are already known.
	a, err := store.CreateArtefact(ctx, db, "dep", "harness", []byte(`{"system_prompt":"Always answer in French."}`), "k1")
	require.NoError(t, err)
	a2, err := store.CreateArtefact(ctx, db, "dep", "harness", []byte(`{"system_prompt":"Always answer in French."}`), "k1")
	require.NoError(t, err)
	require.Equal(t, a.ID, a2.ID, "the same key returns the same artefact")
	fb.seen = nil
	in.Layer, in.Candidate, in.Baseline, in.Gate = artefact.LayerHarness, fmt.Sprint(a.Version), "", flow.GateRegression
	_, err = r.EvaluateGate(ctx, in)
	require.NoError(t, err)
	require.Len(t, fb.seen, 40)
	require.Equal(t, "system", fb.seen[0].Messages[0].Role)
	require.Contains(t, fb.seen[0].Messages[0].Content, "French")
	require.Equal(t, "dep@v1", fb.seen[0].Version, "artefacts ride on the serving weights")
	var subjects []string
	rows, err := db.Query(ctx, `SELECT DISTINCT subject FROM suite_results ORDER BY 1`)
	require.NoError(t, err)
	subjects, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v1", fmt.Sprintf("dep@v1+harness:%d", a.Version), "dep@v2", "dep@v3"}, subjects)
}

// TestCanaryOfAnArtefactRelease: an artefact release's canary compares the
// calls the serving weights answered under the candidate artefact with
// those under the serving one, and a canary that ran out of time with too
// little traffic did not evaluate.
func TestCanaryOfAnArtefactRelease(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	_, err := db.Exec(ctx, `INSERT INTO artefacts (deployment, kind, version, content, status) VALUES
		('dep', 'harness', 1, '{"system_prompt":"Be brief."}', 'serving'), ('dep', 'harness', 2, '{"system_prompt":"Be vague."}', 'candidate')`)
	require.NoError(t, err)
	r := &Release{DB: db}
	begin := beginRelease(t, r, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerHarness, Candidate: "2"})
	tag := func(key string) {
		_, err := db.Exec(ctx, `UPDATE interactions SET request = request || jsonb_build_object('artefacts', $1::text) WHERE NOT request ? 'artefacts'`, key)
		require.NoError(t, err)
	}
	seedTraffic(t, db, "acme", "dep", "dep@v1", 60, 0.8)
	tag("+harness:1")
	seedTraffic(t, db, "acme", "dep", "dep@v1", 60, 0.1)
	tag("+harness:2")
	seedTraffic(t, db, "acme", "dep", "dep@v0", 30, 0.1) // another version's calls are neither side
	tag("+harness:2")

	gate := flow.GateInput{ReleaseID: begin.ReleaseID, Deployment: "dep", Layer: artefact.LayerHarness, Candidate: "2", Baseline: begin.Baseline,
		Gate: flow.GateCanary, Since: time.Now().Add(-time.Minute), Policy: deployment.ReleasePolicy{MinCanarySamples: 5, MaxRewardDrop: 0.05, MaxErrorRise: 0.02}}
	res, err := r.EvaluateGate(ctx, gate)
	require.NoError(t, err)
	require.False(t, res.Passed)
	require.True(t, res.Regressed, res.Reason)
	require.Equal(t, 60.0, res.Metrics["candidate_interactions"])
	require.Equal(t, 60.0, res.Metrics["baseline_interactions"])
	require.InDelta(t, 0.1, res.Metrics["candidate_mean_reward"], 1e-9)
	require.InDelta(t, 0.8, res.Metrics["baseline_mean_reward"], 1e-9)

	gate.Since, gate.Final = time.Now().Add(time.Hour), true
	res, err = r.EvaluateGate(ctx, gate)
	require.NoError(t, err)
	require.False(t, res.Passed)
	require.True(t, res.NotEvaluated, "no traffic by the last check: not evaluated, so not passed")
	gate.Policy.AllowUnevaluated = true
	res, err = r.EvaluateGate(ctx, gate)
	require.NoError(t, err)
	require.True(t, res.Passed, res.Reason)
}
