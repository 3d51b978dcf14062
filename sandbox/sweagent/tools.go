package sweagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/openai/openai-go/v3"
)

// The agent's tools: what the model is offered and what each call does in
// the sandbox. A tool's definition and its implementation change together.

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

// toolArgs is the union of every tool's arguments.
type toolArgs struct {
	Command string  `json:"command"`
	Path    string  `json:"path"`
	Content *string `json:"content"`
	OldStr  *string `json:"old_str"`
	NewStr  *string `json:"new_str"`
	Summary string  `json:"summary"`
}

// runTool executes one tool call and returns the observation for the
// model, and whether the call submitted the work.
func runTool(ctx context.Context, cfg Config, env Env, res *Result, name, rawArgs string) (string, bool) {
	var args toolArgs
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
		return runBash(ctx, cfg, env, res, args.Command), false
	case ToolReadFile:
		return readFile(ctx, cfg, env, args.Path), false
	case ToolWriteFile:
		return writeFile(ctx, env, args.Path, args.Content), false
	case ToolStrReplace:
		return strReplace(ctx, env, args), false
	default:
		return "error: unknown tool " + name, false
	}
}

// runBash runs command in the sandbox if the policy allows it, counting
// what the policy refused or flagged in res.
func runBash(ctx context.Context, cfg Config, env Env, res *Result, command string) string {
	if strings.TrimSpace(command) == "" {
		return "error: command is required"
	}
	d := cfg.Policy.Check(command)
	switch d.Verdict {
	case sandbox.VerdictDeny:
		res.Denied++
		return "error: command refused by policy (" + d.Rule + "): " + d.Reason
	case sandbox.VerdictFlag:
		res.Flagged++
	}
	r, err := env.Exec(ctx, sandbox.ExecRequest{Cmd: command, Timeout: cfg.CommandTimeout, MaxOutput: int64(cfg.MaxObservation)})
	if err != nil {
		return "error: " + err.Error()
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
	return b.String()
}

// readFile returns the start of a workspace file, at most what one
// observation holds.
func readFile(ctx context.Context, cfg Config, env Env, rel string) string {
	p, err := workspacePath(rel)
	if err != nil {
		return "error: " + err.Error()
	}
	data, size, err := env.ReadFile(ctx, p, int64(cfg.MaxObservation))
	if err != nil {
		return "error: " + err.Error()
	}
	out := string(data)
	if size > int64(len(data)) {
		out += fmt.Sprintf("\n(file is %d bytes; showing the first %d)", size, len(data))
	}
	return out
}

// writeFile creates or overwrites a workspace file with content.
func writeFile(ctx context.Context, env Env, rel string, content *string) string {
	p, err := workspacePath(rel)
	if err != nil {
		return "error: " + err.Error()
	}
	if content == nil {
		return "error: content is required"
	}
	if err := env.WriteFile(ctx, p, []byte(*content), 0o644); err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("wrote %d bytes to %s", len(*content), p)
}

// strReplace replaces the one occurrence of args.OldStr in a workspace
// file; none or several is an error the model can act on.
func strReplace(ctx context.Context, env Env, args toolArgs) string {
	p, err := workspacePath(args.Path)
	if err != nil {
		return "error: " + err.Error()
	}
	if args.OldStr == nil || args.NewStr == nil || *args.OldStr == "" {
		return "error: old_str (non-empty) and new_str are required"
	}
	data, size, err := env.ReadFile(ctx, p, 8<<20)
	if err != nil {
		return "error: " + err.Error()
	}
	if size > int64(len(data)) {
		return "error: file too large to edit"
	}
	switch n := strings.Count(string(data), *args.OldStr); n {
	case 0:
		return "error: old_str not found in " + p
	case 1:
	default:
		return fmt.Sprintf("error: old_str occurs %d times in %s; include more context", n, p)
	}
	updated := strings.Replace(string(data), *args.OldStr, *args.NewStr, 1)
	if err := env.WriteFile(ctx, p, []byte(updated), 0o644); err != nil {
		return "error: " + err.Error()
	}
	return "replaced 1 occurrence in " + p
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
