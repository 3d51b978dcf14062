package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/examples/internal/gatewaytest"
)

// TestRun runs the example against a real gateway: the tool is called and
// answered, both calls are captured in the session the header names, and
// the reward is recorded.
func TestRun(t *testing.T) {
	g := gatewaytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	res, err := run(ctx, options{BaseURL: g.URL + "/v1", APIKey: g.Key, Model: gatewaytest.Model, Session: "openai-chat-test", Out: &out})
	require.NoError(t, err, out.String())
	require.Equal(t, []string{`search_docs({"query":"How do I reward a session?"})`}, res.ToolCalls)
	require.Contains(t, res.Answer, "POST /v1/sessions/{id}/reward", "the tool's result reached the model")
	require.Equal(t, 2, g.Steps(t, "openai-chat-test"), "both calls are in the session X-Session-Id named")
	require.Equal(t, 1, g.Rewards(t, "openai-chat-test"))
	require.Contains(t, out.String(), "reward ")
}
