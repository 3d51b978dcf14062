// Package sweagent is flywheel's built-in SWE agent: a tool-calling loop
// (bash, read_file, write_file, str_replace, submit) that speaks the OpenAI
// Chat Completions protocol over HTTP to a base URL, normally the flywheel
// gateway. It takes the same path as any outside agent, so its trajectories
// are captured and rewarded like theirs. It knows nothing about Temporal or
// grading; it only edits a sandbox until it submits or runs out of budget.
package sweagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
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

// Tool names.
const (
	ToolBash       = "bash"
	ToolReadFile   = "read_file"
	ToolWriteFile  = "write_file"
	ToolStrReplace = "str_replace"
	ToolSubmit     = "submit"
)

func tool(name, desc string, props map[string]any, required ...string) openai.ChatCompletionToolUnionParam {
	return openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name:        name,
		Description: openai.String(desc),
		Parameters: openai.FunctionParameters{
			"type": "object", "properties": props, "required": required, "additionalProperties": false,
		},
	})
}

func str(desc string) map[string]any { return map[string]any{"type": "string", "description": desc} }

// Tools are the tool definitions offered to the model.
func Tools() []openai.ChatCompletionToolUnionParam {
	return []openai.ChatCompletionToolUnionParam{
		tool(ToolBash, "Run a shell command in /workspace and return its exit code and output.", map[string]any{"command": str("the command")}, "command"),
		tool(ToolReadFile, "Read a text file.", map[string]any{"path": str("path, relative to /workspace or absolute")}, "path"),
		tool(ToolWriteFile, "Create or overwrite a file.", map[string]any{"path": str("path"), "content": str("the full new content")}, "path", "content"),
		tool(ToolStrReplace, "Replace the single occurrence of old_str in a file with new_str.", map[string]any{"path": str("path"), "old_str": str("exact text to replace; must occur once"), "new_str": str("replacement")}, "path", "old_str", "new_str"),
		tool(ToolSubmit, "Finish: the work in /workspace is the answer.", map[string]any{"summary": str("one-line summary of the fix")}),
	}
}

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

// runTool executes one tool call and returns the observation for the model.
func runTool(ctx context.Context, cfg Config, env Env, res *Result, name, rawArgs string) (string, bool) {
	var args struct {
		Command string  `json:"command"`
		Path    string  `json:"path"`
		Content *string `json:"content"`
		OldStr  *string `json:"old_str"`
		NewStr  *string `json:"new_str"`
		Summary string  `json:"summary"`
	}
	if rawArgs != "" {
		if err := json.Unmarshal([]byte(rawArgs), &args); err != nil {
			return "error: arguments are not valid JSON: " + err.Error(), false
		}
	}
	switch name {
	case ToolSubmit:
		res.Summary = args.Summary
		return "", true
	case ToolBash:
		if strings.TrimSpace(args.Command) == "" {
			return "error: command is required", false
		}
		d := cfg.Policy.Check(args.Command)
		switch d.Verdict {
		case sandbox.VerdictDeny:
			res.Denied++
			return "error: command refused by policy (" + d.Rule + "): " + d.Reason, false
		case sandbox.VerdictFlag:
			res.Flagged++
		}
		r, err := env.Exec(ctx, sandbox.ExecRequest{Cmd: args.Command, Timeout: cfg.CommandTimeout, MaxOutput: int64(cfg.MaxObservation)})
		if err != nil {
			return "error: " + err.Error(), false
		}
		var b strings.Builder
		fmt.Fprintf(&b, "exit code: %d\n", r.ExitCode)
		if r.TimedOut {
			fmt.Fprintf(&b, "(killed after %s)\n", cfg.CommandTimeout)
		}
		b.Write(r.Stdout)
		if len(r.Stderr) > 0 {
			b.WriteString("\nstderr:\n")
			b.Write(r.Stderr)
		}
		if r.Truncated {
			b.WriteString("\n(output truncated)")
		}
		return b.String(), false
	case ToolReadFile:
		p, err := workspacePath(args.Path)
		if err != nil {
			return "error: " + err.Error(), false
		}
		data, size, err := env.ReadFile(ctx, p, int64(cfg.MaxObservation))
		if err != nil {
			return "error: " + err.Error(), false
		}
		out := string(data)
		if size > int64(len(data)) {
			out += fmt.Sprintf("\n(file is %d bytes; showing the first %d)", size, len(data))
		}
		return out, false
	case ToolWriteFile:
		p, err := workspacePath(args.Path)
		if err != nil {
			return "error: " + err.Error(), false
		}
		if args.Content == nil {
			return "error: content is required", false
		}
		if err := env.WriteFile(ctx, p, []byte(*args.Content), 0o644); err != nil {
			return "error: " + err.Error(), false
		}
		return fmt.Sprintf("wrote %d bytes to %s", len(*args.Content), p), false
	case ToolStrReplace:
		p, err := workspacePath(args.Path)
		if err != nil {
			return "error: " + err.Error(), false
		}
		if args.OldStr == nil || args.NewStr == nil || *args.OldStr == "" {
			return "error: old_str (non-empty) and new_str are required", false
		}
		data, size, err := env.ReadFile(ctx, p, 8<<20)
		if err != nil {
			return "error: " + err.Error(), false
		}
		if size > int64(len(data)) {
			return "error: file too large to edit", false
		}
		switch n := strings.Count(string(data), *args.OldStr); n {
		case 0:
			return "error: old_str not found in " + p, false
		case 1:
		default:
			return fmt.Sprintf("error: old_str occurs %d times in %s; include more context", n, p), false
		}
		updated := strings.Replace(string(data), *args.OldStr, *args.NewStr, 1)
		if err := env.WriteFile(ctx, p, []byte(updated), 0o644); err != nil {
			return "error: " + err.Error(), false
		}
		return "replaced 1 occurrence in " + p, false
	default:
		return "error: unknown tool " + name, false
	}
}

// workspacePath resolves p against /workspace and keeps it there: the
// file tools are for the repository (bash can reach the rest of the
// sandbox, as the sandbox user).
func workspacePath(p string) (string, error) {
	if strings.TrimSpace(p) == "" {
		return "", errors.New("path is required")
	}
	if !path.IsAbs(p) {
		p = path.Join(sandbox.Workspace, p)
	}
	p = path.Clean(p)
	if p != sandbox.Workspace && !strings.HasPrefix(p, sandbox.Workspace+"/") {
		return "", fmt.Errorf("path %s is outside %s", p, sandbox.Workspace)
	}
	return p, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n(truncated)"
}
