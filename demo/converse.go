package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// reply is what one conversation with the deployment came to.
type reply struct {
	// Answer is the model's final answer ("" when it never gave one).
	Answer string
	// Trace shows the conversation for the status page: the tool calls
	// with what they returned, then the answer.
	Trace string
	// CompletionID is the last call's: late feedback names it.
	CompletionID string
	// Version served the last call.
	Version string
	// Calls counts the model calls.
	Calls int
}

// converse asks p as an agent of the fleet's task does, at temperature:
// for the letters, one call; for the tools task, a conversation in which
// the agent offers the tools, runs every tool call the model makes and
// sends back its result, until the model answers or has made
// demotask.MaxToolTurns calls. last marks the session done with the
// final call when the agent knows in advance which it is (the letters);
// a tools agent learns it only from the answer, so the caller ends the
// session after. opts carry the session's identity.
func (f *Fleet) converse(ctx context.Context, p demotask.Prompt, temperature float64, user string, last bool, opts ...option.RequestOption) (reply, error) {
	params := openai.ChatCompletionNewParams{
		Model:       f.cfg.Model,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(p.Text)},
		MaxTokens:   openai.Int(int64(demotask.AnswerTokens(p))),
		Temperature: openai.Float(temperature),
	}
	if user != "" {
		params.User = openai.String(user)
	}
	turns := 1
	if f.cfg.Task.Kind == demotask.KindTools {
		params.Tools, params.MaxTokens, turns = toolParams(), openai.Int(demotask.ToolTurnTokens), demotask.MaxToolTurns
	} else if last {
		opts = append(opts, option.WithHeader("X-Session-Done", "true"))
	}
	var r reply
	var trace []string
	for r.Calls < turns {
		var httpResp *http.Response
		resp, err := f.client.Chat.Completions.New(ctx, params, append(opts, option.WithResponseInto(&httpResp))...)
		if err != nil {
			return r, fmt.Errorf("chat completion: %w", err)
		}
		if len(resp.Choices) == 0 {
			return r, errors.New("chat completion: no choices")
		}
		r.Calls++
		r.CompletionID, r.Version = resp.ID, servedVersion(resp, httpResp)
		msg := resp.Choices[0].Message
		if len(msg.ToolCalls) == 0 || turns == 1 {
			r.Answer = msg.Content
			trace = append(trace, msg.Content)
			break
		}
		params.Messages = append(params.Messages, msg.ToParam())
		for _, call := range msg.ToolCalls {
			out := demotask.RunTool(p, call.Function.Name, call.Function.Arguments)
			trace = append(trace, call.Function.Name+call.Function.Arguments+" → "+out)
			params.Messages = append(params.Messages, openai.ToolMessage(out, call.ID))
		}
	}
	r.Trace = strings.Join(trace, "; ")
	return r, nil
}

// toolParams are the tools task's tools as the OpenAI SDK sends them.
func toolParams() []openai.ChatCompletionToolUnionParam {
	var out []openai.ChatCompletionToolUnionParam
	for _, t := range demotask.Tools() {
		var params shared.FunctionParameters
		_ = json.Unmarshal(t.Parameters, &params) // a literal of demotask's
		out = append(out, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: t.Name, Parameters: params}))
	}
	return out
}
