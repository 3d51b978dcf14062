package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/demo"
	"github.com/flywheel-ai/flywheel/internal/testenv"
)

// TestOnlineDemoEndToEnd runs `flywheel up --policy-base demo` in process on
// a real Postgres and Temporal dev server, and the demo fleet against its
// gateway until the agents' held-out success has clearly risen: sessions
// become samples, the training loop trains and the release gates promote
// versions with no human action, safety holds, the evaluator's opted-out
// sessions never train, and the status page serves the deployment.
//
// The budget is learning, not minutes: the run stops once a mid-run greedy
// evaluation is 25 points above the first (about 6 minutes on an idle
// 2-core machine), and fails if 15 minutes were not enough for the last
// evaluation to be 15 points up.
func TestOnlineDemoEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run of the online loop")
	}
	dbURL := testenv.DatabaseURL(t, true)
	_, temporalAddr := testenv.TemporalServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	dataDir := t.TempDir()
	const model = "demo-e2e"

	ctx, cancel := context.WithCancel(context.Background())
	upDone := make(chan error, 1)
	go func() {
		upDone <- runUp(ctx, []string{"--policy-base", "demo", "--database-url", dbURL, "--temporal-address", temporalAddr,
			"--gateway-listen", addr, "--data-dir", dataDir, "--gateway-policy-model", model, "--log-level", "warn"})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-upDone:
			if err != nil && ctx.Err() == nil {
				t.Errorf("flywheel up: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("flywheel up did not stop within a minute")
		}
	})
	base := "http://" + addr
	key := waitUp(t, upDone, base, filepath.Join(dataDir, "dev-api-key"))

	sum, err := demo.RunOnline(ctx, demo.OnlineConfig{
		Fleet: demo.FleetConfig{BaseURL: base, APIKey: key, Model: model, Agents: 8, GroupSize: 8,
			SessionsPerSecond: 25, Logger: slog.New(slog.DiscardHandler)},
		Duration: 15 * time.Minute, OutDir: t.TempDir(), EvalPrompts: 100, EvalEvery: 30 * time.Second, StopAtRise: 0.25,
	})
	require.NoError(t, err)
	t.Logf("success %.3f → %.3f (agents' own %.3f) in %.1f min, safety %.3f → %.3f, promoted %d, rolled back %d, serving %s, %d answers",
		sum.SuccessStart, sum.SuccessEnd, sum.LiveSuccessEnd, sum.Minutes, sum.SafetyStart, sum.SafetyEnd,
		sum.VersionsPromoted, sum.VersionsRolledBack, sum.ServingVersion, sum.SampledAnswers)
	require.GreaterOrEqual(t, sum.SuccessEnd-sum.SuccessStart, 0.15, "held-out success must clearly rise")
	require.Positive(t, sum.VersionsPromoted, "the control plane released a trained version on its own")
	require.NotEqual(t, model+"@v0", sum.ServingVersion)
	require.GreaterOrEqual(t, sum.SafetyEnd, sum.SafetyStart-0.1, "safety must not drop")
	require.Positive(t, sum.SampledAnswers)

	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var trained, evaluatorSteps, evaluatorSamples int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM training_runs WHERE deployment = $1 AND status = 'trained'`, model).Scan(&trained))
	require.NoError(t, pool.QueryRow(context.Background(), `
SELECT count(DISTINCT st.id), count(ts.id) FROM atdp_steps st JOIN sessions s ON s.id = st.session_id
LEFT JOIN training_samples ts ON ts.step_id = st.id
WHERE s.end_user = $1`, demo.EvaluatorUser).Scan(&evaluatorSteps, &evaluatorSamples))
	t.Logf("%d train steps; the evaluator's %d recorded steps queued %d samples", trained, evaluatorSteps, evaluatorSamples)
	require.Greater(t, trained, 5)
	require.Positive(t, evaluatorSteps, "the evaluator's sessions are recorded")
	require.Zero(t, evaluatorSamples, "the evaluator opted out: its prompts never train")

	resp, err := http.Get(base + "/status?deployment=" + model)
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(page), sum.ServingVersion)
}

// waitUp waits for the gateway's /readyz and the development key.
func waitUp(t *testing.T, upDone <-chan error, base, keyFile string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Minute) // the demo base is built on first use
	for time.Now().Before(deadline) {
		select {
		case err := <-upDone:
			t.Fatalf("flywheel up exited: %v", err)
		default:
		}
		key, kerr := os.ReadFile(keyFile)
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && kerr == nil && len(key) > 0 {
				return strings.TrimSpace(string(key))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal(fmt.Sprintf("flywheel up not ready at %s", base))
	return ""
}
