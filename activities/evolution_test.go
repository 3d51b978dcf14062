package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// seedCall writes one interaction with the given messages and answer at t.
func seedCall(t *testing.T, db *pgxpool.Pool, tenant, session, dep string, seq int, msgs []inference.Message, answer string, at time.Time) int64 {
	t.Helper()
	ctx := context.Background()
	if seq == 0 {
		_, err := db.Exec(ctx, `INSERT INTO sessions (id, tenant_id, deployment, identity_mode) VALUES ($1, $2, $3, 'header')`, session, tenant, dep)
		require.NoError(t, err)
	}
	req, _ := json.Marshal(inference.Request{Model: dep, Messages: msgs})
	resp, _ := json.Marshal(inference.Response{Message: inference.Message{Role: "assistant", Content: answer}})
	var id int64
	err := db.QueryRow(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, response,
  prompt_tokens, completion_tokens, status, created_at)
VALUES ($1, $2, $3, $4, 'openai', $5, $6, $7, $8, 10, 5, 'ok', $9) RETURNING id`,
		tenant, session, seq, fmt.Sprintf("c-%s-%d", session, seq), dep, dep+"@v1", req, resp, at).Scan(&id)
	require.NoError(t, err)
	return id
}

func TestEvolutionEvidenceAndProposals(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedTenant(t, db, "globex", true)
	seedVersions(t, db, "dep", "dep@v1")
	now := time.Now()

	// Previous window: 4 good sessions.
	for i := 0; i < 4; i++ {
		sid := fmt.Sprintf("old-%d", i)
		id := seedCall(t, db, "acme", sid, "dep", 0, []inference.Message{{Role: "user", Content: "reset my password"}}, "Use the reset link.", now.Add(-90*time.Minute))
		seedReward(t, db, "acme", sid, &id, 1, false)
	}
	// This window: 4 sessions, two of them corrected, across both tenants,
	// with a tool that fails.
	for i := 0; i < 4; i++ {
		tenant := []string{"acme", "globex"}[i%2]
		sid := fmt.Sprintf("new-%d", i)
		msgs := []inference.Message{
			{Role: "user", Content: "what's the invoice total for march"},
			{Role: "assistant", ToolCalls: []inference.ToolCall{{ID: "call1", Name: "lookup_invoice", Arguments: `{"month":"march"}`}}},
			{Role: "tool", ToolCallID: "call1", Content: map[bool]string{true: "error: month must be a number", false: `{"total": 12}`}[i < 3]},
		}
		id := seedCall(t, db, tenant, sid, "dep", 0, msgs, "The total is 10.", now.Add(-10*time.Minute))
		if i < 2 {
			seedReward(t, db, tenant, sid, &id, -1, false)
			seedCall(t, db, tenant, sid, "dep", 1, append(msgs, inference.Message{Role: "assistant", Content: "The total is 10."},
				inference.Message{Role: "user", Content: "No, the total is 12; mail bob@example.com"}), "Sorry, 12.", now.Add(-9*time.Minute))
		} else {
			seedReward(t, db, tenant, sid, nil, 0.5, true)
		}
	}

	e := &Evolution{DB: db, Redactor: newRedactor(t), Now: func() time.Time { return now }}
	ev, err := e.ComputeEvidence(ctx, flow.EvidenceInput{Deployment: "dep", Window: time.Hour})
	require.NoError(t, err)
	require.Equal(t, 4, ev.Sessions)
	require.Equal(t, 4, ev.RewardedSessions)
	require.InDelta(t, 1, ev.RewardPrev, 1e-9)
	require.InDelta(t, (-1-1+0.5+0.5)/4.0, ev.RewardMean, 1e-9)
	require.InDelta(t, ev.RewardMean-1, ev.RewardTrend, 1e-9)
	require.InDelta(t, 0.5, ev.CorrectionRate, 1e-9)
	require.Equal(t, 2, ev.Tenants)
	require.Equal(t, 2, ev.FailingTenants)
	require.Equal(t, []evolution.ToolFailure{
		{Tenant: "acme", Tool: "lookup_invoice", Calls: 2, Failures: 2, Rate: 1, Example: "error: month must be a number", Sessions: []string{"new-0", "new-2"}},
		{Tenant: "globex", Tool: "lookup_invoice", Calls: 2, Failures: 1, Rate: 0.5, Example: "error: month must be a number", Sessions: []string{"new-1"}},
	}, ev.ToolFailures, "each tenant's tool is its own cluster")
	require.InDelta(t, 1, ev.Drift, 1e-9, "password questions then invoice questions")
	require.Equal(t, "dep@v1", ev.ServingVersion)

	d := evolution.Decide(ev, evolution.Thresholds{MinSessions: 4, MinToolCalls: 2, ToolFailureRate: 0.8})
	require.Equal(t, evolution.DecisionToolSchema, d.Kind)
	require.Equal(t, "acme", d.Tenant, "acme's cluster fails often enough; globex's does not")
	id, err := e.RecordDecision(ctx, flow.RecordDecisionInput{Deployment: "dep", Decision: d, Evidence: ev, Trigger: "test"})
	require.NoError(t, err)
	rows, err := store.ListDecisions(ctx, db, "dep", 10)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, id, rows[0].ID)
	require.Contains(t, string(rows[0].Evidence), `"correction_rate": 0.5`)

	_, err = e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerToolSchema, Target: d.Target, Tenant: "initech", Evidence: ev, Key: "w1b"})
	require.ErrorContains(t, err, "not in the evidence")

	// A tenant that does not train by default corrects the agent too: its
	// text must not reach the playbook at all.
	seedTenant(t, db, "initech", false)
	optedOut := []inference.Message{{Role: "user", Content: "what is our merger codename"}}
	oid := seedCall(t, db, "initech", "private-1", "dep", 0, optedOut, "I do not know.", now.Add(-8*time.Minute))
	seedReward(t, db, "initech", "private-1", &oid, -1, false)
	seedCall(t, db, "initech", "private-1", "dep", 1, append(optedOut, inference.Message{Role: "assistant", Content: "I do not know."},
		inference.Message{Role: "user", Content: "No, it is BLUEBIRD-42"}), "Noted.", now.Add(-7*time.Minute))
	again, err := e.ComputeEvidence(ctx, flow.EvidenceInput{Deployment: "dep", Window: time.Hour})
	require.NoError(t, err)
	require.Equal(t, 4, again.Sessions, "an opted-out session is not evidence for any layer")
	require.Equal(t, 2, again.Tenants)
	require.Equal(t, ev.CorrectionRate, again.CorrectionRate)

	// Nothing corrected in an empty window: nothing to propose.
	e.Now = func() time.Time { return now.Add(24 * time.Hour) }
	none, err := e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerPlaybook, Window: time.Hour, Key: "w4"})
	require.NoError(t, err)
	require.Zero(t, none.Version)
	require.NotEmpty(t, none.Reason)
}

func TestRollbackVersion(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedVersions(t, db, "dep", "dep@v2", "dep@v1")
	e := &Evolution{DB: db}
	from, err := e.RollbackVersion(ctx, flow.RollbackInput{Deployment: "dep", To: "dep@v1", Reason: "reward fell"})
	require.NoError(t, err)
	require.Equal(t, "dep@v2", from)
	serving, err := store.ServingOf(ctx, db, "dep", artefact.LayerWeights)
	require.NoError(t, err)
	require.Equal(t, "dep@v1", serving)
	var status, why string
	require.NoError(t, db.QueryRow(ctx, `SELECT status, retired_reason FROM model_versions WHERE id = 'dep@v2'`).Scan(&status, &why))
	require.Equal(t, "rolled_back", status)
	require.Equal(t, "reward fell", why)
	rel, err := store.ListReleases(ctx, db, "dep", 5)
	require.NoError(t, err)
	require.Equal(t, "rolled_back", rel[0].Status)

	_, err = e.RollbackVersion(ctx, flow.RollbackInput{Deployment: "dep", To: "dep@v2", Reason: "x"})
	require.ErrorContains(t, err, "cannot serve")
	_, err = e.RollbackVersion(ctx, flow.RollbackInput{Deployment: "dep", To: "dep@v9", Reason: "x"})
	require.ErrorContains(t, err, "not found")
}
