package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// TestExportIsWhatTrains captures a two-step session of the byte policy
// whose prompt holds an email, a phone and a card number, rewards it from
// two weighted sources with γ = 0.9, then lets rewards arrive late: once
// while its samples wait in the queue, once after they trained. At every
// stage the export and the queue must agree on every return, no queued
// id may spell the PII, the late reward must re-score the queued samples,
// and the one after training must say so on the step.
func TestExportIsWhatTrains(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	cfg := config.Default().Gateway
	cfg.RewardWeights, cfg.Discount = map[string]float64{"user": 1, "judge": 3}, 0.9
	rules, err := trajectory.NewRules(cfg, map[string]trajectory.Tokenizer{"d": trainer.Tokenizer{}})
	require.NoError(t, err)
	acts := &Session{DB: db, Rules: rules}

	secrets := []string{"bob@example.com", "+1 415 555 0100", "4111 1111 1111 1111"}
	_, err = db.Exec(ctx, `INSERT INTO sessions (id, tenant_id, deployment, task_id, identity_mode) VALUES ('s', 'acme', 'd', 'task', 'header')`)
	require.NoError(t, err)
	var history []inference.Message
	var ids []int64
	for i, text := range []string{"reach me at " + secrets[0] + " or " + secrets[1], "pay with " + secrets[2]} {
		history = append(history, inference.Message{Role: inference.RoleUser, Content: text})
		req, _ := json.Marshal(trajectory.StoredRequest{Request: &inference.Request{Model: "d", Messages: history}, Protocol: "openai"})
		resp, _ := json.Marshal(inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Content: "noted"}, FinishReason: "stop"})
		history = append(history, inference.Message{Role: inference.RoleAssistant, Content: "noted"})
		prompt, err := trainer.RenderPrompt(history[:len(history)-1], nil, "", nil)
		require.NoError(t, err)
		var tok trainer.Tokenizer
		var id int64
		require.NoError(t, db.QueryRow(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, response,
  prompt_token_ids, completion_token_ids, logprobs, prompt_tokens, completion_tokens, status, finish_reason)
VALUES ('acme', 's', $1, $2, 'openai', 'd', 'd@v0', $3, $4, $5, $6, $7, $8, 5, 'ok', 'stop') RETURNING id`,
			i, fmt.Sprintf("chatcmpl-%d", i), req, resp, int32s(prompt), int32s(tok.Encode("noted")), []float32{-1, -1, -1, -1, -1}, len(prompt)).Scan(&id))
		ids = append(ids, id)
	}
	seedRewardFrom(t, db, "s", &ids[0], 0.5, "user")
	seedRewardFrom(t, db, "s", &ids[0], 0.1, "judge")
	seedRewardFrom(t, db, "s", nil, 1, "user") // the outcome: the last step

	generation := 0
	assemble := func() flow.EnqueueOutput {
		generation++
		a, err := acts.AssembleTrajectory(ctx, flow.AssembleInput{SessionID: "s", TenantID: "acme", Key: fmt.Sprintf("k%d", generation)})
		require.NoError(t, err)
		e, err := acts.EnqueueSamples(ctx, flow.EnqueueInput{TrajectoryID: a.TrajectoryID, TenantID: "acme"})
		require.NoError(t, err)
		return e
	}
	// agree checks that the export and the queue carry the same returns
	// and that no queued id spells a secret.
	agree := func(want []float64) []*atdp.Step {
		var buf bytes.Buffer
		_, err := gateway.Export(ctx, db, rules, gateway.ExportOptions{Filter: store.SessionFilter{TenantID: "acme", SessionID: "s"}}, &buf)
		require.NoError(t, err)
		var steps []*atdp.Step
		r := atdp.NewReader(&buf)
		for {
			s, err := r.Next()
			if err != nil {
				break
			}
			steps = append(steps, s)
		}
		require.Len(t, steps, 2)
		rows, err := db.Query(ctx, `SELECT st.interaction_id, ts.reward, ts.prompt_token_ids, ts.completion_token_ids
			FROM training_samples ts JOIN atdp_steps st ON st.id = ts.step_id ORDER BY st.interaction_id`)
		require.NoError(t, err)
		defer rows.Close()
		n := 0
		for rows.Next() {
			var iid int64
			var reward float64
			var prompt, completion []int32
			require.NoError(t, rows.Scan(&iid, &reward, &prompt, &completion))
			i := n
			require.Equal(t, ids[i], iid)
			require.InDelta(t, want[i], reward, 1e-9, "queued sample %d", i)
			require.InDelta(t, want[i], *steps[i].Reward.Return, 1e-9, "exported step %d", i)
			var tok trainer.Tokenizer
			text := tok.Decode(ints(prompt)) + tok.Decode(ints(completion))
			for _, s := range secrets {
				require.NotContains(t, text, s, "no queued id spells the PII")
			}
			require.Contains(t, text, "[REDACTED_EMAIL]")
			require.Equal(t, steps[i].Action.Tokens.PromptIDs, ints(prompt), "what trains is the exported step")
			n++
		}
		require.Equal(t, 2, n)
		return steps
	}

	e := assemble()
	require.Equal(t, 2, e.Enqueued)
	// Step 1: (0.5 + 3·0.1)/4 = 0.2; step 2: 1. G_1 = 1, G_0 = 0.2 + 0.9.
	agree([]float64{1.1, 1})

	// A judge verdict on the outcome arrives while the samples are queued.
	seedRewardFrom(t, db, "s", nil, 0, "judge")
	e = assemble()
	require.Equal(t, 0, e.Enqueued)
	require.Equal(t, 2, e.Rescored, "the late reward re-scores the queued samples")
	// Step 2: (1 + 3·0)/4 = 0.25. G_0 = 0.2 + 0.9·0.25.
	agree([]float64{0.425, 0.25})

	// The samples train into d@v1; then the user changes their mind.
	run, err := store.ClaimBatch(ctx, db, "d", "run-1", 16, 10, 0)
	require.NoError(t, err)
	_, samples, err := store.LoadRun(ctx, db, run.ID)
	require.NoError(t, err)
	require.Len(t, samples, 2)
	require.NoError(t, store.CommitTrainedRun(ctx, db, store.TrainedRun{RunID: run.ID, Deployment: "d", Version: "d@v1", Metrics: map[string]any{}, Samples: samples}))
	seedRewardFrom(t, db, "s", nil, -1, "user")
	e = assemble()
	require.Equal(t, 0, e.Enqueued+e.Rescored)
	require.Equal(t, 2, e.AfterTraining, "both returns changed after both trained")
	sess, err := store.SessionForAssembly(ctx, db, "acme", "s")
	require.NoError(t, err)
	inter, err := store.SessionInteractions(ctx, db, "acme", "s")
	require.NoError(t, err)
	rewards, err := store.SessionRewards(ctx, db, "acme", "s")
	require.NoError(t, err)
	verdicts, err := store.AssembledSteps(ctx, db, "acme", "s")
	require.NoError(t, err)
	steps, _, err := trajectory.Build(sess, inter, rewards, rules, verdicts)
	require.NoError(t, err)
	for i, st := range steps {
		require.Equal(t, atdp.ReasonArrivedAfterTraining, st.Reason(), "step %d", i)
		require.Equal(t, []string{"d@v1"}, st.TrainedInto, "step %d", i)
	}
	// The samples keep what they trained with: the record of training is not rewritten.
	var trained []float64
	require.NoError(t, db.QueryRow(ctx, `SELECT array_agg(reward ORDER BY id) FROM training_samples`).Scan(&trained))
	require.InDeltaSlice(t, []float64{0.425, 0.25}, trained, 1e-9)

	// Re-assembling with nothing new changes nothing.
	e = assemble()
	require.Equal(t, 0, e.Enqueued+e.Rescored)
}

func seedRewardFrom(t *testing.T, db store.DBTX, session string, interaction *int64, value float64, source string) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO rewards (tenant_id, session_id, interaction_id, value, source) VALUES ('acme', $1, $2, $3, $4)`,
		session, interaction, value, source)
	require.NoError(t, err)
}

func int32s(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

func ints(xs []int32) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}
