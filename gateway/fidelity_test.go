package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSamplingParametersReachTheUpstream: what an upstream understands is
// forwarded as the client sent it; a bad value is a 400 naming the field;
// the in-process policy refuses what it cannot honour instead of
// answering as if it had.
func TestSamplingParametersReachTheUpstream(t *testing.T) {
	e := newEnv(t, envOpts{policy: true})
	body := chatBody("hi")
	body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "answer",
		"schema": map[string]any{"type": "object"}}}
	body["frequency_penalty"], body["presence_penalty"] = 0.5, -0.25
	body["logit_bias"] = map[string]any{"50256": -100}
	body["parallel_tool_calls"] = false
	body["seed"] = 7
	st, out := e.doJSON("POST", "/v1/chat/completions", e.keyA, body)
	require.Equal(t, 200, st, out)
	last := e.fixture.LastRequest()
	require.Equal(t, body["response_format"], last["response_format"])
	require.Equal(t, 0.5, last["frequency_penalty"])
	require.Equal(t, -0.25, last["presence_penalty"])
	require.Equal(t, map[string]any{"50256": -100.0}, last["logit_bias"])
	require.Equal(t, false, last["parallel_tool_calls"])
	require.Equal(t, 7.0, last["seed"])

	for field, bad := range map[string]any{
		"response_format":   map[string]any{"type": "xml"},
		"frequency_penalty": 3,
		"presence_penalty":  -2.5,
		"logit_bias":        map[string]any{"abc": 1},
	} {
		b := chatBody("hi")
		b[field] = bad
		st, out := e.doJSON("POST", "/v1/chat/completions", e.keyA, b)
		require.Equal(t, 400, st, "%s: %v", field, out)
		require.Contains(t, out["error"].(map[string]any)["message"], field)
	}

	for field, v := range map[string]any{
		"response_format":   map[string]any{"type": "json_object"},
		"frequency_penalty": 0.5,
		"logit_bias":        map[string]any{"65": 5},
	} {
		b := map[string]any{"model": policyModel, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": "hi"}}, field: v}
		st, out := e.doJSON("POST", "/v1/chat/completions", e.keyA, b)
		require.Equal(t, 400, st, "%s: %v", field, out)
		require.Contains(t, out["error"].(map[string]any)["message"], "the in-process policy cannot honour "+field)
	}
	b := map[string]any{"model": policyModel, "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"response_format": map[string]any{"type": "text"}, "frequency_penalty": 0}
	st, out = e.doJSON("POST", "/v1/chat/completions", e.keyA, b)
	require.Equal(t, 200, st, "what the policy does anyway is fine: %v", out)
}

// TestStreamedToolCallArgumentsAndLogprobTokens: an upstream's tool-call
// arguments reach the client in the pieces they arrive in, with the id
// and name on the first; streamed logprob tokens are text.
func TestStreamedToolCallArgumentsAndLogprobTokens(t *testing.T) {
	e := newEnv(t, envOpts{})
	body := chatBody("find the go docs please")
	body["stream"] = true
	body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "search",
		"parameters": map[string]any{"type": "object"}}}}
	st, _, raw := e.do("POST", "/v1/chat/completions", e.keyA, body)
	require.Equal(t, 200, st, string(raw))
	var pieces []string
	var id, name string
	for _, c := range sseChunks(t, raw) {
		for _, ch := range c["choices"].([]any) {
			delta, _ := ch.(map[string]any)["delta"].(map[string]any)
			calls, _ := delta["tool_calls"].([]any)
			for _, tc := range calls {
				tc := tc.(map[string]any)
				require.Equal(t, 0.0, tc["index"])
				if s, ok := tc["id"].(string); ok {
					require.Empty(t, id, "the id comes once")
					id = s
				}
				f := tc["function"].(map[string]any)
				if n, _ := f["name"].(string); n != "" {
					name = n
				}
				pieces = append(pieces, f["arguments"].(string))
			}
		}
	}
	require.Greater(t, len(pieces), 2, "the arguments stream in pieces")
	require.NotEmpty(t, id)
	require.Equal(t, "search", name)
	var args map[string]string
	require.NoError(t, json.Unmarshal([]byte(strings.Join(pieces, "")), &args))
	require.Equal(t, "find the go docs please", args["query"])

	body = chatBody("hello")
	body["stream"], body["logprobs"] = true, true
	st, _, raw = e.do("POST", "/v1/chat/completions", e.keyA, body)
	require.Equal(t, 200, st)
	var toks []string
	for _, c := range sseChunks(t, raw) {
		for _, ch := range c["choices"].([]any) {
			lp, _ := ch.(map[string]any)["logprobs"].(map[string]any)
			content, _ := lp["content"].([]any)
			for _, t := range content {
				toks = append(toks, t.(map[string]any)["token"].(string))
			}
		}
	}
	require.Equal(t, "echo: hello", strings.Join(toks, ""), "streamed logprob tokens are the text")
}

// sseChunks decodes the data lines of an SSE body, up to [DONE].
func sseChunks(t *testing.T, raw []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &m), data)
		out = append(out, m)
	}
	return out
}

// TestAnthropicVersionAndCountTokens: Messages requires anthropic-version
// and echoes it; count_tokens counts with the backend's own tokenizer
// what a call with the same body conditions on.
func TestAnthropicVersionAndCountTokens(t *testing.T) {
	e := newEnv(t, envOpts{policy: true})
	const version = "2023-06-01"
	msg := func(model string) map[string]any {
		return map[string]any{"model": model, "max_tokens": 4, "system": "be brief",
			"messages": []any{map[string]any{"role": "user", "content": "count me"}}}
	}
	st, _, raw := e.do("POST", "/v1/messages", e.keyA, msg(fixtureModel))
	require.Equal(t, 400, st)
	require.Contains(t, string(raw), "anthropic-version: header is required")
	require.Contains(t, string(raw), `"invalid_request_error"`)
	st, hdr, raw := e.do("POST", "/v1/messages", e.keyA, msg(fixtureModel), "anthropic-version", version)
	require.Equal(t, 200, st, string(raw))
	require.Equal(t, version, hdr.Get("anthropic-version"))
	var resp struct {
		Usage struct {
			InputTokens int `json:"input_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(raw, &resp))

	count := func(model string) (int, map[string]any) {
		b := msg(model)
		delete(b, "max_tokens") // count_tokens takes none
		st, _, raw := e.do("POST", "/v1/messages/count_tokens", e.keyA, b, "anthropic-version", version)
		var out map[string]any
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		return st, out
	}
	st, out := count(fixtureModel)
	require.Equal(t, 200, st, out)
	require.Equal(t, float64(resp.Usage.InputTokens), out["input_tokens"], "vLLM's /tokenize counts what the call conditioned on")
	before := e.fixture.Requests.Load()

	st, _, raw = e.do("POST", "/v1/messages", e.keyA, msg(policyModel), "anthropic-version", version)
	require.Equal(t, 200, st, string(raw))
	var pr struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(raw, &pr))
	st, out = count(policyModel)
	require.Equal(t, 200, st, out)
	require.Equal(t, float64(len(e.captured(pr.ID).PromptIDs)), out["input_tokens"], "the policy counts its own prompt ids")
	require.Equal(t, before, e.fixture.Requests.Load(), "counting generates nothing")

	st, out = count("no-such-model")
	require.Equal(t, 404, st, out)
	st, _, _ = e.do("POST", "/v1/messages/count_tokens", e.keyA, map[string]any{"model": fixtureModel}, "anthropic-version", version)
	require.Equal(t, 400, st)
}
