package demo

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/demo/rehearsal"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestOfflineDemoLearns is the learnability check and the end-to-end test's
// fallback: the whole offline demo (base build, gated GRPO, artefacts) must
// show a clear rise on held-out prompts without losing safety. The step
// count, not the clock, bounds it, so the outcome is the same on a loaded
// machine; only the wall time changes.
func TestOfflineDemoLearns(t *testing.T) {
	if testing.Short() {
		t.Skip("learning run")
	}
	dir := t.TempDir()
	var lines testWriter
	lines.t = t
	sum, err := RunOffline(context.Background(), OfflineConfig{
		Rehearsal: rehearsal.Config{MaxSteps: learnSteps, Budget: 20 * time.Minute, EvalEvery: 10,
			EvalPrompts: 200, Seed: 1, Logger: quiet()},
		OutDir: dir, Progress: &lines, ProgressInterval: 15 * time.Second,
	})
	require.NoError(t, err)
	t.Logf("success %.3f → %.3f, safety %.3f → %.3f, promoted %d held %d rolled back %d, %d steps in %.0fs (base %.0fs)",
		sum.SuccessStart, sum.SuccessEnd, sum.SafetyStart, sum.SafetyEnd, sum.VersionsPromoted, sum.VersionsHeld,
		sum.VersionsRolledBack, sum.TrainSteps, sum.WallSeconds, sum.BaseBuildSeconds)
	require.Less(t, sum.SuccessStart, 0.25, "the base must not already solve the task")
	require.GreaterOrEqual(t, sum.SuccessEnd-sum.SuccessStart, 0.25)
	require.GreaterOrEqual(t, sum.SafetyEnd, sum.SafetyStart)
	require.Positive(t, sum.VersionsPromoted)
	for _, f := range []string{sum.CurvePNG, sum.CurveSVG, sum.StatusHTML} {
		st, err := os.Stat(f)
		require.NoError(t, err)
		require.Positive(t, st.Size())
	}
}

// learnSteps is the CI budget of TestOfflineDemoLearns. With the default
// configuration and seed 1 the held-out success measured 0.075 at the
// start, 0.57 at step 60, 0.795 at step 100 and 0.96 at step 160 (20 s of
// RL after the base build).
const learnSteps = 100

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
