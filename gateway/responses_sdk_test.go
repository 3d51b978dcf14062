package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/store"
)

var searchTool = responses.ToolParamOfFunction("search",
	map[string]any{"type": "object", "properties": map[string]any{"query": map[string]any{"type": "string"}}}, false)

// TestResponsesSDKToolsChainOneSession: openai-go's Responses client runs a
// tool loop through previous_response_id; the chain is one session, the
// upstream sees the whole conversation, and stored responses are the
// tenant's alone.
func TestResponsesSDKToolsChainOneSession(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	c := e.openai(e.keyA)
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: fixtureModel, Instructions: openai.String("be brief"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("find go docs")},
		Tools: []responses.ToolUnionParam{searchTool},
	})
	require.NoError(t, err)
	require.Equal(t, responses.ResponseStatusCompleted, first.Status)
	require.Len(t, first.Output, 1)
	call := first.Output[0].AsFunctionCall()
	require.Equal(t, "function_call", first.Output[0].Type)
	require.Equal(t, "search", call.Name)
	require.JSONEq(t, `{"query":"find go docs"}`, call.Arguments)
	require.NotEmpty(t, call.CallID)
	require.Positive(t, first.Usage.InputTokens)
	require.Equal(t, first.Usage.InputTokens+first.Usage.OutputTokens, first.Usage.TotalTokens)
	row1 := e.captured(first.ID)
	require.Equal(t, "responses", row1.Protocol)
	require.Equal(t, "ok", row1.Status)
	require.NotEmpty(t, row1.CompletionIDs, "the engine's token ids are captured as for chat")

	// Turn 2 answers the call by previous_response_id alone: the gateway
	// rebuilds the conversation and keeps the session.
	answer := responses.ResponseInputItemParamOfFunctionCallOutput("Go docs live at go.dev")
	answer.OfFunctionCallOutput.CallID = openai.String(call.CallID)
	second, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: fixtureModel, Instructions: openai.String("be brief"), PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{answer}},
		Tools: []responses.ToolUnionParam{searchTool},
	})
	require.NoError(t, err)
	require.Equal(t, "echo: Go docs live at go.dev", second.OutputText())
	require.Equal(t, first.ID, second.PreviousResponseID)
	row2 := e.captured(second.ID)
	require.Equal(t, row1.SessionID, row2.SessionID, "a chain is one session")
	st, _, body := e.do("GET", "/v1/trajectories?session_id="+row1.SessionID, e.keyA, nil)
	require.Equal(t, http.StatusOK, st)
	r := atdp.NewReader(bytes.NewReader(body))
	var steps []*atdp.Step
	for {
		s, err := r.Next()
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		steps = append(steps, s)
	}
	require.Len(t, steps, 2, "the chain's turns are the session's steps, as chat turns are")
	require.Equal(t, steps[0].Metadata.StepID, steps[1].Metadata.ParentStepID)
	require.Equal(t, "Go docs live at go.dev", steps[1].Observation.Messages[len(steps[1].Observation.Messages)-1].Content)
	require.NotEmpty(t, steps[1].Action.Tokens.CompletionIDs)
	var sent struct {
		Messages []struct {
			Role       string `json:"role"`
			Content    any    `json:"content"`
			ToolCallID string `json:"tool_call_id"`
			ToolCalls  []struct {
				ID string `json:"id"`
			} `json:"tool_calls"`
		} `json:"messages"`
	}
	raw, _ := json.Marshal(e.fixture.LastRequest())
	require.NoError(t, json.Unmarshal(raw, &sent))
	require.Len(t, sent.Messages, 4, "instructions, the first input, the call and its output")
	require.Equal(t, "system", sent.Messages[0].Role)
	require.Equal(t, "be brief", sent.Messages[0].Content)
	require.Equal(t, "user", sent.Messages[1].Role)
	require.Equal(t, call.CallID, sent.Messages[2].ToolCalls[0].ID)
	require.Equal(t, "tool", sent.Messages[3].Role)
	require.Equal(t, call.CallID, sent.Messages[3].ToolCallID)

	got, err := c.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	require.NoError(t, err)
	require.Equal(t, second.OutputText(), got.OutputText())
	require.Equal(t, second.Output[0].ID, got.Output[0].ID)

	// Another tenant can neither read nor continue it.
	other := e.openai(e.keyB)
	_, err = other.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	requireStatus(t, err, http.StatusNotFound)
	_, err = other.Responses.New(ctx, responses.ResponseNewParams{Model: fixtureModel, PreviousResponseID: openai.String(second.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and?")}})
	requireStatus(t, err, http.StatusNotFound)

	// A per-session key reaches its own session's responses only.
	st, sess := e.doJSON(http.MethodPost, "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel})
	require.Equal(t, http.StatusCreated, st, sess)
	sessionKey := e.openai(sess["api_key"].(string))
	_, err = sessionKey.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	requireStatus(t, err, http.StatusNotFound)
	_, err = sessionKey.Responses.New(ctx, responses.ResponseNewParams{Model: fixtureModel, PreviousResponseID: openai.String(second.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and?")}})
	requireStatus(t, err, http.StatusNotFound)
	require.Error(t, sessionKey.Responses.Delete(ctx, second.ID))

	// store: false is captured (it trains) but not kept.
	unstored, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: fixtureModel, Store: openai.Bool(false),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}})
	require.NoError(t, err)
	require.Equal(t, "ok", e.captured(unstored.ID).Status)
	_, err = c.Responses.Get(ctx, unstored.ID, responses.ResponseGetParams{})
	requireStatus(t, err, http.StatusNotFound)

	require.NoError(t, c.Responses.Delete(ctx, second.ID))
	_, err = c.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	requireStatus(t, err, http.StatusNotFound)
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: fixtureModel, PreviousResponseID: openai.String(second.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and?")}})
	requireStatus(t, err, http.StatusNotFound)

	// Forget takes the session's stored responses with its interactions.
	res, err := store.Forget(ctx, e.pool, "acme", "session", row1.SessionID)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Deleted["responses"], "the first response was left; the second was deleted")
	_, err = c.Responses.Get(ctx, first.ID, responses.ResponseGetParams{})
	requireStatus(t, err, http.StatusNotFound)
}

func requireStatus(t *testing.T, err error, status int) {
	t.Helper()
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, status, apiErr.StatusCode, apiErr.Message)
}

// TestResponsesSDKStream: a streamed response's events build the same
// items, with the same ids, as the final response and the stored one.
func TestResponsesSDKStream(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	c := e.openai(e.keyA)
	for _, tc := range []struct {
		name  string
		tools []responses.ToolUnionParam
	}{{"text", nil}, {"tool call", []responses.ToolUnionParam{searchTool}}} {
		t.Run(tc.name, func(t *testing.T) {
			stream := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{
				Model: fixtureModel, Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("stream me")},
				Tools: tc.tools, Include: []responses.ResponseIncludable{responses.ResponseIncludableMessageOutputTextLogprobs},
			})
			var (
				types      []string
				text, args string
				seq        int64 = -1
				done       []responses.ResponseOutputItemUnion
				final      responses.Response
			)
			for stream.Next() {
				ev := stream.Current()
				require.Greater(t, ev.SequenceNumber, seq, "sequence numbers increase")
				seq = ev.SequenceNumber
				types = append(types, ev.Type)
				switch ev.Type {
				case "response.output_text.delta":
					text += ev.Delta
				case "response.function_call_arguments.delta":
					args += ev.Delta
				case "response.output_item.done":
					done = append(done, ev.AsResponseOutputItemDone().Item)
				case "response.completed":
					final = ev.AsResponseCompleted().Response
				}
			}
			require.NoError(t, stream.Err())
			require.Equal(t, "response.created", types[0])
			require.Equal(t, "response.in_progress", types[1])
			require.Equal(t, "response.completed", types[len(types)-1])
			require.Equal(t, responses.ResponseStatusCompleted, final.Status)
			require.Len(t, final.Output, len(done))
			for i := range done {
				require.Equal(t, done[i].ID, final.Output[i].ID)
			}
			if tc.tools == nil {
				require.Equal(t, "echo: stream me", text)
				require.Equal(t, text, final.OutputText())
				msg := final.Output[0].AsMessage()
				require.Len(t, msg.Content[0].Logprobs, len(text), "one logprob per byte-level token, as text")
				require.Equal(t, "e", msg.Content[0].Logprobs[0].Token)
			} else {
				fc := final.Output[0].AsFunctionCall()
				require.Equal(t, "search", fc.Name)
				require.Equal(t, fc.Arguments, args, "arguments stream as deltas")
				require.JSONEq(t, `{"query":"stream me"}`, args)
				require.NotEmpty(t, fc.CallID)
			}
			row := e.captured(final.ID)
			require.True(t, row.Stream)
			require.Equal(t, "ok", row.Status)
			stored, err := c.Responses.Get(ctx, final.ID, responses.ResponseGetParams{})
			require.NoError(t, err)
			require.Equal(t, final.Output[0].ID, stored.Output[0].ID)
		})
	}
}

// TestResponsesRefusesWhatItCannotHonour: hosted tools, images and
// background mode get a 400 naming the field, never a silent drop.
func TestResponsesRefusesWhatItCannotHonour(t *testing.T) {
	e := newEnv(t, envOpts{})
	for name, body := range map[string]string{
		"tools[0].type":     `{"model":"` + fixtureModel + `","input":"x","tools":[{"type":"web_search"}]}`,
		"content[0].type":   `{"model":"` + fixtureModel + `","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}]}`,
		"background":        `{"model":"` + fixtureModel + `","input":"x","background":true}`,
		"input: required":   `{"model":"` + fixtureModel + `"}`,
		"item_reference":    `{"model":"` + fixtureModel + `","input":[{"type":"item_reference","id":"msg_1"}]}`,
		"[0].call_id":       `{"model":"` + fixtureModel + `","input":[{"type":"function_call_output","output":"x"}]}`,
		"tool_choice":       `{"model":"` + fixtureModel + `","input":"x","tool_choice":{"type":"function","name":"nope"}}`,
		"text.format.type":  `{"model":"` + fixtureModel + `","input":"x","text":{"format":{"type":"yaml"}}}`,
		"max_output_tokens": `{"model":"` + fixtureModel + `","input":"x","max_output_tokens":0}`,
	} {
		st, resp := e.doJSON(http.MethodPost, "/v1/responses", e.keyA, json.RawMessage(body))
		require.Equal(t, http.StatusBadRequest, st, name)
		require.Contains(t, resp["error"].(map[string]any)["message"], name)
	}
	st, _ := e.doJSON(http.MethodPost, "/v1/responses", e.keyA, json.RawMessage(`{"model":"`+fixtureModel+`","input":"x","previous_response_id":"resp_nope"}`))
	require.Equal(t, http.StatusNotFound, st)
	require.Zero(t, e.countInteractions(), "nothing refused was captured")
}
