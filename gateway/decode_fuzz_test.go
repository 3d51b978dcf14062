package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/anthropic"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

func FuzzDecodeOpenAI(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"stop":["x"],"logprobs":true,"top_logprobs":3}`))
	f.Add([]byte(`{"model":"m","messages":[],"n":2}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"function":{"name":"auto","parameters":null}}],"tool_choice":{"type":"function","function":{"name":"auto"}},"stop":[],"response_format":{ "type" : "text" },"logit_bias":{"5":-0},"top_logprobs":0}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		wire, req, err := openai.Decode(body)
		if err != nil {
			require.NotEmpty(t, err.Error(), "a refusal (a 400) says why")
			return
		}
		require.NotNil(t, wire)
		require.NotEmpty(t, req.Model)
		require.NotEmpty(t, req.Messages)
		for _, m := range req.Messages {
			require.Contains(t, []string{"system", "user", "assistant", "tool"}, m.Role)
		}
		// A client sends the conversation back on its next turn, re-encoded
		// from what it decoded: the gateway must read the same request and
		// the same conversation hashes, or stitching and prompt-id reuse
		// silently stop working.
		echo := oaEcho(t, req)
		_, req2, err := openai.Decode(echo)
		require.NoError(t, err, "echo %s", echo)
		require.Equal(t, req.Messages, req2.Messages, "echo %s", echo)
		require.Equal(t, canonRequest(t, req), canonRequest(t, req2), "echo %s", echo)
		require.Equal(t, prefixHashes(req.Messages), prefixHashes(req2.Messages))
	})
}

// oaEcho renders a decoded request as an OpenAI client sends it again:
// tool calls through the gateway's own encoder, content as plain strings.
func oaEcho(t *testing.T, req *inference.Request) []byte {
	body := map[string]any{"model": req.Model}
	var msgs []openai.Message
	for _, m := range req.Messages {
		content, err := json.Marshal(m.Content)
		require.NoError(t, err)
		om := openai.Message{Role: m.Role, Content: content, Name: m.Name, ToolCallID: m.ToolCallID, ReasoningContent: m.Reasoning}
		if len(m.ToolCalls) > 0 {
			om.ToolCalls = openai.RenderToolCalls(m.ToolCalls, false)
		}
		msgs = append(msgs, om)
	}
	body["messages"] = msgs
	var tools []map[string]any
	for _, tl := range req.Tools {
		fn := map[string]any{"name": tl.Name, "description": tl.Description}
		if tl.Parameters != nil {
			fn["parameters"] = tl.Parameters
		}
		tools = append(tools, map[string]any{"type": "function", "function": fn})
	}
	if tools != nil {
		body["tools"] = tools
	}
	if tc := openai.EncodeToolChoice(req.ToolChoice); tc != nil {
		body["tool_choice"] = tc
	}
	if req.MaxTokens != 0 {
		body["max_tokens"] = req.MaxTokens
	}
	if req.Stop != nil {
		body["stop"] = req.Stop
	}
	if req.TopLogprobs > 0 {
		body["logprobs"], body["top_logprobs"] = true, req.TopLogprobs
	}
	if req.ResponseFormat != nil {
		body["response_format"] = req.ResponseFormat
	}
	for k, v := range map[string]any{"temperature": req.Temperature, "top_p": req.TopP, "seed": req.Seed,
		"parallel_tool_calls": req.ParallelToolCalls, "frequency_penalty": req.FrequencyPenalty, "presence_penalty": req.PresencePenalty} {
		body[k] = v
	}
	if req.LogitBias != nil {
		body["logit_bias"] = req.LogitBias
	}
	out, err := json.Marshal(body)
	require.NoError(t, err)
	return out
}

// canonRequest is req as JSON with tool arguments canonicalised, the
// equality the conversation hash uses.
func canonRequest(t *testing.T, req *inference.Request) string {
	c := *req
	c.Messages = nil
	for _, m := range req.Messages {
		m.ToolCalls = append([]inference.ToolCall(nil), m.ToolCalls...)
		for i := range m.ToolCalls {
			m.ToolCalls[i].Arguments = canonArgs(m.ToolCalls[i].Arguments)
		}
		c.Messages = append(c.Messages, m)
	}
	out, err := json.Marshal(&c)
	require.NoError(t, err)
	return string(out)
}

func FuzzDecodeAnthropic(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"a"},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"}],"is_error":true},{"type":"text","text":"next"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a": [1, 2]}}]}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x","is_error":true},{"type":"text","text":"n"}]},{"role":"assistant","content":[]}],"tools":[{"name":"auto","input_schema":null}],"tool_choice":{"type":"tool","name":"auto"},"stop_sequences":[]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		_, req, err := anthropic.Decode(body)
		if err != nil {
			require.NotEmpty(t, err.Error(), "a refusal (a 400) says why")
			return
		}
		require.Positive(t, req.MaxTokens)
		for _, m := range req.Messages {
			require.Contains(t, []string{"system", "user", "assistant", "tool"}, m.Role)
			for _, tc := range m.ToolCalls {
				require.True(t, json.Valid([]byte(tc.Arguments)))
			}
		}
		// The client's next turn carries this conversation back, assistant
		// turns as the gateway rendered them: same request, same hashes.
		echo := anEcho(t, req)
		_, req2, err := anthropic.Decode(echo)
		require.NoError(t, err, "echo %s", echo)
		require.Equal(t, canonRequest(t, req), canonRequest(t, req2), "echo %s", echo)
		require.Equal(t, prefixHashes(req.Messages), prefixHashes(req2.Messages), "echo %s", echo)
	})
}

// anEcho renders a decoded request as an Anthropic client sends it again:
// assistant turns as anthropic.Content rendered them, tool results as blocks.
func anEcho(t *testing.T, req *inference.Request) []byte {
	body := map[string]any{"model": req.Model, "max_tokens": req.MaxTokens}
	msgs := []map[string]any{}
	for i, m := range req.Messages {
		switch m.Role {
		case inference.RoleSystem:
			require.Zero(t, i, "only the system field makes a system message")
			body["system"] = m.Content
		case inference.RoleAssistant:
			msgs = append(msgs, map[string]any{"role": m.Role, "content": anthropic.Content(m)})
		case inference.RoleTool:
			res, err := json.Marshal(m.Content)
			require.NoError(t, err)
			msgs = append(msgs, map[string]any{"role": inference.RoleUser, "content": []anthropic.Block{{Type: "tool_result", ToolUseID: m.ToolCallID, Content: res}}})
		default:
			msgs = append(msgs, map[string]any{"role": m.Role, "content": m.Content})
		}
	}
	body["messages"] = msgs
	var tools []map[string]any
	for _, tl := range req.Tools {
		tool := map[string]any{"name": tl.Name, "description": tl.Description}
		if tl.Parameters != nil {
			tool["input_schema"] = tl.Parameters
		}
		tools = append(tools, tool)
	}
	if tools != nil {
		body["tools"] = tools
	}
	switch req.ToolChoice {
	case "":
	case "none", "auto":
		body["tool_choice"] = map[string]string{"type": req.ToolChoice}
	case "required":
		body["tool_choice"] = map[string]string{"type": "any"}
	default:
		body["tool_choice"] = map[string]string{"type": "tool", "name": req.ToolChoice}
	}
	if req.Stop != nil {
		body["stop_sequences"] = req.Stop
	}
	body["temperature"], body["top_p"] = req.Temperature, req.TopP
	out, err := json.Marshal(body)
	require.NoError(t, err)
	return out
}

// Found by FuzzDecodeAnthropic: a tool_use input that is valid JSON but no
// object came back from anthropic.Content wrapped, so the echoed turn hashed
// differently. Anthropic requires an object; so does the gateway.
func TestAnthropicToolUseInputIsAnObject(t *testing.T) {
	for _, input := range []string{`[1]`, `"s"`, `1`, `null`, `true`} {
		_, _, err := anthropic.Decode([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":` + input + `}]}]}`))
		require.ErrorContains(t, err, "content.0.input: want a JSON object", input)
	}
	_, req, err := anthropic.Decode([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a": 1}}]}]}`))
	require.NoError(t, err)
	require.Equal(t, `{"a": 1}`, req.Messages[0].ToolCalls[0].Arguments)
}

func TestUTF8CarryNeverSplitsACharacter(t *testing.T) {
	text := "añ€😀b"
	for cut1 := 0; cut1 <= len(text); cut1++ {
		for cut2 := cut1; cut2 <= len(text); cut2++ {
			var u utf8Carry
			var out strings.Builder
			for _, piece := range []string{text[:cut1], text[cut1:cut2], text[cut2:]} {
				p := u.next(piece)
				require.True(t, utf8.ValidString(p))
				out.WriteString(p)
			}
			out.WriteString(u.flush())
			require.Equal(t, text, out.String())
		}
	}
	var u utf8Carry
	require.Equal(t, "a", u.next("a\xe2\x82"))
	require.Equal(t, "\ufffd\ufffd", u.flush(), "a stream cut inside a character ends with replacement characters")
}
