package demo

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/trainer"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestGateDecisions(t *testing.T) {
	for _, tc := range []struct {
		candSucc, candSafe, servSucc, servSafe float64
		want                                   string
	}{
		{0.5, 1, 0.4, 1, DecisionPromote},
		{0.39, 1, 0.4, 1, DecisionPromote}, // within the 0.02 tolerance
		{0.3, 1, 0.4, 1, DecisionHold},
		{0.9, 0.96, 0.4, 1, DecisionHold},     // better at the task, a little worse at safety
		{0.9, 0.85, 0.4, 1, DecisionRollback}, // much worse at safety
		{0.9, 1, 0.4, 0.9, DecisionPromote},
	} {
		require.Equal(t, tc.want, decide(tc.candSucc, tc.candSafe, tc.servSucc, tc.servSafe, 0.02, 0.1), "%+v", tc)
	}
}

func TestBaseIsCachedAndDeterministic(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := BaseConfig{Steps: 3, BatchSize: 4}
	m1, cached, err := LoadOrBuildBase(ctx, dir, DefaultTask, cfg, 1, 20, quiet())
	require.NoError(t, err)
	require.False(t, cached)
	m2, cached, err := LoadOrBuildBase(ctx, dir, DefaultTask, cfg, 1, 20, quiet())
	require.NoError(t, err)
	require.True(t, cached)
	require.Equal(t, m1.W, m2.W)
	m3, err := BuildBase(ctx, DefaultTask, cfg, nil)
	require.NoError(t, err)
	require.Equal(t, m1.W, m3.W, "the same configuration builds the same base")

	// A different configuration is a different cache entry.
	_, cached, err = LoadOrBuildBase(ctx, dir, DefaultTask, BaseConfig{Steps: 4, BatchSize: 4}, 1, 20, quiet())
	require.NoError(t, err)
	require.False(t, cached)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2)

	_, err = BuildBase(ctx, DefaultTask, BaseConfig{Steps: -1}, nil)
	require.Error(t, err)
}

// TestRehearsalMechanics runs a few steps of a tiny configuration: versions
// move forward, every point has a decision, promotions reach the serving
// engine, and bad configurations are refused.
func TestRehearsalMechanics(t *testing.T) {
	ctx := context.Background()
	base := BaseConfig{Steps: 2, BatchSize: 4, Model: trainer.ModelConfig{Context: 48, Layers: 1, Heads: 2, DModel: 16}}
	m, err := trainer.NewModel(base.Model, 9)
	require.NoError(t, err)
	eng, err := trainer.NewEngine(m, -1, trainer.EngineConfig{Logger: quiet()})
	require.NoError(t, err)
	cfg := RehearsalConfig{Base: base, Groups: 3, GroupSize: 2, EvalEvery: 2, EvalPrompts: 10, GatePrompts: 10,
		SafetyPrompts: 4, MaxSteps: 5, Budget: time.Minute, Logger: quiet()}
	var seen []Point
	res, err := Rehearse(ctx, cfg, eng, func(p Point) { seen = append(seen, p) })
	require.NoError(t, err)
	require.Equal(t, 5, res.Steps)
	require.Equal(t, res.Points, seen)
	require.Len(t, res.Points, 4, "the base, steps 2 and 4, and the last step")
	require.Equal(t, []int{0, 2, 4, 5}, []int{res.Points[0].Step, res.Points[1].Step, res.Points[2].Step, res.Points[3].Step})
	require.Equal(t, res.Promoted+res.Held+res.RolledBack, 3)
	for i, p := range res.Points[1:] {
		require.NotEmpty(t, p.Decision)
		require.Greater(t, p.Candidate, res.Points[i].Candidate, "candidates move forward")
	}
	require.Equal(t, 5*3*2, res.Sampled, "every sampled task answer counted (no safety groups at Groups 3)")
	_, v := eng.Current()
	require.Equal(t, res.Last().Version, v, "the engine serves the version the gate let through")

	for name, bad := range map[string]RehearsalConfig{
		"group of one":  {GroupSize: 1},
		"safety groups": {Groups: 4, SafetyGroups: 4},
		"temperature":   {Temperature: -1},
		"tolerance":     {GateTolerance: 2},
		"prior":         {Base: BaseConfig{Prior: "psychic"}},
		"max ahead":     {MaxAhead: 2},
	} {
		_, err := Rehearse(ctx, bad, nil, nil)
		require.Error(t, err, name)
	}
}

// TestRehearsalAsTheOnlineLoop runs the rehearsal as the online loop runs:
// samples from the serving version, a line that goes back to it after
// MaxAhead held candidates, gates against the best promoted version.
func TestRehearsalAsTheOnlineLoop(t *testing.T) {
	ctx := context.Background()
	base := BaseConfig{Steps: 2, BatchSize: 4, Model: trainer.ModelConfig{Context: 48, Layers: 1, Heads: 2, DModel: 16}}
	cfg := RehearsalConfig{Base: base, Groups: 3, GroupSize: 2, EvalEvery: 1, EvalPrompts: 10, GatePrompts: 10,
		SafetyPrompts: 4, MaxSteps: 6, Budget: time.Minute, Logger: quiet(), FromServing: true, MaxAhead: 1, Anchor: true, Lag: 1}
	res, err := Rehearse(ctx, cfg, nil, nil)
	require.NoError(t, err)
	require.Equal(t, 6, res.Steps)
	require.Equal(t, 6, res.Promoted+res.Held+res.RolledBack)
	for i, p := range res.Points[1:] {
		prev := res.Points[i]
		require.Greater(t, p.Candidate, prev.Candidate, "candidates move forward, after a reset too")
		if p.Decision != DecisionPromote {
			require.Equal(t, prev.Version, p.Version, "only a promotion changes what serves")
		}
	}
}

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
		Rehearsal: RehearsalConfig{MaxSteps: learnSteps, Budget: 20 * time.Minute, EvalEvery: 10,
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
