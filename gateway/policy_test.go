package gateway_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/policytest"
	"github.com/flywheel-ai/flywheel/trainer"
)

const policyModel = "flywheel-policy"

// withPolicy serves the built-in policy on its model server as the
// upstream deployment policyModel: v1 (seed 7) serves, and v2 (seed 8), a
// candidate, is loaded beside it, so a call that is not pinned to the
// serving version would show.
func withPolicy(t testing.TB, pool *pgxpool.Pool) *policytest.Policy {
	t.Helper()
	p := policytest.Start(t, pool, policytest.Options{Name: policyModel, DefaultMaxTokens: 4})
	m2, err := trainer.NewModel(trainer.ModelConfig{}, 8)
	require.NoError(t, err)
	p.Load(p.Candidate(m2, 2))
	return p
}

// TestPolicyPromptIDsAcrossTurns: the policy, on its model server, is
// captured with the ids, logprobs and serving version it answered with;
// turn 2's prompt ids begin with turn 1's prompt ids exactly. The reply
// comes back as text: vLLM's chat dialect takes no prompt ids, so the
// server renders it from the text the client was sent (a byte that is not
// UTF-8 became U+FFFD there), not from turn 1's completion ids. (CI saw the
// random model write a </tool_call> marker, which the text spells out.)
func TestPolicyPromptIDsAcrossTurns(t *testing.T) {
	e := newEnv(t, envOpts{policy: true})
	body := map[string]any{"model": policyModel, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}
	st, c1 := e.doJSON("POST", "/v1/chat/completions", e.keyA, body)
	require.Equal(t, 200, st, c1)
	first := e.captured(c1["id"].(string))
	require.Equal(t, "flywheel-policy@v1", first.Version, "the deployment's serving version is stamped, not the server's newest")
	require.NotEmpty(t, first.CompletionIDs)
	require.Len(t, first.Logprobs, len(first.CompletionIDs))

	reply := c1["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	content := reply["content"].(string)
	body["messages"] = []any{
		map[string]any{"role": "user", "content": "hi"},
		map[string]any{"role": "assistant", "content": content},
		map[string]any{"role": "user", "content": "more"},
	}
	st, c2 := e.doJSON("POST", "/v1/chat/completions", e.keyA, body)
	require.Equal(t, 200, st, c2)
	second := e.captured(c2["id"].(string))
	require.Equal(t, first.SessionID, second.SessionID)
	prefix := append([]int32{}, first.PromptIDs...)
	// The policy's tokenizer is byte-level, but a tool-call marker the
	// random model wrote comes back in the text and is one token again.
	for _, id := range (trainer.Tokenizer{}).Encode(content) {
		prefix = append(prefix, int32(id))
	}
	require.GreaterOrEqual(t, len(second.PromptIDs), len(prefix))
	require.Equal(t, prefix, second.PromptIDs[:len(prefix)])
}

// TestCanaryRoutingAndPlaybookInjection: a running weights release sends
// its share of sessions to the candidate; the serving playbook's lessons
// reach the system prompt of their own tenant only.
func TestCanaryRoutingAndPlaybookInjection(t *testing.T) {
	e := newEnv(t, envOpts{policy: true})
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO artefacts (deployment, kind, version, content, status)
		VALUES ($1, 'playbook', 1, '{"items":[{"id":"p1","content":"check units","tenant":"acme"},
			{"id":"p2","content":"globex secret lesson","tenant":"globex"},{"id":"p3","content":"unscoped lesson"}]}', 'serving')`, policyModel)
	require.NoError(t, err)
	body := func(s string) map[string]any {
		return map[string]any{"model": policyModel, "max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": s}}}
	}
	_, c := e.doJSON("POST", "/v1/chat/completions", e.keyA, body("a"))
	row := e.captured(c["id"].(string))
	require.Equal(t, "flywheel-policy@v1", row.Version, "the deployment's serving version wins over the server's newest")
	var req struct {
		Messages []struct{ Role, Content string }
		Injected string `json:"injected_system"`
	}
	require.NoError(t, json.Unmarshal(row.Request, &req))
	require.Equal(t, "system", req.Messages[0].Role)
	require.Contains(t, req.Messages[0].Content, "[p1] check units")
	require.NotContains(t, req.Messages[0].Content, "globex secret lesson", "another tenant's lesson never enters acme's prompt")
	require.NotContains(t, req.Messages[0].Content, "unscoped lesson", "a lesson of no known tenant is shown to no one")
	_, c = e.doJSON("POST", "/v1/chat/completions", e.keyB, body("b"))
	require.NoError(t, json.Unmarshal(e.captured(c["id"].(string)).Request, &req))
	require.Contains(t, req.Injected, "globex secret lesson")
	require.NotContains(t, req.Injected, "check units")

	_, err = e.pool.Exec(ctx, `INSERT INTO releases (deployment, layer, candidate, canary_share) VALUES ($1, 'weights', 'flywheel-policy@v2', 0.5)`, policyModel)
	require.NoError(t, err)
	versions := map[string]int{}
	eventually(t, func() bool {
		_, c := e.doJSON("POST", "/v1/chat/completions", e.keyA, body("x"))
		versions[e.captured(c["id"].(string)).Version]++
		return versions["flywheel-policy@v2"] > 0 && versions["flywheel-policy@v1"] > 0
	}, "about half of new sessions go to the canary once the route cache refreshes")
}

// TestLaterTurnsStoreOnlyWhatIsNew: a session's second turn is stored as
// the suffix beyond its first (the new messages and prompt ids, and which
// turn it continues), without the client's body again; read back, it is
// whole. A turn that edits the conversation shares only the unedited part.
func TestLaterTurnsStoreOnlyWhatIsNew(t *testing.T) {
	e := newEnv(t, envOpts{policy: true})
	ctx := context.Background()
	sys := map[string]any{"role": "system", "content": "You are terse."}
	body := map[string]any{"model": policyModel, "max_tokens": 4, "messages": []any{sys, map[string]any{"role": "user", "content": "hi"}}}
	st, c1 := e.doJSON("POST", "/v1/chat/completions", e.keyA, body, "X-Session-Id", "edits")
	require.Equal(t, 200, st, c1)
	reply := c1["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	body["messages"] = []any{sys, map[string]any{"role": "user", "content": "hi"},
		map[string]any{"role": "assistant", "content": reply["content"]}, map[string]any{"role": "user", "content": "more"}}
	st, c2 := e.doJSON("POST", "/v1/chat/completions", e.keyA, body, "X-Session-Id", "edits")
	require.Equal(t, 200, st, c2)
	body["messages"] = []any{sys, map[string]any{"role": "user", "content": "hi, edited"}}
	st, c3 := e.doJSON("POST", "/v1/chat/completions", e.keyA, body, "X-Session-Id", "edits")
	require.Equal(t, 200, st, c3)

	type stored struct {
		id, prefixID               int64
		prefixMessages, prefixToks int
		messages                   int
		promptIDs                  int
		request                    map[string]json.RawMessage
	}
	raw := func(completionID string) stored {
		var s stored
		var req []byte
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT id, coalesce(prefix_id, 0), prefix_messages, prefix_tokens,
			jsonb_array_length(request->'messages'), coalesce(array_length(prompt_token_ids, 1), 0), request
			FROM interactions WHERE completion_id = $1`, completionID).Scan(&s.id, &s.prefixID, &s.prefixMessages, &s.prefixToks,
			&s.messages, &s.promptIDs, &req))
		require.NoError(t, json.Unmarshal(req, &s.request))
		return s
	}
	first, second, third := raw(c1["id"].(string)), raw(c2["id"].(string)), raw(c3["id"].(string))
	require.Zero(t, first.prefixID, "a session's first turn is whole")
	require.Equal(t, 2, first.messages)
	require.NotContains(t, first.request, "client_request", "the client's body is not stored again beside its decoded form")
	require.NotContains(t, first.request, "prompt_token_ids")

	whole1, whole2 := e.captured(c1["id"].(string)), e.captured(c2["id"].(string))
	require.Equal(t, first.id, second.prefixID, "turn 2 continues turn 1")
	require.Equal(t, 3, second.prefixMessages, "system, user, and the reply")
	require.Equal(t, 1, second.messages, "only the new user message is stored")
	// The reply is rendered again from its text (TestPolicyPromptIDsAcrossTurns):
	// the ids turn 2 shares with turn 1 are reused, the rest stored.
	turn1 := append(append([]int32{}, whole1.PromptIDs...), whole1.CompletionIDs...)
	shared := 0
	for shared < len(turn1) && shared < len(whole2.PromptIDs) && turn1[shared] == whole2.PromptIDs[shared] {
		shared++
	}
	require.GreaterOrEqual(t, shared, len(whole1.PromptIDs), "turn 2 begins with turn 1's prompt")
	require.Equal(t, shared, second.prefixToks, "the ids turn 2 shares with turn 1 are reused")
	require.Equal(t, len(whole2.PromptIDs)-second.prefixToks, second.promptIDs)
	require.NotContains(t, second.request, "prompt_token_ids", "the reused ids are not stored in the request")

	require.Equal(t, second.id, third.prefixID, "an edit continues the session's last turn")
	require.Equal(t, 1, third.prefixMessages, "and shares only the system message")
	require.Equal(t, 1, third.messages)
	var req struct {
		Messages []struct{ Role, Content string }
	}
	require.NoError(t, json.Unmarshal(e.captured(c3["id"].(string)).Request, &req))
	require.Len(t, req.Messages, 2)
	require.Equal(t, "hi, edited", req.Messages[1].Content)
}
