// Package sweagent is flywheel's built-in SWE agent: a tool-calling loop
// (bash, read_file, write_file, str_replace, submit) that speaks the OpenAI
// Chat Completions protocol over HTTP to a base URL, normally the flywheel
// gateway. It takes the same path as any outside agent, so its trajectories
// are captured and rewarded like theirs. It knows nothing about Temporal or
// grading; it only edits a sandbox until it submits or runs out of budget.
package sweagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// Env is the sandbox the agent works in.
type Env interface {
	Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error)
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, int64, error)
	WriteFile(ctx context.Context, path string, data []byte, mode uint32) error
}

// Config configures a run.
type Config struct {
	// BaseURL of an OpenAI-compatible API, e.g. http://localhost:8080/v1.
	BaseURL string
	// APIKey is sent as a bearer token; may be empty for local servers.
	APIKey string
	// Model is the model name to request. Required.
	Model string
	// Headers are added to every request (e.g. X-Session-Id for the gateway).
	Headers map[string]string
	// MaxToolCalls caps tool calls per run; default 40.
	MaxToolCalls int
	// MaxWallTime caps the whole run; default 15 minutes.
	MaxWallTime time.Duration
	// CommandTimeout bounds one bash call; default 60s.
	CommandTimeout time.Duration
	// MaxObservation caps the text returned to the model per tool call;
	// default 16 KiB.
	MaxObservation int
	// MaxCompletionTokens per model call; 0 leaves it to the server.
	MaxCompletionTokens int64
	// Policy screens bash commands; default sandbox.DefaultPolicy.
	Policy *sandbox.Policy
	// HTTPClient defaults to http.DefaultClient.
	HTTPClient *http.Client
	// OnToolCall, if set, is called after every tool call (heartbeats).
	OnToolCall func(n int, tool string)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) fill() error {
	if c.BaseURL == "" {
		return errors.New("sweagent: BaseURL is required")
	}
	if c.Model == "" {
		return errors.New("sweagent: Model is required")
	}
	if c.MaxToolCalls == 0 {
		c.MaxToolCalls = 40
	}
	if c.MaxWallTime == 0 {
		c.MaxWallTime = 15 * time.Minute
	}
	if c.CommandTimeout == 0 {
		c.CommandTimeout = 60 * time.Second
	}
	if c.MaxObservation == 0 {
		c.MaxObservation = 16 << 10
	}
	if c.MaxToolCalls < 0 || c.MaxWallTime < 0 || c.CommandTimeout < 0 || c.MaxObservation < 0 {
		return errors.New("sweagent: limits must not be negative")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Policy == nil {
		c.Policy = sandbox.DefaultPolicy(c.Logger)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = http.DefaultClient
	}
	return nil
}

// Stop reasons.
const (
	StopSubmitted    = "submitted"
	StopMaxToolCalls = "max_tool_calls"
	StopWallTime     = "wall_time"
	StopNoToolCall   = "no_tool_call"
)

// Result summarises a run.
type Result struct {
	StopReason string `json:"stop_reason"`
	// Summary is what the model said when it submitted.
	Summary   string `json:"summary,omitempty"`
	Turns     int    `json:"turns"`
	ToolCalls int    `json:"tool_calls"`
	// Denied and Flagged count bash commands the policy refused or flagged.
	Denied  int `json:"denied"`
	Flagged int `json:"flagged"`
	// CompletionIDs are the ids the server gave each model call, for late
	// feedback.
	CompletionIDs []string `json:"completion_ids,omitempty"`
}

const systemPrompt = `You are a software engineer fixing a bug in the repository at /workspace.
Use the tools to inspect files, run commands and edit code. The network is disabled.
When the fix is complete, call submit with a one-line summary.`

// Run works on the problem in env until the model submits or a budget runs
// out. Running out of budget is a normal result, not an error; an error
// means the model API failed (the partial result is returned with it).
func Run(ctx context.Context, cfg Config, env Env, problem string) (Result, error) {
	if err := cfg.fill(); err != nil {
		return Result{}, err
	}
	if strings.TrimSpace(problem) == "" {
		return Result{}, errors.New("sweagent: empty problem statement")
	}
	opts := []option.RequestOption{option.WithBaseURL(cfg.BaseURL), option.WithHTTPClient(cfg.HTTPClient), option.WithMaxRetries(2)}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	} else {
		opts = append(opts, option.WithAPIKey("none"))
	}
	for k, v := range cfg.Headers {
		opts = append(opts, option.WithHeader(k, v))
	}
	client := openai.NewClient(opts...)

	ctx, cancel := context.WithTimeout(ctx, cfg.MaxWallTime)
	defer cancel()
	log := cfg.Logger
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(systemPrompt),
		openai.UserMessage("Problem:\n" + problem),
	}
	var res Result
	idle := 0
	for {
		params := openai.ChatCompletionNewParams{Model: cfg.Model, Messages: msgs, Tools: Tools()}
		if cfg.MaxCompletionTokens > 0 {
			params.MaxCompletionTokens = openai.Int(cfg.MaxCompletionTokens)
		}
		comp, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				res.StopReason = StopWallTime
				return res, nil
			}
			return res, fmt.Errorf("sweagent: model call %d: %w", res.Turns+1, err)
		}
		res.Turns++
		res.CompletionIDs = append(res.CompletionIDs, comp.ID)
		if len(comp.Choices) == 0 {
			return res, fmt.Errorf("sweagent: model call %d returned no choices", res.Turns)
		}
		msg := comp.Choices[0].Message
		msgs = append(msgs, msg.ToParam())
		if len(msg.ToolCalls) == 0 {
			idle++
			if idle >= 2 {
				res.StopReason = StopNoToolCall
				return res, nil
			}
			msgs = append(msgs, openai.UserMessage("Use the tools to work on the repository, and call submit when the fix is done."))
			continue
		}
		idle = 0
		for _, tc := range msg.ToolCalls {
			if res.ToolCalls >= cfg.MaxToolCalls {
				res.StopReason = StopMaxToolCalls
				return res, nil
			}
			res.ToolCalls++
			name := tc.Function.Name
			out, submitted := runTool(ctx, cfg, env, &res, name, tc.Function.Arguments)
			log.Debug("sweagent tool call", "n", res.ToolCalls, "tool", name)
			if cfg.OnToolCall != nil {
				cfg.OnToolCall(res.ToolCalls, name)
			}
			if submitted {
				res.StopReason = StopSubmitted
				return res, nil
			}
			msgs = append(msgs, openai.ToolMessage(clip(out, cfg.MaxObservation), tc.ID))
		}
		if ctx.Err() != nil {
			res.StopReason = StopWallTime
			return res, nil
		}
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n(truncated)"
}
