// Command openai-chat is an agent written with openai-go (v3) that uses a
// Flywheel gateway as its OpenAI endpoint: a chat with a tool, the tool's
// result sent back, every call in one session named by the X-Session-Id
// header, and a reward for the answer through the gateway's reward API.
//
//	export FLYWHEEL_API_KEY=fw-…     # printed by `flywheel up`, or `flywheel keys create`
//	go run ./examples/openai-chat    # FLYWHEEL_BASE_URL, FLYWHEEL_MODEL, FLYWHEEL_SESSION optional
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// options are what the agent needs to reach the gateway.
type options struct {
	// BaseURL is the gateway's OpenAI base URL, ending in /v1.
	BaseURL string
	APIKey  string
	Model   string
	// Session names the session every call of this run is recorded in.
	Session string
	// Out receives the conversation as it happens.
	Out io.Writer
}

// result is what the run did, for its test.
type result struct {
	// ToolCalls are the tool calls the model made, as "name(arguments)".
	ToolCalls []string
	Answer    string
	// CompletionID is the final answer's id, which the reward names.
	CompletionID string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o := options{
		BaseURL: envOr("FLYWHEEL_BASE_URL", "http://127.0.0.1:8080/v1"),
		APIKey:  os.Getenv("FLYWHEEL_API_KEY"),
		Model:   envOr("FLYWHEEL_MODEL", "flywheel-policy"),
		Session: envOr("FLYWHEEL_SESSION", fmt.Sprintf("openai-chat-%d", time.Now().Unix())),
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

// searchDocs is the agent's tool: a tiny local index of notes.
func searchDocs(query string) string {
	notes := []struct{ word, note string }{
		{"reward", "POST /v1/sessions/{id}/reward {value} scores a session; POST /v1/feedback scores a completion later."},
		{"session", "Name a session with the X-Session-Id header, or a /s/{id}/ prefix on the base URL."},
	}
	for _, n := range notes {
		if strings.Contains(strings.ToLower(query), n.word) {
			return n.note
		}
	}
	return "no note matches " + query
}

// maxTurns bounds the tool loop.
const maxTurns = 4

func run(ctx context.Context, o options) (*result, error) {
	// Only the base URL and the key change; the header names the session.
	client := openai.NewClient(
		option.WithBaseURL(o.BaseURL),
		option.WithAPIKey(o.APIKey),
		option.WithHeader("X-Session-Id", o.Session),
	)
	tools := []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "search_docs",
		Description: openai.String("Search Flywheel's notes."),
		Parameters: shared.FunctionParameters{
			"type":       "object",
			"properties": map[string]any{"query": map[string]any{"type": "string"}},
			"required":   []string{"query"},
		},
	})}
	question := "How do I reward a session?"
	fmt.Fprintf(o.Out, "session %s\nuser: %s\n", o.Session, question)
	messages := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("Answer briefly. Use search_docs for anything about Flywheel."),
		openai.UserMessage(question),
	}
	res := &result{}
	for range maxTurns {
		completion, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: o.Model, Messages: messages, Tools: tools, MaxTokens: openai.Int(256),
		})
		if err != nil {
			return nil, fmt.Errorf("chat completion: %w", err)
		}
		msg := completion.Choices[0].Message
		if len(msg.ToolCalls) == 0 {
			res.Answer, res.CompletionID = msg.Content, completion.ID
			fmt.Fprintf(o.Out, "assistant: %s\n", msg.Content)
			break
		}
		// The assistant's tool calls go back with their results, each
		// answering its call's id.
		messages = append(messages, msg.ToParam())
		for _, call := range msg.ToolCalls {
			var args struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
				return nil, fmt.Errorf("tool %s: arguments %q: %w", call.Function.Name, call.Function.Arguments, err)
			}
			out := searchDocs(args.Query)
			res.ToolCalls = append(res.ToolCalls, call.Function.Name+"("+call.Function.Arguments+")")
			fmt.Fprintf(o.Out, "tool %s(%s) -> %s\n", call.Function.Name, call.Function.Arguments, out)
			messages = append(messages, openai.ToolMessage(out, call.ID))
		}
	}
	if res.CompletionID == "" {
		return nil, errors.New("no answer after the tool calls")
	}

	// The reward API is the gateway's own, so the same client posts to it
	// (paths are relative to the base URL).
	var reward struct {
		RewardID int64 `json:"reward_id"`
	}
	err := client.Post(ctx, "sessions/"+o.Session+"/reward",
		map[string]any{"value": 1, "completion_id": res.CompletionID, "source": "example"}, &reward)
	if err != nil {
		return nil, fmt.Errorf("reward: %w", err)
	}
	fmt.Fprintf(o.Out, "reward %d recorded for %s\n", reward.RewardID, res.CompletionID)
	return res, nil
}
