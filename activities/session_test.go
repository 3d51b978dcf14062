package activities

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trajectory"
	"github.com/flywheel-ai/flywheel/workflows"
)

// seedInteraction is one captured call to seed.
type seedInteraction struct {
	status     string
	prompt     string
	completion string
	tokens     int // completion tokens (0: none captured)
	version    string
}

func seedTenant(t *testing.T, db *pgxpool.Pool, tenant string, trainByDefault bool) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO tenants (id, name, train_by_default) VALUES ($1, $1, $2)`, tenant, trainByDefault)
	require.NoError(t, err)
}

// seedSession writes a session with its interactions and returns their ids.
func seedSession(t *testing.T, db *pgxpool.Pool, tenant, session, deployment string, calls []seedInteraction) []int64 {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO sessions (id, tenant_id, deployment, task_id, identity_mode) VALUES ($1, $2, $3, 'task-a', 'header')`, session, tenant, deployment)
	require.NoError(t, err)
	var ids []int64
	var history []inference.Message
	for i, c := range calls {
		history = append(history, inference.Message{Role: inference.RoleUser, Content: c.prompt})
		req, _ := json.Marshal(inference.Request{Model: deployment, Messages: history})
		resp, _ := json.Marshal(inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Content: c.completion}, FinishReason: "stop"})
		history = append(history, inference.Message{Role: inference.RoleAssistant, Content: c.completion})
		var comp []int32
		var lps []float32
		for j := 0; j < c.tokens; j++ {
			comp = append(comp, int32(10+j))
			lps = append(lps, -0.5)
		}
		version := c.version
		if version == "" {
			version = deployment + "@v1"
		}
		var id int64
		err := db.QueryRow(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, response,
  prompt_token_ids, completion_token_ids, logprobs, prompt_tokens, completion_tokens, status, finish_reason)
VALUES ($1, $2, $3, $4, 'openai', $5, $6, $7, $8, $9, $10, $11, 3, $12, $13, 'stop') RETURNING id`,
			tenant, session, i, fmt.Sprintf("chatcmpl-%s-%d", session, i), deployment, version, req, resp,
			[]int32{1, 2, 3}, comp, lps, c.tokens, c.status).Scan(&id)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

func seedReward(t *testing.T, db *pgxpool.Pool, tenant, session string, interaction *int64, value float64, final bool) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO rewards (tenant_id, session_id, interaction_id, value, final) VALUES ($1, $2, $3, $4, $5)`,
		tenant, session, interaction, value, final)
	require.NoError(t, err)
}

func newRedactor(t *testing.T) *redact.Redactor {
	r, err := redact.New(redact.Options{})
	require.NoError(t, err)
	return r
}

// testRules are the default rules (γ = 1, weights user=1) with the byte
// policy's tokenizer under the deployments tests use.
func testRules(t *testing.T) trajectory.Rules {
	r, err := trajectory.NewRules(config.Default().Gateway, map[string]trajectory.Tokenizer{"d": trainer.Tokenizer{}, "flywheel-policy": trainer.Tokenizer{}})
	require.NoError(t, err)
	return r
}

func TestSessionActivitiesAreIdempotent(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	ids := seedSession(t, db, "acme", "s1", "dep", []seedInteraction{
		{status: "ok", prompt: "add 2+2", completion: "4", tokens: 2},
		{status: "upstream_error", prompt: "again"},
		{status: "ok", prompt: "and 3+3", completion: "6", tokens: 3},
	})
	seedReward(t, db, "acme", "s1", &ids[0], 1, false)
	seedReward(t, db, "acme", "s1", nil, 0.5, true)
	acts := &Session{DB: db, Rules: testRules(t)}

	in := workflows.AssembleInput{SessionID: "s1", TenantID: "acme", Key: "s1/run-1", Discount: 1}
	a1, err := acts.AssembleTrajectory(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 3, a1.Steps)
	require.Equal(t, 2, a1.Eligible)
	require.Equal(t, map[string]int{atdp.ReasonUpstreamError: 1}, a1.Ineligible)
	require.InDelta(t, 1.5, a1.TotalReward, 1e-12)
	a2, err := acts.AssembleTrajectory(ctx, in)
	require.NoError(t, err)
	require.Equal(t, a1, a2, "a retried assembly returns the first trajectory")

	e1, err := acts.EnqueueSamples(ctx, workflows.EnqueueInput{TrajectoryID: a1.TrajectoryID, TenantID: "acme"})
	require.NoError(t, err)
	require.Equal(t, 2, e1.Enqueued)
	e2, err := acts.EnqueueSamples(ctx, workflows.EnqueueInput{TrajectoryID: a1.TrajectoryID, TenantID: "acme"})
	require.NoError(t, err)
	require.Equal(t, 0, e2.Enqueued)
	require.Equal(t, 2, e2.AlreadyQueued)

	// A re-assembly (a later run after a late reward) must not queue the
	// same interactions again.
	a3, err := acts.AssembleTrajectory(ctx, workflows.AssembleInput{SessionID: "s1", TenantID: "acme", Key: "s1/run-2", Discount: 1})
	require.NoError(t, err)
	require.NotEqual(t, a1.TrajectoryID, a3.TrajectoryID)
	e3, err := acts.EnqueueSamples(ctx, workflows.EnqueueInput{TrajectoryID: a3.TrajectoryID, TenantID: "acme"})
	require.NoError(t, err)
	require.Equal(t, 0, e3.Enqueued)

	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM training_samples`).Scan(&n))
	require.Equal(t, 2, n)
	var rewards []float64
	rows, err := db.Query(ctx, `SELECT reward FROM training_samples ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var r float64
		require.NoError(t, rows.Scan(&r))
		rewards = append(rewards, r)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []float64{1.5, 0.5}, rewards, "sample reward is the discounted return (γ=1)")

	// Another tenant's id finds nothing.
	_, err = acts.AssembleTrajectory(ctx, workflows.AssembleInput{SessionID: "s1", TenantID: "other", Key: "x", Discount: 1})
	require.Error(t, err)

	require.NoError(t, acts.EndSession(ctx, workflows.EndSessionInput{SessionID: "s1", TenantID: "acme"}))
	var status string
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM sessions WHERE id = 's1'`).Scan(&status))
	require.Equal(t, "ended", status)
}

// TestSessionWorkflowRetryAfterCommitQueuesOnce runs SessionWorkflow with
// the real activities on a real database, where each activity's first
// attempt commits its work and then fails (a worker that dies after the
// commit): the retries must not duplicate a trajectory or a sample.
func TestSessionWorkflowRetryAfterCommitQueuesOnce(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	ids := seedSession(t, db, "acme", "s2", "dep", []seedInteraction{
		{status: "ok", prompt: "q1", completion: "a1", tokens: 2},
		{status: "ok", prompt: "q2", completion: "a2", tokens: 2},
	})
	seedReward(t, db, "acme", "s2", &ids[1], 1, true)
	real := &Session{DB: db, Rules: testRules(t)}

	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(workflows.SessionWorkflow, workflow.RegisterOptions{Name: workflows.SessionWorkflowName})
	attempts := map[string]int{}
	crashOnce := func(name string, err error) error {
		attempts[name]++
		if err == nil && attempts[name] == 1 {
			return errors.New("worker lost after commit")
		}
		return err
	}
	env.RegisterActivityWithOptions(func(ctx context.Context, in workflows.AssembleInput) (workflows.AssembleOutput, error) {
		out, err := real.AssembleTrajectory(ctx, in)
		return out, crashOnce("assemble", err)
	}, activity.RegisterOptions{Name: workflows.AssembleTrajectoryActivity})
	env.RegisterActivityWithOptions(func(ctx context.Context, in workflows.EnqueueInput) (workflows.EnqueueOutput, error) {
		out, err := real.EnqueueSamples(ctx, in)
		return out, crashOnce("enqueue", err)
	}, activity.RegisterOptions{Name: workflows.EnqueueSamplesActivity})
	env.RegisterActivityWithOptions(real.EndSession, activity.RegisterOptions{Name: workflows.EndSessionActivity})
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(workflows.SessionEventsSignal, workflows.SessionEvents{Events: []workflows.SessionEvent{
			{Kind: workflows.EventStep, InteractionID: ids[0]}, {Kind: workflows.EventStep, InteractionID: ids[1]},
			{Kind: workflows.EventReward, Final: true}, {Kind: workflows.EventEnd},
		}})
	}, time.Second)
	env.ExecuteWorkflow(workflows.SessionWorkflow, workflows.SessionInput{SessionID: "s2", TenantID: "acme", Deployment: "dep"})
	require.NoError(t, env.GetWorkflowError())
	var res workflows.SessionResult
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
