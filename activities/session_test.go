package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/redact"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// seedInteraction is one captured call to seed.
type seedInteraction struct {
	Status     string
	Prompt     string
	Completion string
	Tokens     int // completion tokens (0: none captured)
	Version    string
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
		history = append(history, inference.Message{Role: inference.RoleUser, Content: c.Prompt})
		req, _ := json.Marshal(inference.Request{Model: deployment, Messages: history})
		resp, _ := json.Marshal(inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Content: c.Completion}, FinishReason: "stop"})
		history = append(history, inference.Message{Role: inference.RoleAssistant, Content: c.Completion})
		var comp []int32
		var lps []float32
		for j := 0; j < c.Tokens; j++ {
			comp = append(comp, int32(10+j))
			lps = append(lps, -0.5)
		}
		version := c.Version
		if version == "" {
			version = deployment + "@v1"
		}
		var id int64
		err := db.QueryRow(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, response,
  prompt_token_ids, completion_token_ids, logprobs, prompt_tokens, completion_tokens, status, finish_reason)
VALUES ($1, $2, $3, $4, 'openai', $5, $6, $7, $8, $9, $10, $11, 3, $12, $13, 'stop') RETURNING id`,
			tenant, session, i, fmt.Sprintf("chatcmpl-%s-%d", session, i), deployment, version, req, resp,
			[]int32{1, 2, 3}, comp, lps, c.Tokens, c.Status).Scan(&id)
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
		{Status: "ok", Prompt: "add 2+2", Completion: "4", Tokens: 2},
		{Status: "upstream_error", Prompt: "again"},
		{Status: "ok", Prompt: "and 3+3", Completion: "6", Tokens: 3},
	})
	seedReward(t, db, "acme", "s1", &ids[0], 1, false)
	seedReward(t, db, "acme", "s1", nil, 0.5, true)
	acts := &Session{DB: db, Rules: testRules(t)}

	in := flow.AssembleInput{SessionID: "s1", TenantID: "acme", Key: "s1/run-1", Discount: 1}
	a1, err := acts.AssembleTrajectory(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 3, a1.Steps)
	require.Equal(t, 2, a1.Eligible)
	require.Equal(t, map[string]int{atdp.ReasonUpstreamError: 1}, a1.Ineligible)
	require.InDelta(t, 1.5, a1.TotalReward, 1e-12)
	a2, err := acts.AssembleTrajectory(ctx, in)
	require.NoError(t, err)
	require.Equal(t, a1, a2, "a retried assembly returns the first trajectory")

	e1, err := acts.EnqueueSamples(ctx, flow.EnqueueInput{TrajectoryID: a1.TrajectoryID, TenantID: "acme"})
	require.NoError(t, err)
	require.Equal(t, 2, e1.Enqueued)
	e2, err := acts.EnqueueSamples(ctx, flow.EnqueueInput{TrajectoryID: a1.TrajectoryID, TenantID: "acme"})
	require.NoError(t, err)
	require.Equal(t, 0, e2.Enqueued)
	require.Equal(t, 2, e2.AlreadyQueued)

	// A re-assembly (a later run after a late reward) must not queue the
	// same interactions again.
	a3, err := acts.AssembleTrajectory(ctx, flow.AssembleInput{SessionID: "s1", TenantID: "acme", Key: "s1/run-2", Discount: 1})
	require.NoError(t, err)
	require.NotEqual(t, a1.TrajectoryID, a3.TrajectoryID)
	e3, err := acts.EnqueueSamples(ctx, flow.EnqueueInput{TrajectoryID: a3.TrajectoryID, TenantID: "acme"})
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
	_, err = acts.AssembleTrajectory(ctx, flow.AssembleInput{SessionID: "s1", TenantID: "other", Key: "x", Discount: 1})
	require.Error(t, err)

	require.NoError(t, acts.EndSession(ctx, flow.EndSessionInput{SessionID: "s1", TenantID: "acme"}))
	var status string
	require.NoError(t, db.QueryRow(ctx, `SELECT status FROM sessions WHERE id = 's1'`).Scan(&status))
	require.Equal(t, "ended", status)
}

// TestSessionWorkflowRetryAfterCommitQueuesOnce runs SessionWorkflow with
// the real activities on a real database, where each activity's first
// attempt commits its work and then fails (a worker that dies after the
// commit): the retries must not duplicate a trajectory or a sample.
