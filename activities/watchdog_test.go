package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// scriptedBackend stands in for served versions of known quality in gate
// and watchdog unit tests: version v answers held-out prompt "q<i>"
// right ("ok") when i < right[v], and refuses safety prompt "s<i>" when
// i < safe[v]. The end-to-end tests run the in-process policy instead.
type scriptedBackend struct {
	right, safe map[string]int
}

func (b *scriptedBackend) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	p := req.Messages[len(req.Messages)-1].Content
	i, _ := strconv.Atoi(p[1:])
	answer := "no"
	switch {
	case p[0] == 'q' && i < b.right[req.Version]:
		answer = "ok"
	case p[0] == 's' && i < b.safe[req.Version]:
		answer = "REFUSED"
	}
	return &inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Content: answer}, FinishReason: inference.FinishStop, ModelVersion: req.Version}, nil
}

// seedSuites registers a held-out suite of n prompts and a safety suite
// of m for dep.
func seedSuites(t *testing.T, db *pgxpool.Pool, dep string, n, m int) {
	t.Helper()
	set := func(suite string, prefix byte, k int, expect string) {
		var items []store.SuiteItem
		for i := 0; i < k; i++ {
			items = append(items, store.SuiteItem{Prompt: fmt.Sprintf("%c%d", prefix, i), Expect: expect, Match: store.MatchExact})
		}
		prompts, err := store.SuitePrompts(suite, items)
		require.NoError(t, err)
		changed, err := store.SetEvalSuite(context.Background(), db, dep, suite, prompts)
		require.NoError(t, err)
		require.True(t, changed)
	}
	set(store.SuiteRegression, 'q', n, "ok")
	set(store.SuiteSafety, 's', m, "REFUSED")
}

// promote records v as a candidate of dep and makes it serve, as a
// release that passed (or skipped) its gates would.
func promote(t *testing.T, db *pgxpool.Pool, dep, v string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status) VALUES ($1, $2, 'candidate') ON CONFLICT DO NOTHING`, v, dep)
	require.NoError(t, err)
	rel, err := store.BeginRelease(ctx, db, store.Release{Deployment: dep, Layer: artefact.LayerWeights, Candidate: v, WorkflowID: "release-" + v})
	require.NoError(t, err)
	require.NoError(t, store.FinishRelease(ctx, db, rel.ID, flow.ReleasePromoted, "test"))
}

func serving(t *testing.T, db *pgxpool.Pool, dep string) string {
	t.Helper()
	v, err := store.ServingOf(context.Background(), db, dep, artefact.LayerWeights)
	require.NoError(t, err)
	return v
}

// TestAnchorStopsAChainOfSmallDrops runs a chain of releases through the
// regression gate, each candidate two points below the last: against the
// serving version alone every step is within the per-release allowance,
// but the drops since the anchor share one budget, so the chain stops.
func TestAnchorStopsAChainOfSmallDrops(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedVersions(t, db, "dep", "dep@v0")
	seedSuites(t, db, "dep", 200, 10)
	b := &scriptedBackend{right: map[string]int{}, safe: map[string]int{}}
	r := &Release{DB: db, Backend: b}
	b.right["dep@v0"] = 120 // 0.60
	begin := func(cand string) store.Release {
		rel, err := store.BeginRelease(ctx, db, store.Release{Deployment: "dep", Layer: artefact.LayerWeights, Candidate: cand, WorkflowID: "release-" + cand})
		require.NoError(t, err)
		return rel
	}

	var promoted []string
	looks, passes := map[string]float64{}, map[string]float64{}
	for i := 1; i <= 8; i++ {
		cand := fmt.Sprintf("dep@v%d", i)
		b.right[cand] = 120 - 4*i // two points down each time
		_, err := db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status) VALUES ($1, 'dep', 'candidate')`, cand)
		require.NoError(t, err)
		rel := begin(cand)
		in := flow.GateInput{ReleaseID: rel.ID, Deployment: "dep", Layer: artefact.LayerWeights, Candidate: cand,
			Baseline: rel.Baseline, Gate: flow.GateRegression, Policy: deployment.ReleasePolicy{MaxRewardDrop: 0.05}}
		res, err := r.EvaluateGate(ctx, in)
		require.NoError(t, err)
		require.Equal(t, "dep@v0", res.Anchor, "no candidate beats the first anchor")
		looks[cand], passes[cand] = res.Metrics["look"], res.Metrics["look_passes"]
		require.Less(t, res.Metrics["diff_vs_baseline"], 0.0)
		status := flow.ReleaseRolledBack
		if res.Passed {
			status = flow.ReleasePromoted
			promoted = append(promoted, cand)
		}
		require.NoError(t, r.FinishRelease(ctx, flow.FinishReleaseInput{ReleaseID: rel.ID, Status: status}))
	}
	// v1 (two points down) is shown within the budget; v2 (four) could be
	// beyond it at its look's share of alpha, and the rest further down.
	require.Equal(t, []string{"dep@v1"}, promoted, "the shared budget ends the slide at once")
	require.Equal(t, 1.0, looks["dep@v1"])
	require.Equal(t, 8.0, looks["dep@v8"], "every candidate judged against the anchor is a look")
	require.Equal(t, 1.0, passes["dep@v8"], "v1's pass earns the later looks their share back")
	require.Equal(t, "dep@v1", serving(t, db, "dep"))

	// A candidate better than the anchor passes and becomes the anchor.
	b.right["dep@v9"] = 130
	_, err := db.Exec(ctx, `INSERT INTO model_versions (id, deployment, status) VALUES ('dep@v9', 'dep', 'candidate')`)
	require.NoError(t, err)
	rel := begin("dep@v9")
	for _, gate := range []string{flow.GateRegression, flow.GateSafety} {
		res, err := r.EvaluateGate(ctx, flow.GateInput{ReleaseID: rel.ID, Deployment: "dep", Layer: artefact.LayerWeights,
			Candidate: "dep@v9", Baseline: rel.Baseline, Gate: gate})
		require.NoError(t, err)
		require.True(t, res.Passed, res.Reason)
	}
	require.NoError(t, r.FinishRelease(ctx, flow.FinishReleaseInput{ReleaseID: rel.ID, Status: flow.ReleasePromoted}))
	a, err := store.AnchorOf(ctx, db, "dep")
	require.NoError(t, err)
	require.Equal(t, "dep@v9", a.Version)
	require.InDelta(t, 0.65, a.PassRate, 1e-9)
}

// TestWatchdogRollsBackAVersionThatSlippedThrough: a version promoted
// without the gates (an operator's approval, a suite registered later) is
// far below the anchor on the held-out suite, or below it on safety; the
// watchdog re-measures it and rolls the deployment back to the anchor.
func TestWatchdogRollsBackAVersionThatSlippedThrough(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedVersions(t, db, "dep", "dep@v1")
	b := &scriptedBackend{right: map[string]int{"dep@v1": 120, "dep@v2": 60, "dep@v3": 121}, safe: map[string]int{"dep@v1": 10, "dep@v2": 10, "dep@v3": 8}}
	r := &Release{DB: db, Backend: b}
	watch := func() flow.WatchdogResult {
		t.Helper()
		res, err := r.WatchServing(ctx, flow.WatchdogInput{Deployment: "dep"})
		require.NoError(t, err)
		return res
	}

	res := watch()
	require.Equal(t, flow.WatchNotEvaluated, res.Verdict, "no suite, no anchor")

	seedSuites(t, db, "dep", 200, 10)
	res = watch()
	require.Equal(t, flow.WatchOK, res.Verdict)
	require.Equal(t, "the anchor serves", res.Reason, "the serving version, measured now, is the first anchor")

	promote(t, db, "dep", "dep@v2") // 0.30 on the held-out suite: slipped through
	res = watch()
	require.Equal(t, flow.WatchRolledBack, res.Verdict, res.Reason)
	require.Equal(t, "dep@v1", res.RolledBackTo)
	require.Contains(t, res.Reason, "held-out suite")
	require.Equal(t, "dep@v1", serving(t, db, "dep"))
	var status, reason string
	require.NoError(t, db.QueryRow(ctx, `SELECT status, retired_reason FROM model_versions WHERE id = 'dep@v2'`).Scan(&status, &reason))
	require.Equal(t, "rolled_back", status)
	require.Contains(t, reason, "watchdog")
	var rolled int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM releases WHERE deployment = 'dep' AND candidate = 'dep@v2' AND status = 'rolled_back' AND reason LIKE 'watchdog:%'`).Scan(&rolled))
	require.Equal(t, 1, rolled, "the rollback is a release record, on the status page")

	// Better on the held-out suite but two refusals short: rolled back too.
	promote(t, db, "dep", "dep@v3")
	res = watch()
	require.Equal(t, flow.WatchRolledBack, res.Verdict, res.Reason)
	require.Contains(t, res.Reason, "safety suite")
	require.Equal(t, "dep@v1", serving(t, db, "dep"))

	checks, err := store.WatchdogChecks(ctx, db, "dep", 10)
	require.NoError(t, err)
	require.Len(t, checks, 4)
	require.Equal(t, flow.WatchRolledBack, checks[0].Verdict)
	require.Equal(t, "dep@v3", checks[0].Serving)
	require.Equal(t, "dep@v1", checks[0].Anchor)

	// The status view shows the anchor and the checks.
	a, err := store.AnchorOf(ctx, db, "dep")
	require.NoError(t, err)
	require.Equal(t, "dep@v1", a.Version)
	raw, err := json.Marshal(a)
	require.NoError(t, err)
	require.Contains(t, string(raw), `"pass_rate":0.6`)
}

// TestWatchdogLiveTrend: with no suite difference, a live reward far
// below the anchor's, over enough rewarded traffic, also rolls back.
func TestWatchdogLiveTrend(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	seedSuites(t, db, "dep", 50, 5)
	b := &scriptedBackend{right: map[string]int{"dep@v1": 30, "dep@v2": 30}, safe: map[string]int{"dep@v1": 5, "dep@v2": 5}}
	r := &Release{DB: db, Backend: b, RewardMin: 0, RewardMax: 1}
	require.Equal(t, flow.WatchOK, func() string {
		res, err := r.WatchServing(ctx, flow.WatchdogInput{Deployment: "dep"})
		require.NoError(t, err)
		return res.Verdict
	}())
	seedTraffic(t, db, "acme", "dep", "dep@v1", 80, 0.9)
	promote(t, db, "dep", "dep@v2")
	seedTraffic(t, db, "acme", "dep", "dep@v2", 20, 0.1)
	res, err := r.WatchServing(ctx, flow.WatchdogInput{Deployment: "dep"})
	require.NoError(t, err)
	require.Equal(t, flow.WatchOK, res.Verdict, "20 rewards are too few to judge: %s", res.Reason)
	seedTraffic(t, db, "acme", "dep", "dep@v2", 60, 0.1)
	res, err = r.WatchServing(ctx, flow.WatchdogInput{Deployment: "dep"})
	require.NoError(t, err)
	require.Equal(t, flow.WatchRolledBack, res.Verdict, res.Reason)
	require.Contains(t, res.Reason, "live reward")
}
