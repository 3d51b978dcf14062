package gateway_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdminSuites(t *testing.T) {
	e := newEnv(t, envOpts{})
	admin := e.cfg.AdminKey
	path := "/admin/v1/deployments/acme-agent/suites/regression"
	body := map[string]any{"prompts": []any{
		map[string]any{"prompt": "What is the capital of France?", "expect": "Paris"},
		map[string]any{"messages": []any{map[string]any{"role": "user", "content": "2+2"}}, "expect": "4", "match": "exact", "max_tokens": 4},
	}}

	st, _ := e.doJSON("PUT", path, e.keyA, body)
	require.Equal(t, 401, st, "a tenant key is not the admin key")

	st, out := e.doJSON("PUT", path, admin, body)
	require.Equal(t, 200, st, out)
	require.Equal(t, 2.0, out["prompts"])
	require.Equal(t, true, out["changed"])
	st, out = e.doJSON("PUT", path, admin, body)
	require.Equal(t, 200, st)
	require.Equal(t, false, out["changed"], "the same prompts again change nothing (their results and the anchor stay)")

	st, out = e.doJSON("GET", path, admin, nil)
	require.Equal(t, 200, st)
	prompts := out["prompts"].([]any)
	require.Len(t, prompts, 2)
	require.Equal(t, "contains", prompts[0].(map[string]any)["match"], "regression prompts match by substring unless they say otherwise")
	require.Equal(t, "exact", prompts[1].(map[string]any)["match"])

	st, out = e.doJSON("GET", "/admin/v1/deployments/acme-agent/suites", admin, nil)
	require.Equal(t, 200, st)
	suites := out["suites"].([]any)
	require.Len(t, suites, 3, "every suite is listed, the empty ones too")
	require.Equal(t, 2.0, suites[0].(map[string]any)["prompts"])
	require.Equal(t, 0.0, suites[1].(map[string]any)["prompts"])

	// Bad input: a clear error with the right status, every bad prompt named.
	st, out = e.doJSON("PUT", path, admin, map[string]any{"prompts": []any{
		map[string]any{"prompt": "x"},
		map[string]any{"prompt": "y", "expect": "z", "match": "fuzzy"},
		map[string]any{"messages": []any{map[string]any{"role": "robot", "content": "hi"}}, "expect": "z"},
	}})
	require.Equal(t, 422, st)
	msg := out["error"].(map[string]any)["message"].(string)
	for _, want := range []string{"prompt 1", "prompt 2", "prompt 3", "fuzzy", "robot"} {
		require.Contains(t, msg, want)
	}
	st, _ = e.doJSON("PUT", path, admin, map[string]any{"prompts": []any{}})
	require.Equal(t, 422, st)
	st, _ = e.doJSON("PUT", path, admin, map[string]any{"prompts": "nope"})
	require.Equal(t, 400, st)
	st, _ = e.doJSON("PUT", "/admin/v1/deployments/acme-agent/suites/vibes", admin, body)
	require.Equal(t, 404, st)
	st, _ = e.doJSON("PUT", "/admin/v1/deployments/"+strings.Repeat("x", 300)+"/suites/regression", admin, body)
	require.Equal(t, 400, st)

	st, out = e.doJSON("DELETE", path, admin, nil)
	require.Equal(t, 200, st)
	require.Equal(t, 2.0, out["deleted"])
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM eval_prompts WHERE deployment = 'acme-agent'`).Scan(&n))
	require.Zero(t, n)
}

func TestAdminSuiteWithTools(t *testing.T) {
	e := newEnv(t, envOpts{})
	admin := e.cfg.AdminKey
	path := "/admin/v1/deployments/acme-agent/suites/regression"
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "get_weather",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}}}
	expect := map[string]any{"name": "get_weather", "arguments": map[string]any{"city": "Lyon"}}
	messages := []any{
		map[string]any{"role": "user", "content": "Weather in Paris?"},
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "18C"},
		map[string]any{"role": "user", "content": "And Lyon?"},
	}
	body := map[string]any{"prompts": []any{map[string]any{"messages": messages, "tools": tools, "expect": expect, "match": "tool_call"}}}
	st, out := e.doJSON("PUT", path, admin, body)
	require.Equal(t, 200, st, out)

	st, out = e.doJSON("GET", path, admin, nil)
	require.Equal(t, 200, st)
	p := out["prompts"].([]any)[0].(map[string]any)
	require.Equal(t, tools, p["tools"])
	require.Equal(t, messages, p["messages"])
	require.Equal(t, expect, p["expect"], "a tool_call expectation comes back as the object it was given")
	require.Equal(t, "tool_call", p["match"])

	st, out = e.doJSON("PUT", path, admin, map[string]any{"prompts": []any{
		map[string]any{"prompt": "x", "tools": tools, "expect": map[string]any{"name": "get_time"}, "match": "tool_call"},
	}})
	require.Equal(t, 422, st)
	require.Contains(t, out["error"].(map[string]any)["message"], `prompt 1: expect of match "tool_call" names the tool "get_time"`)
}

func TestBacklogCountsEndedUnassembledSessions(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	st, out := e.doJSON("GET", "/v1/backlog", e.keyA, nil)
	require.Equal(t, 200, st)
	require.Equal(t, 0.0, out["sessions_awaiting_assembly"])
	for _, sid := range []string{"b1", "b2"} {
		st, _ := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("hi"), "X-Session-Id", sid, "X-Session-Done", "true")
		require.Equal(t, 200, st)
	}
	st, out = e.doJSON("GET", "/v1/backlog", e.keyA, nil)
	require.Equal(t, 200, st)
	require.Equal(t, 2.0, out["sessions_awaiting_assembly"], "no worker assembles them in this test")
	st, out = e.doJSON("GET", "/v1/backlog", e.keyB, nil)
	require.Equal(t, 200, st)
	require.Equal(t, 0.0, out["sessions_awaiting_assembly"], "another tenant's backlog is its own")
	_, err := e.pool.Exec(ctx, `UPDATE sessions SET assembled_at = now() WHERE id = 'b1'`)
	require.NoError(t, err)
	_, out = e.doJSON("GET", "/v1/backlog", e.keyA, nil)
	require.Equal(t, 1.0, out["sessions_awaiting_assembly"])
}
