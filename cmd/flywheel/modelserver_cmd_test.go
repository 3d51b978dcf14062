package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/upstream"
)

// TestModelServerCommand: `flywheel model-server` seeds the policy's v0,
// records itself as the policy deployment's engine (a vllm_lora upstream
// at its URL), loads the routed version through weight sync, and answers
// the gateway's production client under that version's name with token
// ids and logprobs. Restarted, it serves what it held.
func TestModelServerCommand(t *testing.T) {
	dbURL := testenv.DatabaseURL(t, true)
	dataDir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	const name = "ms-policy"
	start := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- runModelServer(ctx, []string{"--database-url", dbURL, "--data-dir", dataDir, "--model-server-listen", addr,
				"--gateway-policy-model", name, "--log-level", "warn"})
		}()
		var exited error
		require.Eventually(t, func() bool {
			select {
			case err := <-done:
				exited = fmt.Errorf("flywheel model-server exited: %v", err)
				return true
			default:
			}
			resp, err := http.Get("http://" + addr + "/v1/models")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"`+name+`@v0"`)
		}, time.Minute, 100*time.Millisecond, "the model server holds the serving version")
		require.NoError(t, exited)
		return func() {
			cancel()
			require.NoError(t, <-done)
		}
	}

	stop := start()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d, err := store.GetDeployment(ctx, pool, name)
	require.NoError(t, err)
	require.Equal(t, deployment.BackendUpstream, d.Backend)
	require.Equal(t, name+"@v0", d.ServingVersion)
	s, err := deployment.Parse(d.Config)
	require.NoError(t, err)
	require.Equal(t, "http://"+addr+"/v1", s.BaseURL)
	require.True(t, s.VersionsByName(), "each version answers under its own name")

	ask := func() {
		t.Helper()
		b, err := upstream.ForDeployment(s, name, time.Minute, 0)
		require.NoError(t, err)
		resp, err := b.Complete(ctx, &inference.Request{Model: name, Version: d.ServingVersion, MaxTokens: 6,
			Messages: []inference.Message{{Role: inference.RoleUser, Content: "reverse: a b c"}}})
		require.NoError(t, err)
		require.Equal(t, name+"@v0", resp.ModelVersion)
		require.NotEmpty(t, resp.PromptTokenIDs)
		require.NotEmpty(t, resp.CompletionTokenIDs)
		require.Len(t, resp.Logprobs, len(resp.CompletionTokenIDs))
	}
	ask()
	stop()

	stop = start()
	ask()
	stop()
}
