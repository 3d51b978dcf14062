package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/trainer"
)

// toolTurn is one model call of a tool-using session: the tokens the
// conversation held before it (the prompt, which carries every earlier
// call, the tool results and the user's text) and the tokens it wrote.
type toolTurn struct {
	msgs       []inference.Message
	answer     inference.Message
	prompt     []int32
	completion []int32
}

// toolSession lays out a session of calls: ask → call the tool → (the
// tool answers) → … → answer, each call's prompt the conversation so far
// in token ids: the user's 4 tokens, then per call its completion and the
// tool result's 3 tokens. offset keeps sessions' ids apart.
func toolSession(calls, offset int) []toolTurn {
	user := []int32{1, 2, 3, 4}
	msgs := []inference.Message{{Role: inference.RoleUser, Content: "what is the total of invoice 7?"}}
	prompt := append([]int32(nil), user...)
	var turns []toolTurn
	for c := 0; c < calls; c++ {
		last := c == calls-1
		completion := []int32{int32(offset + 10*c + 100), int32(offset + 10*c + 101), int32(offset + 10*c + 102)}
		answer := inference.Message{Role: inference.RoleAssistant, ToolCalls: []inference.ToolCall{{ID: fmt.Sprintf("call%d", c), Name: "lookup", Arguments: `{"invoice":7}`}}}
		if last {
			answer = inference.Message{Role: inference.RoleAssistant, Content: "12"}
		}
		turns = append(turns, toolTurn{msgs: append([]inference.Message(nil), msgs...), answer: answer,
			prompt: append([]int32(nil), prompt...), completion: completion})
		tool := []int32{int32(offset + 10*c + 200), int32(offset + 10*c + 201), int32(offset + 10*c + 202)}
		msgs = append(msgs, answer, inference.Message{Role: inference.RoleTool, ToolCallID: fmt.Sprintf("call%d", c), Content: `{"total": 12}`})
		prompt = append(append(prompt, completion...), tool...)
	}
	return turns
}

// seedToolSession writes a captured multi-call session of a GRPO group:
// its calls with their token ids and the behaviour log-probs, and one
// reward for the whole session, given at its end.
func seedToolSession(t *testing.T, db *pgxpool.Pool, session, group string, turns []toolTurn, reward float64) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Exec(ctx, `INSERT INTO sessions (id, tenant_id, deployment, task_id, group_id, group_size, identity_mode)
		VALUES ($1, 'acme', 'dep', 'invoice-7', $2, 2, 'header')`, session, group)
	require.NoError(t, err)
	tools := []inference.Tool{{Name: "lookup", Parameters: json.RawMessage(`{"type":"object"}`)}}
	for i, tt := range turns {
		req, _ := json.Marshal(inference.Request{Model: "dep", Messages: tt.msgs, Tools: tools})
		resp, _ := json.Marshal(inference.Response{Message: tt.answer, FinishReason: "stop"})
		lps := make([]float32, len(tt.completion))
		for j := range lps {
			lps[j] = -0.25 * float32(j+1)
		}
		_, err := db.Exec(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, response,
  prompt_token_ids, completion_token_ids, logprobs, prompt_tokens, completion_tokens, status, finish_reason)
VALUES ('acme', $1, $2, $3, 'openai', 'dep', 'dep@v1', $4, $5, $6, $7, $8, $9, $10, 'ok', 'stop')`,
			session, i, fmt.Sprintf("chatcmpl-%s-%d", session, i), req, resp, tt.prompt, tt.completion, lps, len(tt.prompt), len(tt.completion))
		require.NoError(t, err)
	}
	seedReward(t, db, "acme", session, nil, reward, true)
}

// TestMultiTurnSamplesTrainWhatTheModelWrote: a GRPO group of two tool-
// using sessions of one task, rewarded only at their end (one solved it
// in three calls, one failed in two), assembled, queued, claimed and
// prepared as the deployment's trainer receives them. Token by token:
// only what the model wrote carries loss (never the user's text, never a
// tool's result, never an earlier call it sees again in its prompt), with
// the behaviour log-prob it was sampled at; the end reward reaches every
// call through the returns; and the group compares the two sessions, each
// counted once: ±1 for every call of each, not weighted by how many calls
// a session took.
func TestMultiTurnSamplesTrainWhatTheModelWrote(t *testing.T) {
	db := testenv.Pool(t)
	ctx := context.Background()
	seedTenant(t, db, "acme", true)
	seedVersions(t, db, "dep", "dep@v1")
	solved, failed := toolSession(3, 0), toolSession(2, 1000)
	seedToolSession(t, db, "solved", "g1", solved, 1)
	seedToolSession(t, db, "failed", "g1", failed, 0)
	acts := &Session{DB: db}
	for _, sid := range []string{"solved", "failed"} {
		a, err := acts.AssembleTrajectory(ctx, flow.AssembleInput{SessionID: sid, TenantID: "acme", Key: sid, Discount: 1})
		require.NoError(t, err)
		require.Equal(t, a.Steps, a.Eligible, "every call of %s trains", sid)
		_, err = acts.EnqueueSamples(ctx, flow.EnqueueInput{TrajectoryID: a.TrajectoryID, TenantID: "acme"})
		require.NoError(t, err)
	}
	dir := t.TempDir()
	tr := &Training{DB: db, CheckpointDir: filepath.Join(dir, "ckpt"), BatchDir: filepath.Join(dir, "batches")}
	claim, err := tr.ClaimBatch(ctx, flow.ClaimBatchInput{Deployment: "dep", RunKey: "mt", BatchSize: 2, MaxStaleness: 4})
	require.NoError(t, err)
	tb, err := tr.PrepareBatch(ctx, flow.PrepareBatchInput{Deployment: "dep", RunID: claim.RunID, Base: "dep@v1"})
	require.NoError(t, err)
	rows := rowsOf(t, tb)
	require.Len(t, rows, 5, "a sample per call: 3 + 2")

	want := map[string][]toolTurn{"solved": solved, "failed": failed}
	seen := map[string]int{}
	for _, r := range rows {
		s := sampleOf(r)
		turns := want[r.SessionID]
		require.NotNil(t, turns, r.SessionID)
		// Which call is it? Its prompt says.
		var tt *toolTurn
		for k := range turns {
			if len(turns[k].prompt) == len(r.PromptIDs) {
				tt = &turns[k]
			}
		}
		require.NotNil(t, tt, "a sample of %s with a %d-token prompt", r.SessionID, len(r.PromptIDs))
		seen[r.SessionID]++
		require.Equal(t, append(append([]int32(nil), tt.prompt...), tt.completion...), append(append([]int32(nil), r.PromptIDs...), r.CompletionIDs...))
		wantAdv := map[string]float64{"solved": 1, "failed": -1}[r.SessionID]
		require.InDelta(t, map[string]float64{"solved": 1, "failed": 0}[r.SessionID], r.Reward, 1e-9, "the end reward reaches every call (γ = 1)")
		require.NotNil(t, s.Advantage)
		require.InDelta(t, wantAdv, *s.Advantage, 1e-9, "the group compares whole sessions")
		p := len(tt.prompt)
		for i, id := range s.TokenIDs {
			trains := i >= p
			if trains {
				require.Equal(t, uint8(1), s.LossMask[i], "token %d (%d) of %s was written by the model: it trains", i, id, r.SessionID)
				require.InDelta(t, -0.25*float64(i-p+1), float64(s.Logprobs[i]), 1e-6, "with the log-prob it was sampled at")
				require.Equal(t, int64(1), s.Versions[i])
			} else {
				require.Equal(t, uint8(0), s.LossMask[i], "token %d (%d) of %s is the user's, a tool's or an earlier call's: no loss", i, id, r.SessionID)
			}
		}
	}
	require.Equal(t, map[string]int{"solved": 3, "failed": 2}, seen)

	// Counted per call instead, the 3-call session would outweigh the
	// 2-call one: rewards 1,1,1,0,0 normalise to +0.82 and −1.22.
	per := []trainer.Sample{{GroupID: "g", Reward: 1}, {GroupID: "g", Reward: 1}, {GroupID: "g", Reward: 1}, {GroupID: "g", Reward: 0}, {GroupID: "g", Reward: 0}}
	_, err = trainer.ComputeAdvantages(per, trainer.AdvantageConfig{}, trainer.NewBaseline(0.1))
	require.NoError(t, err)
	require.InDelta(t, 0.816, *per[0].Advantage, 1e-3)
	require.InDelta(t, -1.225, *per[4].Advantage, 1e-3)
}
