// Command openai-responses is an agent written with openai-go (v3) on the
// OpenAI Responses API, with a Flywheel gateway as its endpoint: a
// function tool, its output sent back by previous_response_id alone (the
// gateway keeps the conversation), and a streamed final answer. The chain
// is one session; the answer is rewarded through the gateway's reward API.
//
//	export FLYWHEEL_API_KEY=fw-…          # printed by `flywheel up`, or `flywheel keys create`
//	go run ./examples/openai-responses    # FLYWHEEL_BASE_URL, FLYWHEEL_MODEL optional
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// options are what the agent needs to reach the gateway.
type options struct {
	// BaseURL is the gateway's OpenAI base URL, ending in /v1.
	BaseURL string
	APIKey  string
	Model   string
	// Out receives the conversation as it happens.
	Out io.Writer
}

// result is what the run did, for its test.
type result struct {
	// ToolCalls are the tool calls the model made, as "name(arguments)".
	ToolCalls []string
	Answer    string
	// ResponseIDs are the chain's responses, first to last.
	ResponseIDs []string
	// Session is the session the gateway recorded the chain in.
	Session string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o := options{
		BaseURL: envOr("FLYWHEEL_BASE_URL", "http://127.0.0.1:8080/v1"),
		APIKey:  os.Getenv("FLYWHEEL_API_KEY"),
		Model:   envOr("FLYWHEEL_MODEL", "flywheel-policy"),
		Out:     os.Stdout,
	}
	if o.APIKey == "" {
		log.Fatal("set FLYWHEEL_API_KEY to a Flywheel API key (flywheel keys create --tenant NAME)")
	}
	if _, err := run(ctx, o); err != nil {
		log.Fatal(err)
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// lookup is the agent's tool: a tiny local index of notes.
func lookup(query string) string {
	if strings.Contains(strings.ToLower(query), "chain") {
		return "Send previous_response_id and only the new items; the gateway rebuilds the rest."
	}
	return "no note matches " + query
}

// maxTurns bounds the tool loop.
const maxTurns = 4

func run(ctx context.Context, o options) (*result, error) {
	client := openai.NewClient(option.WithBaseURL(o.BaseURL), option.WithAPIKey(o.APIKey))
	tools := []responses.ToolUnionParam{responses.ToolParamOfFunction("lookup", map[string]any{
		"type":       "object",
		"properties": map[string]any{"query": map[string]any{"type": "string"}},
		"required":   []string{"query"},
	}, false)}
	question := "How do I chain responses?"
	fmt.Fprintf(o.Out, "user: %s\n", question)
	params := responses.ResponseNewParams{
		Model:        o.Model,
		Instructions: openai.String("Answer briefly. Use lookup for anything about Flywheel."),
		Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String(question)},
		Tools:        tools,
	}
	res := &result{}
	for range maxTurns {
		resp, session, err := stream(ctx, client, params, o.Out)
		if err != nil {
			return nil, err
		}
		res.ResponseIDs, res.Session = append(res.ResponseIDs, resp.ID), session
		var outputs responses.ResponseInputParam
		for _, item := range resp.Output {
			if item.Type != "function_call" {
				continue
			}
			call := item.AsFunctionCall()
			var args struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal([]byte(call.Arguments), &args); err != nil {
				return nil, fmt.Errorf("tool %s: arguments %q: %w", call.Name, call.Arguments, err)
			}
			out := lookup(args.Query)
			res.ToolCalls = append(res.ToolCalls, call.Name+"("+call.Arguments+")")
			fmt.Fprintf(o.Out, "tool %s(%s) -> %s\n", call.Name, call.Arguments, out)
			answer := responses.ResponseInputItemParamOfFunctionCallOutput(out)
			answer.OfFunctionCallOutput.CallID = openai.String(call.CallID)
			outputs = append(outputs, answer)
		}
		if len(outputs) == 0 {
			res.Answer = resp.OutputText()
			break
		}
		// Only the new items go: the gateway holds the conversation.
		params.PreviousResponseID = openai.String(resp.ID)
		params.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: outputs}
	}
	if res.Answer == "" {
		return nil, errors.New("no answer after the tool calls")
	}
	// The reward API is the gateway's own, so the same client posts to it.
	var reward struct {
		RewardID int64 `json:"reward_id"`
	}
	last := res.ResponseIDs[len(res.ResponseIDs)-1]
	if err := client.Post(ctx, "sessions/"+res.Session+"/reward",
		map[string]any{"value": 1, "completion_id": last, "source": "example"}, &reward); err != nil {
		return nil, fmt.Errorf("reward: %w", err)
	}
	fmt.Fprintf(o.Out, "reward %d recorded for %s in session %s\n", reward.RewardID, last, res.Session)
	return res, nil
}

// stream runs one streamed response, printing its text as it arrives, and
// returns the completed response and the session the gateway named in its
// X-Session-Id header.
func stream(ctx context.Context, client openai.Client, params responses.ResponseNewParams, out io.Writer) (*responses.Response, string, error) {
	var session string
	s := client.Responses.NewStreaming(ctx, params, option.WithMiddleware(
		func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(r)
			if err == nil {
				session = resp.Header.Get("X-Session-Id")
			}
			return resp, err
		}))
	var done *responses.Response
	printed := false
	for s.Next() {
		ev := s.Current()
		switch ev.Type {
		case "response.output_text.delta":
			if !printed {
				fmt.Fprint(out, "assistant: ")
				printed = true
			}
			fmt.Fprint(out, ev.Delta)
		case "response.completed", "response.incomplete":
			r := ev.Response
			done = &r
		}
	}
	if printed {
		fmt.Fprintln(out)
	}
	if err := s.Err(); err != nil {
		return nil, "", fmt.Errorf("response: %w", err)
	}
	if done == nil {
		return nil, "", errors.New("response: the stream ended without a completed response")
	}
	return done, session, nil
}
