package gateway_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/internal/fakeanthropic"
)

// claudeDeployment registers deployment "claude" on a fake of Anthropic's
// API that wants the key the deployment names in api_key_env.
func claudeDeployment(t *testing.T, e *env) *fakeanthropic.Fake {
	t.Helper()
	t.Setenv("FLYWHEEL_TEST_CLAUDE_KEY", "sk-ant-gateway")
	fake := &fakeanthropic.Fake{Key: "sk-ant-gateway"}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	st, out := e.doJSON("POST", "/admin/v1/deployments", e.cfg.AdminKey, map[string]any{"name": "claude",
		"upstream": map[string]any{"base_url": srv.URL, "model": "claude-sonnet-4-5", "dialect": "anthropic",
			"api_key_env": "FLYWHEEL_TEST_CLAUDE_KEY", "retries": 0}})
	require.Equal(t, 201, st, out)
	return fake
}

var sseEventName = regexp.MustCompile(`(?m)^event: (\w+)$`)

// TestAnthropicDeploymentRelaysTheBody: a Messages call on a deployment of
// Anthropic's dialect reaches the server as the client sent it but for the
// model (image, cache_control, thinking included), with its anthropic-*
// headers and the deployment's key; the stream's events come back in the
// server's order; the call is captured, and its step says it will not
// train because a hosted model gives no token ids. An OpenAI client's
// call is converted.
func TestAnthropicDeploymentRelaysTheBody(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := claudeDeployment(t, e)
	fake.Answer = []map[string]any{{"type": "thinking", "thinking": "a png", "signature": "sig"}, {"type": "text", "text": "a tiny image"}}
	body := `{"model":"claude","max_tokens":64,` +
		`"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],` +
		`"thinking":{"type":"enabled","budget_tokens":1024},` +
		`"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},` +
		`{"type":"text","text":"what is this?"}]}]}`
	st, hdr, raw := e.do("POST", "/v1/messages", e.keyA, body, "anthropic-version", "2023-06-01",
		"anthropic-beta", "interleaved-thinking-2025-05-14", "X-Session-Id", "claude-1")
	require.Equal(t, 200, st, string(raw))
	require.Equal(t, "2023-06-01", hdr.Get("anthropic-version"))
	got := fake.Requests()
	require.Len(t, got, 1)
	require.Equal(t, strings.Replace(body, `"model":"claude"`, `"model":"claude-sonnet-4-5"`, 1), string(got[0].Body))
	require.Equal(t, "sk-ant-gateway", got[0].Header.Get("x-api-key"))
	require.Equal(t, "2023-06-01", got[0].Header.Get("anthropic-version"))
	require.Equal(t, "interleaved-thinking-2025-05-14", got[0].Header.Get("anthropic-beta"))
	require.Empty(t, got[0].Header.Get("Authorization"), "the client's Flywheel key stays at the gateway")

	var msg map[string]any
	require.NoError(t, json.Unmarshal(raw, &msg))
	id := msg["id"].(string)
	require.True(t, strings.HasPrefix(id, "msg_") && !strings.HasPrefix(id, "msg_fake"), "the id feedback names: %s", id)
	require.Equal(t, "claude-sonnet-4-5", msg["model"])
	require.Len(t, msg["content"], 2, "the server's blocks as it sent them")
	row := e.captured(id)
	require.Equal(t, "ok", row.Status)
	require.Equal(t, "anthropic", row.Protocol)
	require.Empty(t, row.CompletionIDs)
	require.Contains(t, string(row.Request), `[image]\nwhat is this?`, "the image is recorded as its placeholder")
	require.Contains(t, string(row.Response), `"reasoning": "a png"`)

	// Streamed: the events in the server's order, the call captured.
	streamBody := strings.Replace(body, `"max_tokens":64,`, `"max_tokens":64,"stream":true,`, 1)
	st, _, raw = e.do("POST", "/v1/messages", e.keyA, streamBody, "anthropic-version", "2023-06-01", "X-Session-Id", "claude-1")
	require.Equal(t, 200, st, string(raw))
	var names []string
	for _, m := range sseEventName.FindAllStringSubmatch(string(raw), -1) {
		names = append(names, m[1])
	}
	require.Equal(t, []string{"message_start", "ping",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}, names)
	require.Equal(t, strings.Replace(streamBody, `"model":"claude"`, `"model":"claude-sonnet-4-5"`, 1), string(fake.Requests()[1].Body))

	// With the SDK: whole, streamed, counted.
	c := anthropic.NewClient(option.WithBaseURL(e.url+"/"), option.WithAPIKey(e.keyA), option.WithMaxRetries(0),
		option.WithHeader("X-Session-Id", "claude-1"))
	fake.Answer = nil
	params := anthropic.MessageNewParams{Model: "claude", MaxTokens: 32,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}}
	stream := c.Messages.NewStreaming(context.Background(), params)
	var streamed anthropic.Message
	for stream.Next() {
		require.NoError(t, streamed.Accumulate(stream.Current()))
	}
	require.NoError(t, stream.Err())
	require.Equal(t, "echo: hello", streamed.Content[0].Text)
	require.Equal(t, anthropic.StopReasonEndTurn, streamed.StopReason)
	require.True(t, e.captured(streamed.ID).Stream)
	n, err := c.Messages.CountTokens(context.Background(), anthropic.MessageCountTokensParams{Model: "claude",
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}})
	require.NoError(t, err)
	require.Positive(t, n.InputTokens)
	last := fake.Requests()[len(fake.Requests())-1]
	require.Equal(t, "/v1/messages/count_tokens", last.Path)
	require.Contains(t, string(last.Body), `"model":"claude-sonnet-4-5"`)

	st, _ = e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": id, "value": 1})
	require.Equal(t, 201, st)
	st, view := e.doJSON("GET", "/v1/sessions/claude-1", e.keyA, nil)
	require.Equal(t, 200, st, view)
	steps := view["steps"].([]any)
	require.Len(t, steps, 3)
	first := steps[0].(map[string]any)
	require.Equal(t, false, first["will_train"], first)
	require.Equal(t, atdp.ReasonZeroTrainableTokens, first["reason"], "a hosted model's step has no ids, as the openai dialect's")

	// An OpenAI client's call is converted, whole and streamed.
	st, chat := e.doJSON("POST", "/v1/chat/completions", e.keyA, map[string]any{"model": "claude",
		"messages": []any{map[string]any{"role": "system", "content": "be brief"}, map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, 200, st, chat)
	require.Equal(t, "echo: hi", chat["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"])
	require.JSONEq(t, `{"model":"claude-sonnet-4-5","max_tokens":4096,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
		string(fake.Requests()[len(fake.Requests())-1].Body))
	require.Equal(t, "openai", e.captured(chat["id"].(string)).Protocol)
	st, _, raw = e.do("POST", "/v1/chat/completions", e.keyA, map[string]any{"model": "claude", "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": "streamed"}}})
	require.Equal(t, 200, st, string(raw))
	require.Contains(t, string(raw), `"content":"echo:"`)
	require.Contains(t, string(raw), "data: [DONE]")
}

// TestAnthropicDeploymentErrors: the server's errors reach the client in
// Anthropic's shape with the status and retry-after its SDK acts on; a
// refused deployment key is a 502, not the client's 401; a stream that
// breaks off ends with an error event and is captured as an error.
func TestAnthropicDeploymentErrors(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := claudeDeployment(t, e)
	body := `{"model":"claude","max_tokens":9,"messages":[{"role":"user","content":"hello world"}]}`
	for _, tc := range []struct {
		fail         fakeanthropic.Failure
		status       int
		kind         string
		retryAfter   string
		messageParts string
	}{
		{fakeanthropic.Failure{Status: 400, Type: "invalid_request_error", Message: "max_tokens: 9 > 8"}, 400, "invalid_request_error", "", "max_tokens: 9 > 8"},
		{fakeanthropic.Failure{Status: 401, Type: "authentication_error", Message: "invalid x-api-key"}, 502, "api_error", "", "deployment's credentials"},
		{fakeanthropic.Failure{Status: 429, Type: "rate_limit_error", Message: "slow down", RetryAfter: "7"}, 429, "rate_limit_error", "7", "slow down"},
		{fakeanthropic.Failure{Status: 529, Type: "overloaded_error", Message: "Overloaded"}, 529, "overloaded_error", "", "Overloaded"},
		{fakeanthropic.Failure{Status: 503, Type: "api_error", Message: "down"}, 503, "overloaded_error", "", "down"},
	} {
		fake.Failures = []fakeanthropic.Failure{tc.fail}
		st, hdr, raw := e.do("POST", "/v1/messages", e.keyA, body, "anthropic-version", "2023-06-01")
		require.Equal(t, tc.status, st, string(raw))
		require.Equal(t, tc.retryAfter, hdr.Get("Retry-After"), tc.fail.Type)
		var out struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		require.Equal(t, "error", out.Type)
		require.Equal(t, tc.kind, out.Error.Type, string(raw))
		require.Contains(t, out.Error.Message, tc.messageParts)
	}

	c := anthropic.NewClient(option.WithBaseURL(e.url+"/"), option.WithAPIKey(e.keyA), option.WithMaxRetries(0))
	fake.Failures = []fakeanthropic.Failure{{Status: 529, Type: "overloaded_error", Message: "Overloaded"}}
	_, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{Model: "claude", MaxTokens: 9,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}})
	var apiErr *anthropic.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 529, apiErr.StatusCode)
	require.Contains(t, apiErr.RawJSON(), `"overloaded_error"`)

	for name, set := range map[string]func(){"cut": func() { fake.Break(4, 0) }, "error event": func() { fake.Break(0, 4) }} {
		set()
		stream := strings.Replace(body, `"max_tokens":9,`, `"max_tokens":9,"stream":true,`, 1)
		st, _, raw := e.do("POST", "/v1/messages", e.keyA, stream, "anthropic-version", "2023-06-01")
		require.Equal(t, 200, st, name)
		text := string(raw)
		require.True(t, strings.HasSuffix(strings.TrimSpace(text), "}"), name)
		require.Contains(t, text, "event: error\n", name)
		require.NotContains(t, text, "message_stop", name)
		start := strings.Index(text, "data: ") + len("data: ")
		var ev struct{ Message struct{ ID string } }
		require.NoError(t, json.Unmarshal([]byte(text[start:strings.Index(text[start:], "\n")+start]), &ev), name)
		row := e.captured(ev.Message.ID)
		require.Equal(t, "upstream_error", row.Status, name)
		require.Contains(t, string(row.Response), "echo:", "%s: what came before the break is kept", name)
	}
}

// TestAnthropicDeploymentAppliesArtefacts: the serving harness goes in
// front of a relayed body's system prompt and the tenant's tool-schema
// override into its tool, every other byte as sent, and the capture names
// what served, as on any deployment.
func TestAnthropicDeploymentAppliesArtefacts(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := claudeDeployment(t, e)
	_, err := e.pool.Exec(context.Background(), `INSERT INTO artefacts (deployment, kind, version, content, status) VALUES
		('claude', 'harness', 1, '{"system_prompt":"serving harness"}', 'serving'),
		('claude', 'tool_schema', 2, '{"tenants":{"acme":{"search":{"description":"Search the web."}}}}', 'serving')`)
	require.NoError(t, err)
	body := `{"model":"claude","max_tokens":9,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],` +
		`"tools":[{"name":"search","description":"old","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}`
	st, _, raw := e.do("POST", "/v1/messages", e.keyA, body, "anthropic-version", "2023-06-01")
	require.Equal(t, 200, st, string(raw))
	require.Equal(t, `{"model":"claude-sonnet-4-5","max_tokens":9,"system":[{"type":"text","text":"serving harness"},{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],`+
		`"tools":[{"name":"search","description":"Search the web.","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"hi"}]}`,
		string(fake.Requests()[0].Body))
	var msg struct{ ID string }
	require.NoError(t, json.Unmarshal(raw, &msg))
	row := e.captured(msg.ID)
	require.Contains(t, string(row.Request), `"injected_system": "serving harness"`)
	require.Contains(t, string(row.Request), `"search": "2"`, "the tool's version")

	st, _, raw = e.do("POST", "/v1/messages/count_tokens", e.keyA, `{"model":"claude","messages":[{"role":"user","content":"hi"}]}`,
		"anthropic-version", "2023-06-01")
	require.Equal(t, 200, st, string(raw))
	require.Equal(t, `{"model":"claude-sonnet-4-5","messages":[{"role":"user","content":"hi"}],"system":"serving harness"}`, string(fake.Requests()[1].Body),
		"the count covers what a call would send")
}
