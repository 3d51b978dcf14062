package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/examples/internal/gatewaytest"
)

// TestRun runs the example against a real gateway: the tool is used and
// answered, and both calls are captured in the session the base URL's
// /s/{session}/ prefix names.
func TestRun(t *testing.T) {
	g := gatewaytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	res, err := run(ctx, options{URL: g.URL, APIKey: g.Key, Model: gatewaytest.Model, Session: "anthropic-test", Out: &out})
	require.NoError(t, err, out.String())
	require.Equal(t, []string{`weather({"query":"Oslo"})`}, res.ToolCalls)
	require.Equal(t, "echo: Oslo: 4°C, light rain", res.Answer, "the tool's result reached the model")
	require.Equal(t, 2, g.Steps(t, "anthropic-test"), "both calls are in the session the path named")
}
