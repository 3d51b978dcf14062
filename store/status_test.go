package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/statusapi"
	"github.com/flywheel-ai/flywheel/store"
)

// statusWorld is a deployment the control plane has worked on: tenant a's
// sessions trained v1, which a gated release promoted; v2 is in canary;
// tenant b uses the same deployment and one of its own.
type statusWorld struct {
	t    *testing.T
	ctx  context.Context
	pool store.Beginner
	db   store.DBTX
	n    int
}

func (w *statusWorld) step(tenant, session, version string, at time.Time) int64 {
	w.t.Helper()
	w.n++
	c, err := store.InsertInteraction(w.ctx, w.db, &store.NewInteraction{TenantID: tenant, SessionID: session, IdentityMode: "header",
		CompletionID: fmt.Sprintf("c-%d", w.n), Protocol: "openai", Deployment: "dep", ModelVersion: version,
		Request: json.RawMessage(`{"messages":[{"role":"user","content":"secret prompt of ` + tenant + `"}]}`), Response: json.RawMessage(`{}`),
		PromptTokenIDs: []int32{1, 2}, CompletionTokenIDs: []int32{3}, Logprobs: []float32{-0.5},
		PromptTokens: 2, CompletionTokens: 1, FinishReason: "stop", Status: "ok"})
	require.NoError(w.t, err)
	_, err = w.db.Exec(w.ctx, `UPDATE interactions SET created_at = $2 WHERE id = $1`, c.ID, at)
	require.NoError(w.t, err)
	return c.ID
}

func (w *statusWorld) reward(tenant, session string, interaction int64, v float64) {
	w.t.Helper()
	_, err := store.InsertReward(w.ctx, w.db, store.NewReward{TenantID: tenant, SessionID: session, InteractionID: interaction, Value: v, Source: "user"})
	require.NoError(w.t, err)
}

// assemble writes a trajectory of the session's steps, eligible or not.
func (w *statusWorld) assemble(tenant, session string, steps []int64, reason string) int64 {
	w.t.Helper()
	ret := 1.0
	tr := store.NewTrajectory{TenantID: tenant, SessionID: session, Key: "asm-" + session, Discount: 1}
	for i, id := range steps {
		// Samples take their ids from the stored step.
		step := []byte(`{"action":{"tokens":{"prompt_ids":[1,2],"completion_ids":[3],"logprobs":[-0.5]}}}`)
		tr.Steps = append(tr.Steps, store.NewStep{InteractionID: id, Index: i, Step: step, Reward: &ret, Return: &ret,
			Eligible: reason == "", Reason: reason})
	}
	id, _, _, err := store.InsertTrajectory(w.ctx, w.pool, tr)
	require.NoError(w.t, err)
	return id
}

func (w *statusWorld) train(runKey, version, parent string) int64 {
	w.t.Helper()
	run, err := store.ClaimBatch(w.ctx, w.pool, "dep", runKey, 16, 10, 0)
	require.NoError(w.t, err)
	_, samples, err := store.LoadRun(w.ctx, w.db, run.ID)
	require.NoError(w.t, err)
	require.NoError(w.t, store.CommitTrainedRun(w.ctx, w.pool, store.TrainedRun{RunID: run.ID, Deployment: "dep", Version: version,
		Parent: parent, Metrics: map[string]any{"loss": 0.5}, Samples: samples}))
	return run.ID
}

// TestLoadStatus checks every part of the status view against a world
// built through the store's own writers: lineage, serving and canary
// flags, gates per release, scrubbed decision evidence, training runs,
// why each session did or did not train, the bucketed curve per version,
// and that nothing of one tenant shows in the other's view.
func TestLoadStatus(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	w := &statusWorld{t: t, ctx: ctx, pool: pool, db: pool}
	for _, tn := range []string{"a", "b"} {
		require.NoError(t, store.EnsureTenant(ctx, pool, tn))
	}
	_, err := store.EnsurePolicyDeployment(ctx, pool, "dep", "dep@v0", "/ckpt/v0", deployment.Settings{BaseURL: "http://127.0.0.1:8000/v1"}, true)
	require.NoError(t, err)

	// Buckets are 30 s wide for a 20-minute span; t0 starts one.
	t0 := time.Now().Add(-time.Hour).Truncate(30 * time.Second)
	i1 := w.step("a", "s1", "dep@v0", t0)
	i2 := w.step("a", "s1", "dep@v0", t0.Add(5*time.Second))
	w.reward("a", "s1", i1, 1)
	w.reward("a", "s1", i1, 0)   // i1 scores its own steps' mean: 0.5
	w.reward("a", "s1", 0, 0.25) // i2 has no step reward: the outcome, 0.25
	_, err = store.EndSession(ctx, pool, "a", "s1")
	require.NoError(t, err)
	traj := w.assemble("a", "s1", []int64{i1, i2}, "")
	q, err := store.EnqueueSamples(ctx, pool, "a", traj)
	require.NoError(t, err)
	require.Equal(t, 2, q.Queued)
	run1 := w.train("run-1", "dep@v1", "dep@v0")

	rel1, err := store.BeginRelease(ctx, pool, store.Release{Deployment: "dep", Layer: "weights", Candidate: "dep@v1", WorkflowID: "rel-1"})
	require.NoError(t, err)
	require.NoError(t, store.RecordGate(ctx, pool, rel1.ID, "shadow", true, map[string]any{"candidate_error_rate": 0.0}))
	require.NoError(t, store.RecordGate(ctx, pool, rel1.ID, "safety", true, map[string]any{"candidate_pass_rate": 1.0, "baseline_pass_rate": 0.9}))
	require.NoError(t, store.FinishRelease(ctx, pool, rel1.ID, "promoted", "all gates passed"))

	run2 := w.train("run-2", "dep@v2", "dep@v1")
	rel2, err := store.BeginRelease(ctx, pool, store.Release{Deployment: "dep", Layer: "weights", Candidate: "dep@v2", WorkflowID: "rel-2"})
	require.NoError(t, err)
	require.NoError(t, store.SetReleasePhase(ctx, pool, rel2.ID, "canary", 0.25))
	require.NoError(t, store.RecordGate(ctx, pool, rel2.ID, "canary", false, map[string]any{"candidate_mean_reward": -1.0, "insufficient": true}))

	_, err = store.RecordDecision(ctx, pool, store.DecisionRow{Deployment: "dep", Decision: "weights", Reason: "reward trend down",
		Evidence: json.RawMessage(`{"sessions": 4, "tool_failures": [{"tenant": "a", "tool": "search", "calls": 3, "failures": 2, "example": "a's own output"},
			{"tenant": "b", "tool": "b_ledger", "calls": 5, "failures": 5, "example": "secret tool output"}, {"tool": "legacy_tool", "calls": 4, "failures": 4}]}`),
		WorkflowID: "evo-1"})
	require.NoError(t, err)
	_, err = store.RecordDecision(ctx, pool, store.DecisionRow{Deployment: "dep", Decision: "tool_schema", Reason: "tool b_ledger of tenant b failed 5 of 5 calls",
		Evidence:   json.RawMessage(`{"sessions": 4, "target": "b_ledger", "tenant": "b", "tool_failures": [{"tenant": "b", "tool": "b_ledger", "calls": 5, "failures": 5}]}`),
		WorkflowID: "evo-2"})
	require.NoError(t, err)

	// s2 was assembled but every step was redacted; s3 is open; s4 ended
	// unassembled; s5's samples wait in the queue.
	i3 := w.step("a", "s2", "dep@v1", t0.Add(20*time.Minute))
	i4 := w.step("a", "s2", "dep@v0", t0.Add(20*time.Minute+time.Second))
	w.reward("a", "s2", i3, -1)
	w.assemble("a", "s2", []int64{i3, i4}, "redacted")
	w.step("a", "s3", "dep@v1", t0.Add(10*time.Minute))
	w.step("a", "s4", "dep@v1", t0.Add(10*time.Minute))
	_, err = store.EndSession(ctx, pool, "a", "s4")
	require.NoError(t, err)
	i5 := w.step("a", "s5", "dep@v1", t0.Add(10*time.Minute))
	q, err = store.EnqueueSamples(ctx, pool, "a", w.assemble("a", "s5", []int64{i5}, ""))
	require.NoError(t, err)
	require.Equal(t, 1, q.Queued)

	// Tenant b: a rewarded step on dep inside a's curve span, and a
	// deployment of its own.
	ib := w.step("b", "sb", "dep@v1", t0.Add(10*time.Minute))
	w.reward("b", "sb", ib, 1)
	_, err = store.InsertInteraction(ctx, pool, &store.NewInteraction{TenantID: "b", SessionID: "sb-other", IdentityMode: "header",
		CompletionID: "c-other", Protocol: "openai", Deployment: "other", ModelVersion: "other", Request: json.RawMessage(`{}`), Status: "ok"})
	require.NoError(t, err)

	st, err := store.LoadStatus(ctx, pool, store.StatusQuery{TenantID: "a"})
	require.NoError(t, err)
	require.Equal(t, "a", st.Tenant)
	require.Len(t, st.Deployments, 1, "a has sessions on dep only")
	d := st.Deployments[0]
	require.Equal(t, "dep", d.Name)
	require.Equal(t, deployment.BackendUpstream, d.Backend)
	require.Equal(t, "dep@v1", d.ServingVersion)
	require.Equal(t, &statusapi.CanaryStatus{ReleaseID: rel2.ID, Candidate: "dep@v2", Baseline: "dep@v1", Phase: "canary", Share: 0.25}, d.Canary)

	versions := map[string]statusapi.VersionStatus{}
	for _, v := range d.Versions {
		versions[v.ID] = v
	}
	require.Len(t, versions, 3)
	require.Equal(t, "superseded", versions["dep@v0"].Status)
	require.True(t, versions["dep@v1"].Serving)
	require.False(t, versions["dep@v1"].Canary)
	require.Equal(t, "dep@v0", versions["dep@v1"].Parent)
	require.Equal(t, 2, versions["dep@v1"].TrainedSamples)
	require.Equal(t, 1, versions["dep@v1"].TenantSessions)
	require.InDelta(t, 0.5, versions["dep@v1"].Metrics["loss"], 1e-9)
	require.True(t, versions["dep@v2"].Canary)
	require.Equal(t, "candidate", versions["dep@v2"].Status)
	require.Equal(t, "dep@v1", versions["dep@v2"].Parent)

	require.Len(t, d.Releases, 2)
	require.Equal(t, rel2.ID, d.Releases[0].ID, "newest release first")
	require.Equal(t, "running", d.Releases[0].Status)
	require.Len(t, d.Releases[0].Gates, 1)
	require.False(t, d.Releases[0].Gates[0].Passed)
	require.Equal(t, true, d.Releases[0].Gates[0].Metrics["insufficient"])
	require.Equal(t, "promoted", d.Releases[1].Status)
	require.Equal(t, []string{"shadow", "safety"}, []string{d.Releases[1].Gates[0].Gate, d.Releases[1].Gates[1].Gate})
	require.InDelta(t, 0.9, d.Releases[1].Gates[1].Metrics["baseline_pass_rate"], 1e-9)
	require.NotNil(t, d.Releases[1].FinishedAt)

	require.Equal(t, map[string]map[string]int{"weights": {"promoted": 1, "running": 1}}, d.ReleaseCounts)

	// Tenant a sees its own tool clusters only, and no other tenant's
	// tool names in a decision about that tenant's tool.
	require.Len(t, d.Decisions, 2)
	require.Equal(t, []string{"tool_schema", "weights"}, []string{d.Decisions[0].Decision, d.Decisions[1].Decision})
	for _, dec := range d.Decisions {
		for _, theirs := range []string{"secret tool output", "b_ledger", "legacy_tool"} {
			require.NotContains(t, string(dec.Evidence), theirs)
			require.NotContains(t, dec.Reason, theirs)
		}
	}
	require.Contains(t, string(d.Decisions[1].Evidence), `"failures":2`)
	require.Contains(t, string(d.Decisions[1].Evidence), "a's own output")

	require.Len(t, d.TrainingRuns, 2)
	require.Equal(t, []int64{run2, run1}, []int64{d.TrainingRuns[0].ID, d.TrainingRuns[1].ID})
	require.Equal(t, "trained", d.TrainingRuns[1].Status)
	require.Equal(t, "dep@v1", d.TrainingRuns[1].Version)
	require.Equal(t, 2, d.TrainingRuns[1].Samples)
	require.Equal(t, 2, d.TrainingRuns[1].TenantSamples)
	require.Equal(t, "dep@v0", d.TrainingRuns[1].Stats["base_version"])

	sessions := map[string]statusapi.SessionSummary{}
	for _, s := range d.Sessions {
		sessions[s.ID] = s
	}
	require.Len(t, sessions, 5)
	s1 := sessions["s1"]
	require.True(t, s1.Trained)
	require.Equal(t, []string{"dep@v1"}, s1.TrainedInto)
	require.Equal(t, store.TrainingTrained, s1.Reason)
	require.Equal(t, 2, s1.Steps)
	require.InDelta(t, 0.25, *s1.Reward, 1e-9, "the outcome reward wins over step rewards")
	require.Equal(t, "ended", s1.Status)
	require.InDelta(t, -1, *sessions["s2"].Reward, 1e-9, "no outcome: the step rewards' mean")
	require.Equal(t, "dep@v0", sessions["s2"].Version, "the version of the last step")
	for id, want := range map[string]string{"s2": "redacted", "s3": store.TrainingSessionOpen, "s4": store.TrainingNotAssembled, "s5": store.TrainingQueued} {
		require.False(t, sessions[id].Trained, id)
		require.Equal(t, want, sessions[id].Reason, id)
	}
	require.Nil(t, sessions["s3"].Reward)

	require.Equal(t, 30, d.Curve.BucketSeconds)
	require.Equal(t, []statusapi.CurvePoint{
		{Start: t0.UTC(), Version: "dep@v0", Rewarded: 2, MeanReward: 0.375},
		{Start: t0.Add(20 * time.Minute).UTC(), Version: "dep@v1", Rewarded: 1, MeanReward: -1},
	}, d.Curve.Points, "b's reward at +10 min is not a's")

	// b sees dep and its own deployment, none of a's sessions, and a's
	// lineage only as totals.
	st, err = store.LoadStatus(ctx, pool, store.StatusQuery{TenantID: "b", Deployment: "dep"})
	require.NoError(t, err)
	require.Len(t, st.Deployments, 1)
	d = st.Deployments[0]
	require.Len(t, d.Sessions, 1)
	require.Equal(t, "sb", d.Sessions[0].ID)
	for _, v := range d.Versions {
		require.Zero(t, v.TenantSessions, v.ID)
	}
	require.Zero(t, d.TrainingRuns[1].TenantSamples)
	require.Equal(t, []statusapi.CurvePoint{{Start: t0.Add(10 * time.Minute).UTC(), Version: "dep@v1", Rewarded: 1, MeanReward: 1}}, d.Curve.Points)
	raw, err := json.Marshal(st)
	require.NoError(t, err)
	require.NotContains(t, string(raw), "secret prompt of a")
	require.NotContains(t, string(raw), "/ckpt/", "checkpoint paths are the server's business")

	st, err = store.LoadStatus(ctx, pool, store.StatusQuery{TenantID: "b"})
	require.NoError(t, err)
	require.Equal(t, []string{"dep", "other"}, []string{st.Deployments[0].Name, st.Deployments[1].Name})
	require.Empty(t, st.Deployments[1].Backend, "routed by configuration, no deployments row")

	// A deployment a has no session on is not found, existing or not.
	for _, name := range []string{"other", "nope"} {
		_, err = store.LoadStatus(ctx, pool, store.StatusQuery{TenantID: "a", Deployment: name})
		require.ErrorIs(t, err, store.ErrNotFound, name)
	}
	// A tenant with no traffic yet has an empty, not a failing, status.
	require.NoError(t, store.EnsureTenant(ctx, pool, "c"))
	st, err = store.LoadStatus(ctx, pool, store.StatusQuery{TenantID: "c"})
	require.NoError(t, err)
	require.Empty(t, st.Deployments)
}

func TestBucketForAdaptsToTheSpan(t *testing.T) {
	for span, want := range map[time.Duration]time.Duration{
		0:                   10 * time.Second,
		5 * time.Minute:     10 * time.Second,
		20 * time.Minute:    30 * time.Second,
		time.Hour:           time.Minute,
		90 * time.Minute:    2 * time.Minute,
		10 * time.Hour:      10 * time.Minute,
		30 * 24 * time.Hour: 12 * time.Hour,
		90 * 24 * time.Hour: 24 * time.Hour, // the widest step caps it
	} {
		require.Equal(t, want, store.BucketFor(span), "span %s", span)
	}
}

// BenchmarkLoadStatus reads one deployment's status for a tenant with
// 3,000 sessions of two rewarded steps each over 10 minutes (a demo run's
// worth), as the status page does on every refresh.
func BenchmarkLoadStatus(b *testing.B) {
	ctx := context.Background()
	pool := testenv.Pool(b)
	require.NoError(b, store.EnsureTenant(ctx, pool, "a"))
	_, err := store.EnsurePolicyDeployment(ctx, pool, "dep", "dep@v0", "", deployment.Settings{BaseURL: "http://127.0.0.1:8000/v1"}, true)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
INSERT INTO sessions (id, tenant_id, deployment, identity_mode, status, last_active_at)
SELECT 's' || g, 'a', 'dep', 'header', 'ended', now() - interval '10 minutes' + g * interval '200 ms'
FROM generate_series(1, 3000) g`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, status, created_at)
SELECT 'a', 's' || g, k, 'c' || g || '-' || k, 'openai', 'dep', 'dep@v' || (g / 500), '{}', 'ok',
       now() - interval '10 minutes' + g * interval '200 ms'
FROM generate_series(1, 3000) g, generate_series(0, 1) k`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `
INSERT INTO rewards (tenant_id, session_id, value, source)
SELECT 'a', 's' || g, (g % 3) / 2.0, 'user' FROM generate_series(1, 3000) g`)
	require.NoError(b, err)
	_, err = pool.Exec(ctx, `ANALYZE`)
	require.NoError(b, err)
	b.ResetTimer()
	for b.Loop() {
		st, err := store.LoadStatus(ctx, pool, store.StatusQuery{TenantID: "a", Deployment: "dep"})
		require.NoError(b, err)
		require.Len(b, st.Deployments[0].Sessions, 20)
		require.NotEmpty(b, st.Deployments[0].Curve.Points)
	}
}
