package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakeresponses"
	"github.com/flywheel-ai/flywheel/upstream"
)

func newResponsesRelay(t *testing.T, fake *fakeresponses.Fake, retries int, fallbacks ...string) *upstream.ResponsesRelay {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	b, err := upstream.ForDeployment(deployment.Settings{BaseURL: srv.URL + "/v1", Model: "gpt-5-mini", Dialect: deployment.DialectOpenAI,
		Responses: true, Fallbacks: fallbacks, Retries: &retries}, "gpt", 5*time.Second, 0)
	require.NoError(t, err)
	r, ok := b.(*upstream.ResponsesRelay)
	require.True(t, ok, "an openai deployment with responses: true relays the Responses API")
	return r
}

const responsesBody = `{"model": "gpt", "input": [{"role": "user", "content": "hello"}],
  "tools": [{"type": "web_search"}, {"type": "function", "name": "look", "parameters": {"type": "object"}}],
  "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}`

// TestResponsesRelaysTheBody: the server gets the client's bytes but for
// the model; the answer comes back as sent, with its id, and is read for
// capture; a stream's events arrive in order, the last one included.
func TestResponsesRelaysTheBody(t *testing.T) {
	fake := &fakeresponses.Fake{Output: []map[string]any{
		{"type": "reasoning", "summary": []map[string]any{{"type": "summary_text", "text": "think"}}},
		{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": "a look", "annotations": []any{}}}},
		{"type": "function_call", "call_id": "call_1", "name": "look", "arguments": `{"at":"x"}`},
	}}
	r := newResponsesRelay(t, fake, 0)
	out, err := r.Create(context.Background(), []byte(responsesBody), false, nil)
	require.NoError(t, err)
	got := fake.Requests()
	require.Len(t, got, 1)
	require.Equal(t, `{"model": "gpt-5-mini"`+responsesBody[len(`{"model": "gpt"`):], string(got[0].Body), "every byte but the model's")
	require.Equal(t, "resp_fake000001", out.ID)
	require.Contains(t, string(out.Body), `"id":"resp_fake000001"`)
	g := out.Response
	require.Equal(t, "a look", g.Message.Content)
	require.Equal(t, "think", g.Message.Reasoning)
	require.Equal(t, []inference.ToolCall{{ID: "call_1", Name: "look", Arguments: `{"at":"x"}`}}, g.Message.ToolCalls)
	require.Equal(t, inference.FinishToolCalls, g.FinishReason)
	require.Positive(t, g.Usage.PromptTokens)
	require.Equal(t, "gpt-5-mini-2025-01-01", g.ModelVersion)
	require.Empty(t, g.CompletionTokenIDs, "a hosted model gives no ids")

	var names []string
	out, err = r.Create(context.Background(), []byte(`{"model":"gpt","input":"hi","stream":true}`), true, func(ev upstream.SSEEvent) error {
		names = append(names, ev.Name)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "response.created", names[0])
	require.Equal(t, "response.completed", names[len(names)-1])
	require.Equal(t, "resp_fake000002", out.ID)
	require.Equal(t, "a look", out.Response.Message.Content)

	read, err := r.Get(context.Background(), "resp_fake000002")
	require.NoError(t, err)
	require.Contains(t, string(read), `"id":"resp_fake000002"`)
	_, err = r.Delete(context.Background(), "resp_fake000002")
	require.NoError(t, err)
	_, err = r.Get(context.Background(), "resp_fake000002")
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 404, ie.Status)
}

// TestResponsesErrorsAndFallbacks: a 429 or 5xx moves on to the fallback
// model; a refused deployment key is the gateway's 502; a stream that
// started is neither retried nor moved on.
func TestResponsesErrorsAndFallbacks(t *testing.T) {
	t.Setenv("FLYWHEEL_TEST_WRONG_KEY", "sk-wrong")
	srv := httptest.NewServer(&fakeresponses.Fake{Key: "sk-right"})
	t.Cleanup(srv.Close)
	b, err := upstream.ForDeployment(deployment.Settings{BaseURL: srv.URL + "/v1", Dialect: deployment.DialectOpenAI, Responses: true,
		APIKeyEnv: "FLYWHEEL_TEST_WRONG_KEY"}, "gpt", 5*time.Second, 0)
	require.NoError(t, err)
	_, err = b.(*upstream.ResponsesRelay).Create(context.Background(), []byte(`{"model":"gpt","input":"x"}`), false, nil)
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 502, ie.Status)
	require.Contains(t, ie.Message, "deployment's credentials")

	fake := &fakeresponses.Fake{}
	r := newResponsesRelay(t, fake, 0, "gpt-5-nano")
	fake.Fail(fakeresponses.Failure{Status: 429, Type: "rate_limit_error", Message: "slow down", RetryAfter: "1"})
	out, err := r.Create(context.Background(), []byte(`{"model":"gpt","input":"x"}`), false, nil)
	require.NoError(t, err)
	require.Equal(t, "gpt-5-nano-2025-01-01", out.Response.ModelVersion, "the fallback answered")

	fake.Break(3, 0)
	calls := len(fake.Requests())
	_, err = r.Create(context.Background(), []byte(`{"model":"gpt","input":"x","stream":true}`), true, func(upstream.SSEEvent) error { return nil })
	require.True(t, errors.As(err, &ie) && ie.Status == 502, "%v", err)
	require.Len(t, fake.Requests(), calls+1, "a stream that started is not tried again")
}

// TestResponsesFailedStream: a response.failed is passed on as the
// server's last event and returned as the error, with the response's id
// and what it said before failing.
func TestResponsesFailedStream(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"status\":\"in_progress\",\"output\":[]}}\n\n"+
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"delta\":\"par\"}\n\n"+
			"event: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":2,\"response\":{\"id\":\"resp_9\",\"status\":\"failed\","+
			"\"error\":{\"code\":\"server_error\",\"message\":\"boom\"},\"output\":[]}}\n\n")
	}))
	t.Cleanup(srv.Close)
	b, err := upstream.ForDeployment(deployment.Settings{BaseURL: srv.URL + "/v1", Dialect: deployment.DialectOpenAI, Responses: true}, "gpt", 5*time.Second, 0)
	require.NoError(t, err)
	var names []string
	out, err := b.(*upstream.ResponsesRelay).Create(context.Background(), []byte(`{"model":"gpt","input":"x","stream":true}`), true,
		func(ev upstream.SSEEvent) error { names = append(names, ev.Name); return nil })
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 502, ie.Status)
	require.Contains(t, ie.Message, "boom")
	require.Equal(t, []string{"response.created", "response.output_text.delta", "response.failed"}, names)
	require.Equal(t, "resp_9", out.ID)
	require.Equal(t, inference.FinishError, out.Response.FinishReason)
}
