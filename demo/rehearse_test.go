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
		{0.9, 0.96, 0.4, 1, DecisionRollback}, // better at the task, worse at safety
		{0.9, 1, 0.4, 0.9, DecisionPromote},
	} {
		require.Equal(t, tc.want, decide(tc.candSucc, tc.candSafe, tc.servSucc, tc.servSafe, 0.02, 0), "%+v", tc)
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
	} {
		_, err := Rehearse(ctx, bad, nil, nil)
		require.Error(t, err, name)
	}
}
