package activities_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/activities"
	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/workflows"
)

func TestForgetRetiresVersionsTrainedOnTheData(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	activities.SeedTenant(t, db, "acme", true)
	activities.SeedSession(t, db, "acme", "s-forget", "dep", []activities.SeedInteraction{{Status: "ok", Prompt: "my card is 4111", Completion: "ok", Tokens: 1}})
	activities.SeedSession(t, db, "acme", "s-keep", "dep", []activities.SeedInteraction{{Status: "ok", Prompt: "hi", Completion: "ok", Tokens: 1}})
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	// v1 clean (superseded) → v2 trained on s-forget (serving) → v3, a
	// candidate descended from v2 in a running release; v4 trained on
	// s-keep only, from v1, rolled back earlier.
	exec(`INSERT INTO deployments (name, backend, serving_version) VALUES ('dep', 'policy', 'dep@v2')`)
	exec(`INSERT INTO model_versions (id, deployment, status, created_at) VALUES ('dep@v1', 'dep', 'superseded', now() - interval '3 hours')`)
	exec(`INSERT INTO model_versions (id, deployment, parent_version, status, created_at) VALUES ('dep@v2', 'dep', 'dep@v1', 'serving', now() - interval '2 hours')`)
	exec(`INSERT INTO model_versions (id, deployment, parent_version, status) VALUES ('dep@v3', 'dep', 'dep@v2', 'candidate')`)
	exec(`INSERT INTO model_versions (id, deployment, parent_version, status) VALUES ('dep@v4', 'dep', 'dep@v1', 'rolled_back')`)
	exec(`INSERT INTO model_version_lineage (version_id, sample_id, tenant_id, session_id) VALUES ('dep@v2', 1, 'acme', 's-forget'), ('dep@v2', 2, 'acme', 's-keep'), ('dep@v4', 3, 'acme', 's-keep')`)
	exec(`INSERT INTO releases (deployment, layer, candidate, baseline, status, canary_share, phase, workflow_id) VALUES ('dep', 'weights', 'dep@v3', 'dep@v2', 'running', 0.1, 'canary', 'release-x')`)

	// The gateway's half: delete the data, record the request.
	res, err := store.Forget(ctx, db, "acme", "session", "s-forget")
	require.NoError(t, err)
	require.Equal(t, []string{"dep@v2"}, res.AffectedVersions)

	var ts testsuite.WorkflowTestSuite
	env := newWorkflowEnv(&ts)
	env.RegisterWorkflowWithOptions(workflows.ForgetWorkflow, workflow.RegisterOptions{Name: flow.ForgetWorkflowName})
	f := &activities.Forget{DB: db}
	env.RegisterActivityWithOptions(f.RetireForgotten, activity.RegisterOptions{Name: flow.ActivityName((*activities.Forget).RetireForgotten)})
	// The training loop is told to go on from the clean version.
	env.OnSignalExternalWorkflow(mock.Anything, flow.TrainingWorkflowID("dep"), "", flow.ServingChangedSignal,
		flow.ServingChanged{Version: "dep@v1", Reason: fmt.Sprintf("forget request %d", res.ID)}).Return(nil).Once()
	env.ExecuteWorkflow(workflows.ForgetWorkflow, flow.ForgetInput{RequestID: res.ID})
	require.NoError(t, env.GetWorkflowError())
	var out flow.ForgetResult
	require.NoError(t, env.GetWorkflowResult(&out))
	require.Equal(t, []string{"dep@v2", "dep@v3"}, out.Retired, "descendants of a forgotten version are retired too")
	require.Equal(t, map[string]string{"dep": "dep@v1"}, out.Rollbacks, "serving rolls back to the newest clean version")
	env.AssertExpectations(t)

	status := func(id string) string {
		var s string
		require.NoError(t, db.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = $1`, id).Scan(&s))
		return s
	}
	require.Equal(t, "serving", status("dep@v1"))
	require.Equal(t, "retired", status("dep@v2"))
	require.Equal(t, "retired", status("dep@v3"))
	require.Equal(t, "rolled_back", status("dep@v4"), "versions not trained on the data are untouched")
	serving, err := store.ServingOf(ctx, db, "dep", artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, "dep@v1", serving)
	_, err = store.RunningRelease(ctx, db, "dep", artefact.LayerWeights)
	require.ErrorIs(t, err, store.ErrNotFound, "the release of a retired candidate stops routing")
	var affected []string
	require.NoError(t, db.QueryRow(ctx, `SELECT affected_versions FROM forget_requests WHERE id = $1`, res.ID).Scan(&affected))
	require.Equal(t, []string{"dep@v2", "dep@v3"}, affected)

	// Again: nothing more changes.
	again, err := f.RetireForgotten(ctx, flow.ForgetInput{RequestID: res.ID})
	require.NoError(t, err)
	require.Empty(t, again.Rollbacks)
	require.Equal(t, "dep@v1", func() string { s, _ := store.ServingOf(ctx, db, "dep", artefact.LayerWeights); return s }())

	_, err = f.RetireForgotten(ctx, flow.ForgetInput{RequestID: 999})
	require.ErrorContains(t, err, "not found")
}

func TestSessionWorkflowRetryAfterCommitQueuesOnce(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	activities.SeedTenant(t, db, "acme", true)
	ids := activities.SeedSession(t, db, "acme", "s2", "dep", []activities.SeedInteraction{
		{Status: "ok", Prompt: "q1", Completion: "a1", Tokens: 2},
		{Status: "ok", Prompt: "q2", Completion: "a2", Tokens: 2},
	})
	activities.SeedReward(t, db, "acme", "s2", &ids[1], 1, true)
	real := &activities.Session{DB: db, Rules: activities.TestRules(t)}

	var ts testsuite.WorkflowTestSuite
	env := newWorkflowEnv(&ts)
	env.RegisterWorkflowWithOptions(workflows.SessionWorkflow, workflow.RegisterOptions{Name: flow.SessionWorkflowName})
	attempts := map[string]int{}
	crashOnce := func(name string, err error) error {
		attempts[name]++
		if err == nil && attempts[name] == 1 {
			return errors.New("worker lost after commit")
		}
		return err
	}
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.AssembleInput) (flow.AssembleOutput, error) {
		out, err := real.AssembleTrajectory(ctx, in)
		return out, crashOnce("assemble", err)
	}, activity.RegisterOptions{Name: flow.ActivityName((*activities.Session).AssembleTrajectory)})
	env.RegisterActivityWithOptions(func(ctx context.Context, in flow.EnqueueInput) (flow.EnqueueOutput, error) {
		out, err := real.EnqueueSamples(ctx, in)
		return out, crashOnce("enqueue", err)
	}, activity.RegisterOptions{Name: flow.ActivityName((*activities.Session).EnqueueSamples)})
	env.RegisterActivityWithOptions(real.EndSession, activity.RegisterOptions{Name: flow.ActivityName((*activities.Session).EndSession)})
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(flow.SessionEventsSignal, flow.SessionEvents{Events: []flow.SessionEvent{
			{Kind: flow.EventStep, InteractionID: ids[0]}, {Kind: flow.EventStep, InteractionID: ids[1]},
			{Kind: flow.EventReward, Final: true}, {Kind: flow.EventEnd},
		}})
	}, time.Second)
	env.ExecuteWorkflow(workflows.SessionWorkflow, flow.SessionInput{SessionID: "s2", TenantID: "acme", Deployment: "dep"})
	require.NoError(t, env.GetWorkflowError())
	var res flow.SessionResult
	require.NoError(t, env.GetWorkflowResult(&res))
	require.Equal(t, 2, attempts["assemble"])
	require.Equal(t, 2, attempts["enqueue"])
	require.Equal(t, 2, res.State.Enqueued)

	var trajectories, samples int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM trajectories WHERE session_id = 's2'`).Scan(&trajectories))
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM training_samples`).Scan(&samples))
	require.Equal(t, 1, trajectories)
	require.Equal(t, 2, samples)
}
