package upstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakeanthropic"
	"github.com/flywheel-ai/flywheel/upstream"
)

func newAnthropic(t *testing.T, fake *fakeanthropic.Fake, retries int, fallbacks ...string) *upstream.Anthropic {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	a, err := upstream.NewAnthropic(upstream.Config{BaseURL: srv.URL + "/v1", Model: "claude-sonnet-4-5", APIKey: "sk-ant-test",
		Retries: retries, Backoff: time.Millisecond, Timeout: 5 * time.Second}, fallbacks)
	require.NoError(t, err)
	return a
}

const claudeBody = `{"model": "claude", "max_tokens": 64,
  "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
  "messages": [{"role": "user", "content": [
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    {"type": "text", "text": "what is this?"}]}],
  "thinking": {"type": "enabled", "budget_tokens": 1024}}`

// TestAnthropicRelaysTheBodyAndHeaders: the server gets the client's
// bytes but for the model, its anthropic-* headers and the deployment's
// key as x-api-key; the answer comes back as sent and is read for
// capture.
func TestAnthropicRelaysTheBodyAndHeaders(t *testing.T) {
	fake := &fakeanthropic.Fake{Key: "sk-ant-test", CacheRead: 5, Answer: []map[string]any{
		{"type": "thinking", "thinking": "a png header", "signature": "sig"},
		{"type": "text", "text": "a tiny image"},
		{"type": "tool_use", "id": "toolu_1", "name": "look", "input": map[string]any{"zoom": 2}},
	}}
	a := newAnthropic(t, fake, 0)
	h := http.Header{"Anthropic-Version": {"2023-06-01"}, "Anthropic-Beta": {"prompt-caching-2024-07-31"}, "Authorization": {"Bearer fw-client"}}
	out, err := a.Messages(context.Background(), upstream.MessagesCall{Body: []byte(claudeBody), Header: h}, nil)
	require.NoError(t, err)

	got := fake.Requests()
	require.Len(t, got, 1)
	require.Equal(t, "/v1/messages", got[0].Path)
	require.Equal(t, `{"model": "claude-sonnet-4-5", "max_tokens": 64,`, string(got[0].Body[:len(`{"model": "claude-sonnet-4-5", "max_tokens": 64,`)]))
	require.Equal(t, claudeBody[len(`{"model": "claude", "max_tokens": 64,`):], string(got[0].Body[len(`{"model": "claude-sonnet-4-5", "max_tokens": 64,`):]),
		"every byte but the model's reaches the server")
	require.Equal(t, "sk-ant-test", got[0].Header.Get("x-api-key"))
	require.Equal(t, "2023-06-01", got[0].Header.Get("anthropic-version"))
	require.Equal(t, "prompt-caching-2024-07-31", got[0].Header.Get("anthropic-beta"))
	require.Empty(t, got[0].Header.Get("Authorization"), "the client's own key stays with the gateway")

	var answer map[string]any
	require.NoError(t, json.Unmarshal(out.Body, &answer))
	require.Equal(t, "tool_use", answer["stop_reason"])
	resp := out.Response
	require.Equal(t, "a tiny image", resp.Message.Content)
	require.Equal(t, "a png header", resp.Message.Reasoning)
	require.Equal(t, []inference.ToolCall{{ID: "toolu_1", Name: "look", Arguments: `{"zoom":2}`}}, resp.Message.ToolCalls)
	require.Equal(t, inference.FinishToolCalls, resp.FinishReason)
	require.Equal(t, "claude-sonnet-4-5", resp.ModelVersion)
	require.Equal(t, len(got[0].Body)/4+1+5, resp.Usage.PromptTokens, "input tokens and cache reads")
	require.Positive(t, resp.Usage.CompletionTokens)
	require.Empty(t, resp.CompletionTokenIDs, "a hosted model gives no ids")

	n, err := a.CountTokens(context.Background(), upstream.MessagesCall{Body: []byte(claudeBody), Header: h})
	require.NoError(t, err)
	require.Equal(t, "/v1/messages/count_tokens", fake.Requests()[1].Path)
	require.JSONEq(t, fmt.Sprintf(`{"input_tokens": %d}`, len(fake.Requests()[1].Body)/4+1), string(n))
}

// TestAnthropicStreamsEventsInOrder: every event reaches emit in the
// server's order, and the assembled answer matches the whole one.
func TestAnthropicStreamsEventsInOrder(t *testing.T) {
	fake := &fakeanthropic.Fake{Answer: []map[string]any{
		{"type": "text", "text": "hello there"},
		{"type": "tool_use", "id": "toolu_2", "name": "search", "input": map[string]any{"q": "oslo"}},
	}}
	a := newAnthropic(t, fake, 0)
	var names []string
	out, err := a.Messages(context.Background(), upstream.MessagesCall{Body: []byte(`{"model":"c","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hi"}]}`),
		Header: http.Header{"Anthropic-Version": {"2023-06-01"}}, Stream: true}, func(ev upstream.SSEEvent) error {
		names = append(names, ev.Name)
		require.True(t, json.Valid(ev.Data))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"message_start", "ping",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}, names)
	require.Equal(t, "hello there", out.Response.Message.Content)
	require.Equal(t, `{"q":"oslo"}`, out.Response.Message.ToolCalls[0].Arguments)
	require.Equal(t, inference.FinishToolCalls, out.Response.FinishReason)
	require.Positive(t, out.Response.Usage.CompletionTokens)
}

// TestAnthropicErrors: the server's errors keep the status Anthropic's
// SDKs act on (429 with its Retry-After, 529, 5xx, 400), but a refused
// deployment key is the gateway's 502; a stream that fails or breaks off
// after it started is an error, with what came before it.
func TestAnthropicErrors(t *testing.T) {
	ctx := context.Background()
	body := []byte(`{"model":"c","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`)
	h := http.Header{"Anthropic-Version": {"2023-06-01"}}
	for _, tc := range []struct {
		fail       fakeanthropic.Failure
		status     int
		retryAfter time.Duration
	}{
		{fakeanthropic.Failure{Status: 400, Type: "invalid_request_error", Message: "max_tokens: too big"}, 400, 0},
		{fakeanthropic.Failure{Status: 401, Type: "authentication_error", Message: "invalid x-api-key"}, 502, 0},
		{fakeanthropic.Failure{Status: 429, Type: "rate_limit_error", Message: "slow down", RetryAfter: "17"}, 429, 17 * time.Second},
		{fakeanthropic.Failure{Status: 529, Type: "overloaded_error", Message: "Overloaded"}, 529, 0},
		{fakeanthropic.Failure{Status: 500, Type: "api_error", Message: "boom"}, 500, 0},
	} {
		a := newAnthropic(t, &fakeanthropic.Fake{Failures: []fakeanthropic.Failure{tc.fail}}, 0)
		_, err := a.Messages(ctx, upstream.MessagesCall{Body: body, Header: h}, nil)
		var ie *inference.Error
		require.ErrorAs(t, err, &ie, tc.fail.Type)
		require.Equal(t, tc.status, ie.Status, tc.fail.Type)
		require.Equal(t, tc.retryAfter, ie.RetryAfter, tc.fail.Type)
		require.Contains(t, ie.Message, tc.fail.Message)
	}

	// A 529 is retried, then the fallback model answers.
	fake := &fakeanthropic.Fake{Failures: []fakeanthropic.Failure{{Status: 529, Type: "overloaded_error"}, {Status: 529, Type: "overloaded_error"}}}
	a := newAnthropic(t, fake, 1, "claude-haiku-4-5")
	out, err := a.Messages(ctx, upstream.MessagesCall{Body: body, Header: h}, nil)
	require.NoError(t, err)
	require.Equal(t, "claude-haiku-4-5", out.Response.ModelVersion)
	require.Len(t, fake.Requests(), 3)

	stream := upstream.MessagesCall{Body: []byte(`{"model":"c","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"hello world"}]}`), Header: h, Stream: true}
	for name, fake := range map[string]*fakeanthropic.Fake{"error event": {ErrorAfter: 4}, "cut": {CutAfter: 4}} {
		var n int
		out, err := newAnthropic(t, fake, 2).Messages(ctx, stream, func(upstream.SSEEvent) error { n++; return nil })
		var ie *inference.Error
		require.ErrorAs(t, err, &ie, name)
		require.Equal(t, 4, n, "%s: the events before it were relayed", name)
		require.Len(t, fake.Requests(), 1, "%s: a stream that started is not retried", name)
		require.Equal(t, "echo:", out.Response.Message.Content, name)
		if name == "error event" {
			require.Equal(t, 529, ie.Status)
		} else {
			require.Equal(t, http.StatusBadGateway, ie.Status)
		}
	}

	stopped := errors.New("client went away")
	_, err = newAnthropic(t, &fakeanthropic.Fake{}, 2).Messages(ctx, stream, func(upstream.SSEEvent) error { return stopped })
	require.ErrorIs(t, err, stopped)
}

// TestAnthropicDeploymentSettings: the dialect builds the relay, with the
// key from the variable the settings name.
func TestAnthropicDeploymentSettings(t *testing.T) {
	t.Setenv("FLYWHEEL_TEST_ANTHROPIC_KEY", "sk-ant-env")
	fake := &fakeanthropic.Fake{Key: "sk-ant-env"}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	b, err := upstream.ForDeployment(deployment.Settings{BaseURL: srv.URL, Model: "claude-opus-4-1", APIKeyEnv: "FLYWHEEL_TEST_ANTHROPIC_KEY",
		Dialect: deployment.DialectAnthropic}, "claude", time.Second, 0)
	require.NoError(t, err)
	a, ok := b.(*upstream.Anthropic)
	require.True(t, ok)
	out, err := a.Messages(context.Background(), upstream.MessagesCall{Body: []byte(`{"model":"claude","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`)}, nil)
	require.NoError(t, err, "the key from the environment; a default anthropic-version")
	require.Equal(t, "echo: hi", out.Response.Message.Content)
	require.JSONEq(t, `{"model":"claude-opus-4-1","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`, string(fake.Requests()[0].Body))

	resp, err := b.Complete(context.Background(), userReq("hi"))
	require.NoError(t, err, "an OpenAI client's call is converted")
	require.Equal(t, "echo: hi", resp.Message.Content)

	_, err = deployment.Parse(json.RawMessage(`{"base_url":"https://api.anthropic.com","dialect":"anthropic","weight_sync":{"kind":"vllm_lora"}}`))
	require.ErrorContains(t, err, "weight_sync")
}

// TestAnthropicServesOpenAIClients: a neutral request (an OpenAI client's)
// is converted to a Messages body, its answer read back, whole and
// streamed, the stream's increments as they arrive.
func TestAnthropicServesOpenAIClients(t *testing.T) {
	fake := &fakeanthropic.Fake{}
	a := newAnthropic(t, fake, 0)
	temp, parallel := 0.5, false
	req := &inference.Request{Model: "claude", Temperature: &temp, Stop: []string{"END"}, ToolChoice: "required", ParallelToolCalls: &parallel,
		Messages: []inference.Message{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "weather?"},
			{Role: "assistant", Reasoning: "lost: no signature", ToolCalls: []inference.ToolCall{{ID: "toolu_9", Name: "search", Arguments: `{"q":"oslo"}`}}},
			{Role: "tool", ToolCallID: "toolu_9", Content: "sunny"},
			{Role: "user", Content: "thanks"},
		},
		Tools: []inference.Tool{{Name: "search", Description: "the web"}}}
	resp, err := a.Complete(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, "echo: thanks", resp.Message.Content)
	require.JSONEq(t, `{"model":"claude-sonnet-4-5","max_tokens":4096,"system":"be brief","temperature":0.5,"stop_sequences":["END"],
		"messages":[{"role":"user","content":[{"type":"text","text":"weather?"}]},
		  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_9","name":"search","input":{"q":"oslo"}}]},
		  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_9","content":"sunny"},{"type":"text","text":"thanks"}]}],
		"tools":[{"name":"search","description":"the web","input_schema":{"type":"object"}}],
		"tool_choice":{"type":"any","disable_parallel_tool_use":true}}`, string(fake.Requests()[0].Body))
	require.Equal(t, "2023-06-01", fake.Requests()[0].Header.Get("anthropic-version"))

	fake.Answer = []map[string]any{{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "hello there"},
		{"type": "text", "text": "again"}, {"type": "tool_use", "id": "toolu_3", "name": "search", "input": map[string]any{"q": "oslo"}}}
	var text, reasoning, args string
	var calls []inference.ToolCallDelta
	sresp, err := a.Stream(context.Background(), userReq("hi"), func(d inference.Delta) error {
		text, reasoning = text+d.Text, reasoning+d.Reasoning
		for _, tc := range d.ToolCalls {
			if tc.ID != "" {
				calls = append(calls, tc)
			}
			args += tc.Arguments
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "hello there\nagain", text)
	require.Equal(t, text, sresp.Message.Content, "the increments add up to the answer")
	require.Equal(t, "hmm", reasoning)
	require.Equal(t, []inference.ToolCallDelta{{Index: 0, ID: "toolu_3", Name: "search"}}, calls)
	require.Equal(t, `{"q":"oslo"}`, args)
	require.Equal(t, args, sresp.Message.ToolCalls[0].Arguments)
	require.Contains(t, string(fake.Requests()[1].Body), `"stream":true`)

	_, err = a.Complete(context.Background(), &inference.Request{Model: "claude", ResponseFormat: json.RawMessage(`{"type":"json_object"}`),
		Messages: []inference.Message{{Role: "user", Content: "hi"}}})
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 400, ie.Status)
	require.Contains(t, ie.Message, "response_format")
}

// TestAnthropicStreamTimeoutIsBetweenEvents: a stream may last longer
// than the timeout while events keep coming; a silence of the timeout
// ends it as a 504.
func TestAnthropicStreamTimeoutIsBetweenEvents(t *testing.T) {
	gap := make(chan time.Duration, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		pause := <-gap
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"content\":[]}}\n\n")
		for range 4 {
			w.(http.Flusher).Flush()
			time.Sleep(pause)
			fmt.Fprint(w, "event: ping\ndata: {\"type\":\"ping\"}\n\n")
		}
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	t.Cleanup(srv.Close)
	a, err := upstream.NewAnthropic(upstream.Config{BaseURL: srv.URL, Model: "m", Timeout: 150 * time.Millisecond}, nil)
	require.NoError(t, err)
	call := upstream.MessagesCall{Body: []byte(`{"model":"c","stream":true}`), Stream: true}

	gap <- 60 * time.Millisecond // 4 gaps: longer than the timeout in all
	_, err = a.Messages(context.Background(), call, func(upstream.SSEEvent) error { return nil })
	require.NoError(t, err)

	gap <- 400 * time.Millisecond
	_, err = a.Messages(context.Background(), call, func(upstream.SSEEvent) error { return nil })
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, http.StatusGatewayTimeout, ie.Status)
}
