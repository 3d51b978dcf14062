package sweagent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/sandboxtest"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent"
	"github.com/flywheel-ai/flywheel/sandbox/sweagent/sweagenttest"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/stretchr/testify/require"
)

func manager(t *testing.T) *sandbox.Manager {
	t.Helper()
	return sandboxtest.Manager(t, sandboxtest.Docker(t), sandbox.Config{})
}

func baseSandbox(t *testing.T, m *sandbox.Manager) *sandbox.Sandbox {
	t.Helper()
	sb, err := m.Create(context.Background(), sandboxtest.BaseImage(t, m.Client()))
	require.NoError(t, err)
	return sb
}

func fixture(t *testing.T, script []sweagenttest.Step) (*sweagenttest.FixtureModel, string) {
	f := &sweagenttest.FixtureModel{Script: script}
	srv := sweagenttest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL + "/v1"
}

// TestAgentSolvesShippedTaskThroughFixtureModel runs the whole loop on a
// real task sandbox with the fixture model and grades the result.
func TestAgentSolvesShippedTaskThroughFixtureModel(t *testing.T) {
	m := manager(t)
	tk, err := tasks.Find("chunked")
	require.NoError(t, err)
	ctx := context.Background()
	img, err := tasks.EnsureImage(ctx, m.Client(), sandboxtest.PythonImage(t, m.Client()), tk, nil)
	require.NoError(t, err)
	sb, err := m.Create(ctx, img)
	require.NoError(t, err)

	f, url := fixture(t, sweagenttest.SolveScript(tk.Solution))
	calls := 0
	res, err := sweagent.Run(ctx, sweagent.Config{
		BaseURL: url, Model: "fixture", Headers: map[string]string{"X-Session-Id": "s-1"},
		OnToolCall: func(int, string) { calls++ },
	}, sb, tk.ProblemStatement)
	require.NoError(t, err)
	require.Equal(t, sweagent.StopSubmitted, res.StopReason)
	require.Equal(t, "applied the fix", res.Summary)
	require.Equal(t, len(f.Script), res.ToolCalls)
	require.Equal(t, res.ToolCalls, calls)
	reqs := f.Requests()
	require.Len(t, reqs, len(f.Script))
	require.Equal(t, "s-1", reqs[0].Header.Get("X-Session-Id"))
	require.ElementsMatch(t, []string{"bash", "read_file", "write_file", "str_replace", "submit"}, reqs[0].Tools)
	require.Contains(t, reqs[1].LastToolResult, "iterkit", "the ls output went back to the model")

	grade, err := tasks.Grade(ctx, sb, tk, nil)
	require.NoError(t, err)
	require.True(t, grade.Resolved, "%v %s", grade.Tests, grade.OutputTail)
}

func TestAgentToolsPolicyAndBudgets(t *testing.T) {
	m := manager(t)
	ctx := context.Background()

	t.Run("tools and policy", func(t *testing.T) {
		sb := baseSandbox(t, m)
		f, url := fixture(t, []sweagenttest.Step{
			{Tool: "write_file", Args: map[string]any{"path": "a.txt", "content": "one two two"}},
			{Tool: "str_replace", Args: map[string]any{"path": "a.txt", "old_str": "two", "new_str": "2"}},
			{Tool: "str_replace", Args: map[string]any{"path": "a.txt", "old_str": "one", "new_str": "1"}},
			{Tool: "bash", Args: map[string]any{"command": "git log --all"}},
			{Tool: "read_file", Args: map[string]any{"path": "/etc/passwd"}},
			{Tool: "bash", Args: map[string]any{"command": "cat a.txt"}},
			{Tool: "submit", Args: map[string]any{"summary": "done"}},
		})
		res, err := sweagent.Run(ctx, sweagent.Config{BaseURL: url, Model: "fixture"}, sb, "edit a.txt")
		require.NoError(t, err)
		require.Equal(t, sweagent.StopSubmitted, res.StopReason)
		require.Equal(t, 1, res.Denied)
		reqs := f.Requests()
		require.Contains(t, reqs[2].LastToolResult, "occurs 2 times")
		require.Contains(t, reqs[3].LastToolResult, "replaced 1 occurrence")
		require.Contains(t, reqs[4].LastToolResult, "refused by policy (git-history)")
		require.Contains(t, reqs[5].LastToolResult, "outside /workspace")
		require.Contains(t, reqs[6].LastToolResult, "1 two two")
	})

	t.Run("tool call cap", func(t *testing.T) {
		sb := baseSandbox(t, m)
		var script []sweagenttest.Step
		for range 10 {
			script = append(script, sweagenttest.Step{Tool: "bash", Args: map[string]any{"command": "true"}})
		}
		_, url := fixture(t, script)
		res, err := sweagent.Run(ctx, sweagent.Config{BaseURL: url, Model: "fixture", MaxToolCalls: 3}, sb, "loop")
		require.NoError(t, err)
		require.Equal(t, sweagent.StopMaxToolCalls, res.StopReason)
		require.Equal(t, 3, res.ToolCalls)
	})

	t.Run("wall time cap", func(t *testing.T) {
		sb := baseSandbox(t, m)
		_, url := fixture(t, []sweagenttest.Step{
			{Tool: "bash", Args: map[string]any{"command": "sleep 30"}},
			{Tool: "submit"},
		})
		start := time.Now()
		res, err := sweagent.Run(ctx, sweagent.Config{BaseURL: url, Model: "fixture", MaxWallTime: time.Second, CommandTimeout: time.Minute}, sb, "sleep")
		require.NoError(t, err)
		require.Equal(t, sweagent.StopWallTime, res.StopReason)
		require.Less(t, time.Since(start), 10*time.Second)
	})

	t.Run("model that stops calling tools", func(t *testing.T) {
		sb := baseSandbox(t, m)
		_, url := fixture(t, []sweagenttest.Step{{Text: "I think it is fine."}})
		res, err := sweagent.Run(ctx, sweagent.Config{BaseURL: url, Model: "fixture"}, sb, "x")
		require.NoError(t, err)
		require.Equal(t, sweagent.StopNoToolCall, res.StopReason)
		require.Equal(t, 2, res.Turns)
	})

	t.Run("bad arguments and unknown tools", func(t *testing.T) {
		sb := baseSandbox(t, m)
		f, url := fixture(t, []sweagenttest.Step{
			{Tool: "frobnicate", Args: map[string]any{}},
			{Tool: "bash", Args: map[string]any{}},
			{Tool: "submit"},
		})
		res, err := sweagent.Run(ctx, sweagent.Config{BaseURL: url, Model: "fixture"}, sb, "x")
		require.NoError(t, err)
		require.Equal(t, sweagent.StopSubmitted, res.StopReason)
		reqs := f.Requests()
		require.Contains(t, reqs[1].LastToolResult, "unknown tool")
		require.Contains(t, reqs[2].LastToolResult, "command is required")
	})

	t.Run("config and upstream errors", func(t *testing.T) {
		sb := baseSandbox(t, m)
		_, err := sweagent.Run(ctx, sweagent.Config{Model: "x"}, sb, "x")
		require.Error(t, err)
		_, err = sweagent.Run(ctx, sweagent.Config{BaseURL: "http://127.0.0.1:1/v1", Model: "x"}, sb, "x")
		require.Error(t, err)
		require.True(t, strings.Contains(err.Error(), "model call 1"), err.Error())
	})
}
