// Command anthropic-messages is an agent written with anthropic-sdk-go
// (v2) that uses a Flywheel gateway as its Anthropic endpoint: Messages
// with a tool, the tool's result sent back. Its session is named by the
// /s/{session}/ prefix of the base URL, as an agent that can change only
// its base URL (Claude Code's ANTHROPIC_BASE_URL) names it.
//
//	export FLYWHEEL_API_KEY=fw-…          # printed by `flywheel up`, or `flywheel keys create`
//	go run ./examples/anthropic-messages  # FLYWHEEL_URL, FLYWHEEL_MODEL, FLYWHEEL_SESSION optional
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

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// options are what the agent needs to reach the gateway.
type options struct {
	// URL is the gateway's root, without /v1 (the SDK adds /v1/messages).
	URL    string
	APIKey string
	Model  string
	// Session names the session every call of this run is recorded in.
	Session string
	// Out receives the conversation as it happens.
	Out io.Writer
}

// result is what the run did, for its test.
type result struct {
	// ToolCalls are the tool uses the model made, as "name(input)".
	ToolCalls []string
	Answer    string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o := options{
		URL:     envOr("FLYWHEEL_URL", "http://127.0.0.1:8080"),
		APIKey:  os.Getenv("FLYWHEEL_API_KEY"),
		Model:   envOr("FLYWHEEL_MODEL", "flywheel-policy"),
		Session: envOr("FLYWHEEL_SESSION", fmt.Sprintf("anthropic-messages-%d", time.Now().Unix())),
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

// weather is the agent's tool, with canned answers.
func weather(city string) string {
	switch strings.ToLower(strings.TrimSpace(city)) {
	case "oslo":
		return "Oslo: 4°C, light rain"
	case "lisbon":
		return "Lisbon: 19°C, sunny"
	}
	return "no forecast for " + city
}

// maxTurns bounds the tool loop.
const maxTurns = 4

func run(ctx context.Context, o options) (*result, error) {
	// The session is in the base URL: /s/{session}/v1/messages.
	client := anthropic.NewClient(
		option.WithBaseURL(strings.TrimSuffix(o.URL, "/")+"/s/"+o.Session+"/"),
		option.WithAPIKey(o.APIKey),
	)
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{
		Name:        "weather",
		Description: anthropic.String("Today's weather in a city."),
		InputSchema: anthropic.ToolInputSchemaParam{
			Properties: map[string]any{"query": map[string]any{"type": "string", "description": "the city"}},
			Required:   []string{"query"},
		},
	}}}
	question := "Oslo"
	fmt.Fprintf(o.Out, "session %s\nuser: %s\n", o.Session, question)
	messages := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(question))}
	res := &result{}
	for range maxTurns {
		msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{
			Model: anthropic.Model(o.Model), MaxTokens: 256, Messages: messages, Tools: tools,
			System: []anthropic.TextBlockParam{{Text: "You report the weather. Use the weather tool."}},
		})
		if err != nil {
			return nil, fmt.Errorf("messages: %w", err)
		}
		if msg.StopReason != anthropic.StopReasonToolUse {
			for _, b := range msg.Content {
				res.Answer += b.Text
			}
			fmt.Fprintf(o.Out, "assistant: %s\n", res.Answer)
			return res, nil
		}
		// The assistant's turn goes back as it was, then one user turn
		// with a tool_result for each tool_use.
		messages = append(messages, msg.ToParam())
		var results []anthropic.ContentBlockParamUnion
		for _, b := range msg.Content {
			if b.Type != "tool_use" {
				continue
			}
			use := b.AsToolUse()
			var in struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(use.Input, &in); err != nil {
				return nil, fmt.Errorf("tool %s: input %s: %w", use.Name, use.Input, err)
			}
			out := weather(in.Query)
			res.ToolCalls = append(res.ToolCalls, use.Name+"("+string(use.Input)+")")
			fmt.Fprintf(o.Out, "tool %s(%s) -> %s\n", use.Name, use.Input, out)
			results = append(results, anthropic.NewToolResultBlock(use.ID, out, false))
		}
		messages = append(messages, anthropic.NewUserMessage(results...))
	}
	return nil, errors.New("no answer after the tool calls")
}
