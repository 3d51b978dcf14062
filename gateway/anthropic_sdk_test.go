package gateway_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/require"
)

func (e *env) anthropic(key string) anthropic.Client {
	return anthropic.NewClient(option.WithBaseURL(e.url+"/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func TestAnthropicSDKMessagesToolsStreamMultiTurn(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	c := e.anthropic(e.keyA)
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
		Name: "search", Description: anthropic.String("search the web"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"query": map[string]any{"type": "string"}}},
	}}}
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather in Oslo"))}
	first, err := c.Messages.New(ctx, anthropic.MessageNewParams{
		Model: anthropic.Model(fixtureModel), MaxTokens: 256, Messages: msgs, Tools: tools,
		System: []anthropic.TextBlockParam{{Text: "you are helpful"}},
	})
	require.NoError(t, err)
	require.Equal(t, anthropic.StopReasonToolUse, first.StopReason)
	var toolUse anthropic.ToolUseBlock
	for _, b := range first.Content {
		if b.Type == "tool_use" {
			toolUse = b.AsToolUse()
		}
	}
	require.Equal(t, "search", toolUse.Name)
	var input map[string]string
	require.NoError(t, json.Unmarshal(toolUse.Input, &input))
	require.Equal(t, "weather in Oslo", input["query"])
	row1 := e.captured(first.ID)
	require.Equal(t, "anthropic", row1.Protocol)
	require.NotEmpty(t, row1.CompletionIDs)

	// Turn 2 streams, answers the tool, and is stitched onto turn 1.
	msgs = append(msgs, first.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(toolUse.ID, "sunny, 21C", false)))
	stream := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{
		Model: anthropic.Model(fixtureModel), MaxTokens: 256, Messages: msgs, Tools: tools,
		System: []anthropic.TextBlockParam{{Text: "you are helpful"}},
	})
	var second anthropic.Message
	for stream.Next() {
		require.NoError(t, second.Accumulate(stream.Current()))
	}
	require.NoError(t, stream.Err())
	require.Equal(t, anthropic.StopReasonEndTurn, second.StopReason)
	require.Equal(t, "echo: sunny, 21C", second.Content[0].Text)
	require.Positive(t, second.Usage.OutputTokens)
	row2 := e.captured(second.ID)
	require.True(t, row2.Stream)
	require.Equal(t, row1.SessionID, row2.SessionID)

	bad := e.anthropic("fw-nope")
	_, err = bad.Messages.New(ctx, anthropic.MessageNewParams{Model: anthropic.Model(fixtureModel), MaxTokens: 5,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("x"))}})
	var apiErr *anthropic.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 401, apiErr.StatusCode)
	require.Contains(t, apiErr.RawJSON(), `"authentication_error"`)
}

func TestAnthropicStreamUpstreamFailureIsErrorEvent(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.fixture.BreakStreamAfter = 1
	c := e.anthropic(e.keyA)
	stream := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: anthropic.Model(fixtureModel), MaxTokens: 100,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("a long enough prompt"))}})
	for stream.Next() {
	}
	require.Error(t, stream.Err())
}

// TestAnthropicStreamsThinkingAndToolInput: an upstream's exposed thinking
// and its tool call's arguments reach a Messages stream as they arrive
// (thinking_delta, then input_json_delta increments), and build the same
// message as a whole answer.
func TestAnthropicStreamsThinkingAndToolInput(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.fixture.Reasoning = "the user wants a search"
	c := e.anthropic(e.keyA)
	params := anthropic.MessageNewParams{
		Model: anthropic.Model(fixtureModel), MaxTokens: 256,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather in Oslo"))},
		Tools: []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "search",
			InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"query": map[string]any{"type": "string"}}}}}},
	}
	stream := c.Messages.NewStreaming(context.Background(), params)
	var msg anthropic.Message
	deltas := map[string]int{}
	for stream.Next() {
		ev := stream.Current()
		if ev.Type == "content_block_delta" {
			deltas[ev.Delta.Type]++
		}
		require.NoError(t, msg.Accumulate(ev))
	}
	require.NoError(t, stream.Err())
	require.Equal(t, 1, deltas["thinking_delta"])
	require.Greater(t, deltas["input_json_delta"], 1, "the input streams as the upstream sends it, not whole at the end")
	require.Len(t, msg.Content, 2)
	require.Equal(t, "thinking", msg.Content[0].Type)
	require.Equal(t, "the user wants a search", msg.Content[0].Thinking)
	call := msg.Content[1].AsToolUse()
	require.Equal(t, "search", call.Name)
	require.JSONEq(t, `{"query":"weather in Oslo"}`, string(call.Input))
	require.Equal(t, anthropic.StopReasonToolUse, msg.StopReason)

	whole, err := c.Messages.New(context.Background(), params)
	require.NoError(t, err)
	require.Equal(t, "thinking", whole.Content[0].Type)
	require.Equal(t, msg.Content[0].Thinking, whole.Content[0].Thinking)
	require.JSONEq(t, string(call.Input), string(whole.Content[1].AsToolUse().Input))
	row := e.captured(msg.ID)
	require.Equal(t, "ok", row.Status)
	require.True(t, row.Stream)
}

// TestAnthropicReportsTheStopSequence: an answer cut by one of the
// request's stop sequences says so, and which, as Anthropic's API does,
// whole and streamed (the upstream names it in vLLM's stop_reason).
func TestAnthropicReportsTheStopSequence(t *testing.T) {
	e := newEnv(t, envOpts{})
	c := e.anthropic(e.keyA)
	params := anthropic.MessageNewParams{Model: anthropic.Model(fixtureModel), MaxTokens: 256, StopSequences: []string{"Oslo", "Bergen"},
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("weather in Oslo today"))}}
	whole, err := c.Messages.New(context.Background(), params)
	require.NoError(t, err)
	require.Equal(t, anthropic.StopReasonStopSequence, whole.StopReason)
	require.Equal(t, "Oslo", whole.StopSequence)
	require.Equal(t, "echo: weather in ", whole.Content[0].Text)

	stream := c.Messages.NewStreaming(context.Background(), params)
	var msg anthropic.Message
	for stream.Next() {
		require.NoError(t, msg.Accumulate(stream.Current()))
	}
	require.NoError(t, stream.Err())
	require.Equal(t, anthropic.StopReasonStopSequence, msg.StopReason)
	require.Equal(t, "Oslo", msg.StopSequence)

	params.StopSequences = []string{"Bergen"}
	plain, err := c.Messages.New(context.Background(), params)
	require.NoError(t, err)
	require.Equal(t, anthropic.StopReasonEndTurn, plain.StopReason, "no stop sequence met: the answer's own end")
	require.Empty(t, plain.StopSequence)
}
