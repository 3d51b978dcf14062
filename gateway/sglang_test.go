package gateway_test

import (
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/internal/fakesglang"
)

// TestSGLangDeploymentCapturesTheEnginesIDs: an SGLang deployment's calls
// are captured with the engine's own prompt and completion ids and
// logprobs (native /generate), streamed or not; a call that SGLang can
// answer only through its chat endpoint (it offers tools) has no ids, and
// its step says why it will not train instead of being queued.
func TestSGLangDeploymentCapturesTheEnginesIDs(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := &fakesglang.Fake{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	st, out := e.doJSON("POST", "/admin/v1/deployments", e.cfg.AdminKey, map[string]any{"name": "qwen-sglang",
		"upstream": map[string]any{"base_url": srv.URL + "/v1", "model": "Qwen/Qwen3-8B", "dialect": "sglang"}})
	require.Equal(t, 201, st, out)

	st, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{})
	require.Equal(t, 201, st, created)
	sid, skey := created["id"].(string), created["api_key"].(string)
	body := func(text string, extra ...any) map[string]any {
		b := map[string]any{"model": "qwen-sglang", "messages": []any{map[string]any{"role": "user", "content": text}}}
		for i := 0; i+1 < len(extra); i += 2 {
			b[extra[i].(string)] = extra[i+1]
		}
		return b
	}

	st, plain := e.doJSON("POST", "/v1/chat/completions", skey, body("hello"))
	require.Equal(t, 200, st, plain)
	row := e.captured(plain["id"].(string))
	require.Equal(t, "ok", row.Status)
	require.Equal(t, int32s("user:hello\n"), row.PromptIDs, "the ids SGLang's /v1/tokenize gave and /generate generated from")
	require.Equal(t, int32s("echo: hello"), row.CompletionIDs)
	require.Len(t, row.Logprobs, len("echo: hello"))
	require.Equal(t, "Qwen/Qwen3-8B", fake.Tokenizes()[0]["model"])

	st, _, raw := e.do("POST", "/v1/chat/completions", skey, body("streamed", "stream", true))
	require.Equal(t, 200, st, string(raw))
	require.Contains(t, string(raw), "data: [DONE]")
	require.Equal(t, true, fake.Generates()[1]["stream"])

	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "search", "parameters": map[string]any{"type": "object"}}}}
	st, called := e.doJSON("POST", "/v1/chat/completions", skey, body("weather in Paris", "tools", tools))
	require.Equal(t, 200, st, called)
	require.Empty(t, e.captured(called["id"].(string)).CompletionIDs, "SGLang's chat endpoint returns no ids")
	require.Len(t, fake.Generates(), 2, "tool calls are parsed only behind SGLang's chat endpoint")

	for _, id := range []any{plain["id"], called["id"]} {
		st, _ = e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": id, "value": 1})
		require.Equal(t, 201, st)
	}
	st, view := e.doJSON("GET", "/v1/sessions/"+sid, e.keyA, nil)
	require.Equal(t, 200, st, view)
	steps := view["steps"].([]any)
	require.Len(t, steps, 3)
	first, streamed, last := steps[0].(map[string]any), steps[1].(map[string]any), steps[2].(map[string]any)
	require.Equal(t, true, first["will_train"], first)
	require.Equal(t, true, streamed["will_train"], "the streamed step has its ids (and a return from the later reward): %v", streamed)
	require.Equal(t, false, last["will_train"], last)
	require.Equal(t, atdp.ReasonZeroTrainableTokens, last["reason"], "a step without ids is never queued")
	streamedRow := e.captured(streamed["completion_id"].(string))
	require.Equal(t, int32s("echo: streamed"), streamedRow.CompletionIDs)
	require.Equal(t, int32s("user:streamed\n"), streamedRow.PromptIDs)
}

func int32s(s string) []int32 {
	out := make([]int32, len(s))
	for i := range len(s) {
		out[i] = int32(s[i])
	}
	return out
}
