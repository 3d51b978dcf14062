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
// answered through previous_response_id, the chain is one captured session,
// and the reward is recorded in it.
func TestRun(t *testing.T) {
	g := gatewaytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	res, err := run(ctx, options{BaseURL: g.URL + "/v1", APIKey: g.Key, Model: gatewaytest.Model, Out: &out})
	require.NoError(t, err, out.String())
	require.Equal(t, []string{`lookup({"query":"How do I chain responses?"})`}, res.ToolCalls)
	require.Contains(t, res.Answer, "previous_response_id", "the tool's output reached the model")
	require.Len(t, res.ResponseIDs, 2)
	require.NotEmpty(t, res.Session)
	require.Equal(t, 2, g.Steps(t, res.Session), "the chain is one session")
	require.Equal(t, 1, g.Rewards(t, res.Session))
	require.Contains(t, out.String(), "assistant: echo: ")
}
