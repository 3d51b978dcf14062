package modelserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TestUpstreamCompleteAndStream: the gateway's vLLM client gets from this
// server what it gets from vLLM: the prompt's ids, completion ids aligned
// with logprobs and token text, the served name as the version, and the
// base's real weights (the same answer as the engine serving them).
func TestUpstreamCompleteAndStream(t *testing.T) {
	e := newEnv(t, modelserver.Config{})
	b := e.backend(t)
	ctx := context.Background()
	seed := int64(7)
	req := &inference.Request{Messages: []inference.Message{{Role: inference.RoleSystem, Content: "be brief"}, {Role: inference.RoleUser, Content: "hello"}},
		MaxTokens: 24, Seed: &seed, TopLogprobs: 3}
	prompt, err := trainer.RenderPrompt(req.Messages, nil, "", nil)
	require.NoError(t, err)

	resp, err := b.Complete(ctx, req)
	require.NoError(t, err)
	require.Equal(t, served, resp.ModelVersion)
	require.Equal(t, prompt, resp.PromptTokenIDs)
	require.NotEmpty(t, resp.CompletionTokenIDs)
	require.Len(t, resp.Logprobs, len(resp.CompletionTokenIDs))
	require.Len(t, resp.CompletionTokens, len(resp.CompletionTokenIDs))
	require.Len(t, resp.TopLogprobs, len(resp.CompletionTokenIDs))
	for i, id := range resp.CompletionTokenIDs {
		require.Equal(t, jsonText(trainer.TokenText(id)), resp.CompletionTokens[i])
		require.Len(t, resp.TopLogprobs[i], 3)
		require.GreaterOrEqual(t, resp.TopLogprobs[i][0].Logprob, resp.Logprobs[i], "the best alternative is at least as likely")
	}
	require.Equal(t, inference.Usage{PromptTokens: len(prompt), CompletionTokens: len(resp.CompletionTokenIDs)}, resp.Usage)
	want := direct(t, e.base, req)
	require.Equal(t, want.CompletionTokenIDs, resp.CompletionTokenIDs, "the base's weights, the engine's sampler")
	require.Equal(t, want.Logprobs, resp.Logprobs)
	require.Equal(t, jsonText(want.Message.Content), resp.Message.Content)
	require.Equal(t, want.FinishReason, resp.FinishReason)

	var text strings.Builder
	var ids []int
	var lps []float32
	var tokens []string
	streamed, err := b.Stream(ctx, req, func(d inference.Delta) error {
		text.WriteString(d.Text)
		ids = append(ids, d.TokenIDs...)
		lps = append(lps, d.Logprobs...)
		tokens = append(tokens, d.Tokens...)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, served, streamed.ModelVersion)
	require.Equal(t, prompt, streamed.PromptTokenIDs)
	require.Equal(t, ids, streamed.CompletionTokenIDs, "the assembled answer is what the deltas carried")
	require.Equal(t, lps, streamed.Logprobs)
	require.Equal(t, tokens, streamed.CompletionTokens)
	require.Equal(t, text.String(), streamed.Message.Content)
	require.Equal(t, resp.CompletionTokenIDs, streamed.CompletionTokenIDs, "same seed, same tokens, streamed or not")
	require.Equal(t, resp.Logprobs, streamed.Logprobs)
	require.Equal(t, resp.Message.Content, streamed.Message.Content)
	require.Equal(t, resp.FinishReason, streamed.FinishReason)
	require.Equal(t, resp.Usage, streamed.Usage)

	n, err := b.CountTokens(ctx, req)
	require.NoError(t, err)
	require.Equal(t, len(resp.PromptTokenIDs), n)

	// Tools are rendered into the prompt; the count still matches.
	withTools := *req
	withTools.Tools = []inference.Tool{{Name: "search", Description: "find", Parameters: json.RawMessage(`{"type":"object"}`)}}
	resp, err = b.Complete(ctx, &withTools)
	require.NoError(t, err)
	n, err = b.CountTokens(ctx, &withTools)
	require.NoError(t, err)
	require.Equal(t, len(resp.PromptTokenIDs), n)
	require.Greater(t, n, len(prompt))
}

// TestChatWireShape checks vLLM's JSON itself: ids only when asked,
// "token_id:N" tokens, bytes as numbers, null logprobs when not asked,
// and the stream's role, finish, usage and [DONE] chunks.
func TestChatWireShape(t *testing.T) {
	e := newEnv(t, modelserver.Config{})
	msgs := []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}}}}
	status, body := e.post(t, "/v1/chat/completions", map[string]any{"model": served, "messages": msgs, "max_completion_tokens": 5,
		"logprobs": true, "top_logprobs": 2, "return_token_ids": true, "return_tokens_as_token_ids": true, "seed": 1, "unknown_field": 1})
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.True(t, strings.HasPrefix(body["id"].(string), "chatcmpl-"))
	require.Equal(t, "chat.completion", body["object"])
	require.Equal(t, served, body["model"])
	require.Positive(t, body["created"])
	prompt, err := trainer.RenderPrompt([]inference.Message{{Role: "user", Content: "hi\nthere"}}, nil, "", nil)
	require.NoError(t, err)
	require.Equal(t, toFloats(prompt), body["prompt_token_ids"], "text parts joined by newlines")
	choice := body["choices"].([]any)[0].(map[string]any)
	ids := choice["token_ids"].([]any)
	require.NotEmpty(t, ids)
	require.LessOrEqual(t, len(ids), 5)
	require.Equal(t, "assistant", choice["message"].(map[string]any)["role"])
	require.Equal(t, []any{}, choice["message"].(map[string]any)["tool_calls"])
	content := choice["logprobs"].(map[string]any)["content"].([]any)
	require.Len(t, content, len(ids))
	for i, c := range content {
		lp := c.(map[string]any)
		tok := "token_id:" + strconv.Itoa(int(ids[i].(float64)))
		require.Equal(t, tok, lp["token"])
		require.Equal(t, toFloats(bytesOf(tok)), lp["bytes"])
		require.Len(t, lp["top_logprobs"], 2)
	}
	usage := body["usage"].(map[string]any)
	require.Equal(t, usage["prompt_tokens"].(float64)+usage["completion_tokens"].(float64), usage["total_tokens"])

	status, body = e.post(t, "/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 3})
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.Equal(t, served, body["model"], "no model: the base, as vLLM answers")
	choice = body["choices"].([]any)[0].(map[string]any)
	require.Contains(t, choice, "logprobs")
	require.Nil(t, choice["logprobs"])
	require.NotContains(t, choice, "token_ids")
	require.NotContains(t, body, "prompt_token_ids")

	raw, err := json.Marshal(map[string]any{"model": served, "messages": msgs, "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "logprobs": true, "return_token_ids": true})
	require.NoError(t, err)
	resp, err := http.Post(e.http.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(raw)))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var chunks []map[string]any
	payloads, done := sseData(resp.Body)
	for _, data := range payloads {
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c))
		require.Equal(t, "chat.completion.chunk", c["object"])
		chunks = append(chunks, c)
	}
	require.True(t, done)
	require.GreaterOrEqual(t, len(chunks), 4)
	first := chunks[0]["choices"].([]any)[0].(map[string]any)
	require.Equal(t, map[string]any{"role": "assistant", "content": ""}, first["delta"])
	require.Equal(t, toFloats(prompt), chunks[0]["prompt_token_ids"])
	finish := chunks[len(chunks)-2]["choices"].([]any)[0].(map[string]any)
	require.Contains(t, []any{"stop", "length"}, finish["finish_reason"])
	last := chunks[len(chunks)-1]
	require.Equal(t, []any{}, last["choices"])
	require.Contains(t, last, "usage")
	sampled := 0
	for _, c := range chunks[1 : len(chunks)-2] {
		ch := c["choices"].([]any)[0].(map[string]any)
		if ch["token_ids"] == nil {
			continue // text held back (a stop string's start, part of a character) flushed at the end
		}
		sampled++
		require.Len(t, ch["token_ids"], 1, "one chunk per sampled token")
		require.Len(t, ch["logprobs"].(map[string]any)["content"], 1)
	}
	require.Equal(t, last["usage"].(map[string]any)["completion_tokens"], float64(sampled))
}

// TestClientGoneCancelsGeneration: a client that leaves mid-stream stops
// the sampler at the next token.
func TestClientGoneCancelsGeneration(t *testing.T) {
	e := newEnv(t, modelserver.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"` + served + `","messages":[{"role":"user","content":"go on"}],"max_tokens":200,"temperature":0,"stream":true,"logit_bias":null}`
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	w := &cancellingWriter{ResponseRecorder: httptest.NewRecorder(), after: 2, cancel: cancel}
	e.srv.ServeHTTP(w, req)
	require.Equal(t, 2, w.writes, "nothing is written once the client is gone")
	require.NotContains(t, w.Body.String(), "[DONE]")

	// Uncancelled, the same request runs to many more tokens.
	full := httptest.NewRecorder()
	e.srv.ServeHTTP(full, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	require.Greater(t, strings.Count(full.Body.String(), "data: "), 10)
}

// cancellingWriter cancels the request's context after some writes, as a
// client closing its connection does.
type cancellingWriter struct {
	*httptest.ResponseRecorder
	after  int
	writes int
	cancel context.CancelFunc
}

func (w *cancellingWriter) Write(b []byte) (int, error) {
	w.writes++
	if w.writes > w.after {
		return 0, errors.New("connection closed")
	}
	if w.writes == w.after {
		w.cancel()
	}
	return w.ResponseRecorder.Write(b)
}

func toFloats(xs []int) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

func bytesOf(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}
