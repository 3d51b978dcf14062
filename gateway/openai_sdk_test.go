package gateway_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/fakevllm"
)

func (e *env) openai(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(e.url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func TestOpenAISDKNonStreamCapturesTokens(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	c := e.openai(e.keyA)
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    fixtureModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello")},
		Logprobs: openai.Bool(true),
	})
	require.NoError(t, err)
	require.Equal(t, "echo: hello", resp.Choices[0].Message.Content)
	require.Equal(t, "stop", resp.Choices[0].FinishReason)
	require.Len(t, resp.Choices[0].Logprobs.Content, len("echo: hello"))
	require.InDelta(t, -0.01, resp.Choices[0].Logprobs.Content[0].Logprob, 1e-6)
	require.Equal(t, "e", resp.Choices[0].Logprobs.Content[0].Token, "logprob tokens are text, not token_id:N")

	row := e.captured(resp.ID)
	require.Equal(t, "ok", row.Status)
	require.Equal(t, "openai", row.Protocol)
	require.Equal(t, "stitched", row.Mode)
	require.Equal(t, fixtureModel, row.Version)
	require.Len(t, row.CompletionIDs, len("echo: hello"))
	require.Equal(t, int32('e'), row.CompletionIDs[0])
	require.Len(t, row.Logprobs, len(row.CompletionIDs))
	require.NotEmpty(t, row.PromptIDs, "vLLM's prompt_token_ids are stored")
	last := e.fixture.LastRequest()
	require.Equal(t, true, last["return_token_ids"], "the upstream is asked for token ids")
	require.NotContains(t, last, "return_tokens_as_token_ids", "which would turn its logprob tokens into token_id:N")
	require.Equal(t, true, last["logprobs"], "logprobs are always requested for capture")
}

func TestOpenAISDKStreamMultiTurnToolsStitch(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	c := e.openai(e.keyA)
	tool := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "search",
		Description: openai.String("search the web"),
		Parameters:  shared.FunctionParameters{"type": "object", "properties": map[string]any{"query": map[string]any{"type": "string"}}},
	})
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("find go docs")}
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: fixtureModel, Messages: msgs, Tools: []openai.ChatCompletionToolUnionParam{tool},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	require.NoError(t, stream.Err())
	require.Len(t, acc.Choices, 1)
	calls := acc.Choices[0].Message.ToolCalls
	require.Len(t, calls, 1)
	require.Equal(t, "search", calls[0].Function.Name)
	require.JSONEq(t, `{"query":"find go docs"}`, calls[0].Function.Arguments)
	require.Equal(t, "tool_calls", acc.Choices[0].FinishReason)
	require.Positive(t, acc.Usage.CompletionTokens)
	first := e.captured(acc.ID)
	require.True(t, first.Stream)
	require.Len(t, first.CompletionIDs, len(calls[0].Function.Arguments))

	// Turn 2 carries no session id: the gateway stitches it onto turn 1's
	// session because turn 1's conversation is a prefix of it.
	msgs = append(msgs, acc.Choices[0].Message.ToParam(), openai.ToolMessage("Go docs live at go.dev", calls[0].ID))
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel, Messages: msgs,
		Tools: []openai.ChatCompletionToolUnionParam{tool}})
	require.NoError(t, err)
	require.Equal(t, "echo: Go docs live at go.dev", resp.Choices[0].Message.Content)
	second := e.captured(resp.ID)
	require.Equal(t, first.SessionID, second.SessionID, "turn 2 joins turn 1's session")

	// A different conversation starts a different session.
	other, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("unrelated")}})
	require.NoError(t, err)
	require.NotEqual(t, first.SessionID, e.captured(other.ID).SessionID)
}

func TestOpenAISDKErrorsAreProtocolShaped(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	bad, good := e.openai("fw-wrong"), e.openai(e.keyA)
	_, err := bad.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 401, apiErr.StatusCode)
	require.Equal(t, "authentication_error", apiErr.Type)

	_, err = good.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "no-such-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 404, apiErr.StatusCode)

	e.fixture.FailNext.Store(1)
	_, err = good.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 503, apiErr.StatusCode)
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM interactions WHERE status = 'upstream_error'`).Scan(&n))
	require.Equal(t, 1, n, "the failed call is captured as an upstream error")

	models, err := good.Models.List(ctx)
	require.NoError(t, err)
	require.Equal(t, fixtureModel, models.Data[0].ID)
}

// TestOpenAIStreamUpstreamBreaksEndsWithErrorEvent: an upstream stream cut
// without [DONE], or ended by vLLM's mid-stream error chunk, reaches the
// client as an error event and is captured as an upstream error, not as ok.
func TestOpenAIStreamUpstreamBreaksEndsWithErrorEvent(t *testing.T) {
	for name, cut := range map[string]func(*fakevllm.Fixture){
		"no [DONE]":   func(f *fakevllm.Fixture) { f.BreakStreamAfter = 1 },
		"error chunk": func(f *fakevllm.Fixture) { f.ErrorChunkAfter = 1 },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			cut(e.fixture)
			c := e.openai(e.keyA)
			stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model: fixtureModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a long enough prompt")}})
			got := ""
			for stream.Next() {
				if len(stream.Current().Choices) > 0 {
					got += stream.Current().Choices[0].Delta.Content
				}
			}
			require.Error(t, stream.Err(), "the client sees the failure, not a hang or a silent truncation")
			require.Equal(t, "echo", got)
			var status string
			require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT status FROM interactions`).Scan(&status))
			require.Equal(t, "upstream_error", status)
		})
	}
}

func TestClientGoneMidStreamIsCapturedAsCancelled(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.fixture.Latency = 2 * time.Second // ~10 chunks, 0.2 s apart
	ctx, cancel := context.WithCancel(context.Background())
	c := e.openai(e.keyA)
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: fixtureModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a prompt long enough for many chunks")}})
	require.True(t, stream.Next())
	cancel()
	for stream.Next() {
	}
	var status string
	eventually(t, func() bool {
		return e.pool.QueryRow(context.Background(), `SELECT status FROM interactions`).Scan(&status) == nil
	}, "the abandoned call is still recorded")
	require.Equal(t, "client_cancelled", status)
}

// TestChoicesAreOneGRPOGroup: n samples of one prompt are n sessions of one
// group, each captured with its own token ids and rewarded on its own.
func TestChoicesAreOneGRPOGroup(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	c := e.openai(e.keyA)
	resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel, N: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("sample me")}, Logprobs: openai.Bool(true)})
	require.NoError(t, err)
	require.Len(t, resp.Choices, 4)
	for i, ch := range resp.Choices {
		require.EqualValues(t, i, ch.Index)
		require.Equal(t, "echo: sample me", ch.Message.Content)
		require.Len(t, ch.Logprobs.Content, len("echo: sample me"))
	}
	require.Equal(t, 4*int64(len("echo: sample me")), resp.Usage.CompletionTokens, "every choice's tokens count, the prompt once")
	require.EqualValues(t, 4, e.fixture.Requests.Load(), "one generation per sample")
	for i := range 4 {
		id := resp.ID + "." + strconv.Itoa(i)
		row := e.captured(id)
		require.Equal(t, id, row.SessionID)
		require.Equal(t, "ok", row.Status)
		require.NotEmpty(t, row.CompletionIDs)
		var group string
		var size int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT group_id, group_size FROM sessions WHERE tenant_id = 'acme' AND id = $1`, id).Scan(&group, &size))
		require.Equal(t, resp.ID, group)
		require.Equal(t, 4, size)
	}
	st, _ := e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": resp.ID + ".2", "value": 1, "source": "judge"})
	require.Equal(t, 201, st, "each choice is rewarded by its own completion id")

	// The next turn, continuing a choice, joins that choice's session by
	// stitching (the fake's choices are identical, so any of them).
	next, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel, Messages: []openai.ChatCompletionMessageParamUnion{
		openai.UserMessage("sample me"), resp.Choices[2].Message.ToParam(), openai.UserMessage("and then?")}})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(e.captured(next.ID).SessionID, resp.ID+"."), e.captured(next.ID).SessionID)

	for name, params := range map[string]openai.ChatCompletionNewParams{
		"n: want 1..16": {Model: fixtureModel, N: openai.Int(17), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}},
	} {
		_, err := c.Chat.Completions.New(ctx, params)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, 400, apiErr.StatusCode)
		require.Contains(t, apiErr.Message, name)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: fixtureModel, N: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}}, option.WithHeader("X-Session-Id", "named"))
	requireStatus(t, err, 400)
	st, body := e.doJSON("POST", "/v1/chat/completions", e.keyA, map[string]any{"model": fixtureModel, "n": 2, "stream": true,
		"messages": []map[string]any{{"role": "user", "content": "x"}}})
	require.Equal(t, 400, st, body)
}
