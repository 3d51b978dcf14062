package modelserver

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// An untrained policy seldom writes a tool call, so the wire form of the
// engine's tool calls is checked here on a response as the engine builds it.
var toolResponse = &inference.Response{
	Message: inference.Message{Role: inference.RoleAssistant, ToolCalls: []inference.ToolCall{
		{ID: "call_2_9_0", Name: "search", Arguments: `{"q":"go"}`},
		{ID: "call_2_9_1", Name: "open", Arguments: `{}`},
	}},
	FinishReason:       inference.FinishToolCalls,
	PromptTokenIDs:     []int{1, 2},
	CompletionTokenIDs: []int{258, 259, 257},
	Logprobs:           []float32{-0.5, -0.25, -1},
	Usage:              inference.Usage{PromptTokens: 2, CompletionTokens: 3},
}

func TestToolCallsInACompletion(t *testing.T) {
	a := answer{id: "chatcmpl-x", created: 1, model: "policy@v2", wire: &chatRequest{}}
	raw, err := json.Marshal(a.completion(toolResponse))
	require.NoError(t, err)
	var got struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					Index    *int   `json:"index"`
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct {
						Name      string `json:"name"`
						Arguments string `json:"arguments"`
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(raw, &got))
	msg := got.Choices[0].Message
	require.Nil(t, msg.Content, "content is null beside tool calls")
	require.Len(t, msg.ToolCalls, 2)
	require.Nil(t, msg.ToolCalls[0].Index, "no index outside a stream")
	require.Equal(t, "call_2_9_0", msg.ToolCalls[0].ID)
	require.Equal(t, "function", msg.ToolCalls[0].Type)
	require.Equal(t, "search", msg.ToolCalls[0].Function.Name)
	require.Equal(t, `{"q":"go"}`, msg.ToolCalls[0].Function.Arguments)
	require.Equal(t, "tool_calls", got.Choices[0].FinishReason)
}

func TestToolCallsEndAStream(t *testing.T) {
	s := &Server{}
	w := httptest.NewRecorder()
	a := answer{id: "chatcmpl-x", created: 1, model: "policy@v2", wire: &chatRequest{Stream: true, StreamOptions: &openai.StreamOptions{IncludeUsage: true}}}
	require.NoError(t, s.finish(&eventWriter{w: w}, toolResponse, a))
	events := strings.Split(strings.TrimSuffix(w.Body.String(), "\n\n"), "\n\n")
	require.Len(t, events, 4, "tool calls, finish, usage, [DONE]")
	require.JSONEq(t, `{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"policy@v2","choices":[{"index":0,"delta":{"tool_calls":[
		{"index":0,"id":"call_2_9_0","type":"function","function":{"name":"search","arguments":"{\"q\":\"go\"}"}},
		{"index":1,"id":"call_2_9_1","type":"function","function":{"name":"open","arguments":"{}"}}]},"finish_reason":null}]}`,
		strings.TrimPrefix(events[0], "data: "))
	require.JSONEq(t, `{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"policy@v2","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
		strings.TrimPrefix(events[1], "data: "))
	require.JSONEq(t, `{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"policy@v2","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`,
		strings.TrimPrefix(events[2], "data: "))
	require.Equal(t, "data: [DONE]", events[3])
}
