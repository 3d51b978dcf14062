package rehearsal

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/trainer"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestGateDecisions checks the gate's rule: a safety regression beyond
// the tolerance rolls back, any smaller safety drop or a success drop
// beyond its tolerance holds, else the candidate is promoted.
func TestGateDecisions(t *testing.T) {
	// refused is a safety suite of 20 prompts of which k were refused.
	refused := func(k int) []float64 {
		s := make([]float64, 20)
		for i := range k {
			s[i] = 1
		}
		return s
	}
	for _, tc := range []struct {
		candSucc float64
		candSafe int
		servSucc float64
		servSafe int
		want     string
	}{
		{0.5, 20, 0.4, 20, DecisionPromote},
		{0.39, 20, 0.4, 20, DecisionPromote}, // within the 0.02 tolerance
		{0.3, 20, 0.4, 20, DecisionHold},
		{0.9, 19, 0.4, 20, DecisionHold},     // better at the task, a little worse at safety
		{0.9, 17, 0.4, 20, DecisionRollback}, // much worse at safety
		{0.9, 20, 0.4, 18, DecisionPromote},
	} {
		cand, serv := scores{gate: tc.candSucc, safety: refused(tc.candSafe)}, scores{gate: tc.servSucc, safety: refused(tc.servSafe)}
		require.Equal(t, tc.want, decide(cand, serv, tc.servSucc, 0.02, 0.1), "%+v", tc)
	}
}

// TestRehearsalMechanics runs a few steps of a tiny configuration: versions
// move forward, every point has a decision, promotions reach the serving
// engine, and bad configurations are refused.
func TestRehearsalMechanics(t *testing.T) {
	ctx := context.Background()
	base := demotask.BaseConfig{Steps: 2, BatchSize: 4, Model: trainer.ModelConfig{Context: 48, Layers: 1, Heads: 2, DModel: 16}}
	m, err := trainer.NewModel(base.Model, 9)
	require.NoError(t, err)
	eng, err := trainer.NewEngine(m, -1, trainer.EngineConfig{Logger: quiet()})
	require.NoError(t, err)
	cfg := Config{Base: base, Groups: 3, GroupSize: 2, EvalEvery: 2, EvalPrompts: 10, GatePrompts: 10,
		SafetyPrompts: 4, MaxSteps: 5, Budget: time.Minute, Logger: quiet()}
	var seen []Point
	res, err := Run(ctx, cfg, eng, func(p Point) { seen = append(seen, p) })
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

	for name, bad := range map[string]Config{
		"group of one":  {GroupSize: 1},
		"safety groups": {Groups: 4, SafetyGroups: 4},
		"temperature":   {Temperature: -1},
		"tolerance":     {GateTolerance: 2},
		"prior":         {Base: demotask.BaseConfig{Prior: "psychic"}},
		"max ahead":     {MaxAhead: 2},
		"lora rank":     {LoRARank: maxLoRARank + 1},
	} {
		_, err := Run(ctx, bad, nil, nil)
		require.Error(t, err, name)
	}
}

// TestRehearsalAsTheOnlineLoop runs the rehearsal as the online loop runs:
// samples from the serving version, a line that goes back to it after
// MaxAhead held candidates, gates against the best promoted version.
func TestRehearsalAsTheOnlineLoop(t *testing.T) {
	ctx := context.Background()
	base := demotask.BaseConfig{Steps: 2, BatchSize: 4, Model: trainer.ModelConfig{Context: 48, Layers: 1, Heads: 2, DModel: 16}}
	cfg := Config{Base: base, Groups: 3, GroupSize: 2, EvalEvery: 1, EvalPrompts: 10, GatePrompts: 10,
		SafetyPrompts: 4, MaxSteps: 6, Budget: time.Minute, Logger: quiet(), FromServing: true, MaxAhead: 1, Anchor: true, Lag: 1}
	res, err := Run(ctx, cfg, nil, nil)
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

// TestReleaseGateJudgesAsTheRelease checks ReleaseGate's rule on a gate
// set of 400 prompts: the same score as the anchor on the same prompts
// passes, on a third of them swapped is not shown within the budget (held),
// well below the serving version is a regression (rolled back), and the
// looks at one anchor are counted.
func TestReleaseGateJudgesAsTheRelease(t *testing.T) {
	// right is 400 results of which the n from lo on are 1.
	right := func(lo, n int) []float64 {
		s := make([]float64, 400)
		for i := lo; i < lo+n; i++ {
			s[i] = 1
		}
		return s
	}
	safe := []float64{1, 1, 1, 1}
	anchor := scores{gate: 0.5, gateEach: right(0, 200), safety: safe}
	r := &run{servingScores: anchor, anchorScores: anchor}
	for _, tc := range []struct {
		cand []float64
		want string
	}{
		{right(0, 200), DecisionPromote},
		{right(130, 200), DecisionHold}, // the same score, 130 prompts swapped each way
		{right(0, 150), DecisionRollback},
	} {
		require.Equal(t, tc.want, r.judgeAsReleased(scores{gateEach: tc.cand, safety: safe}))
	}
	require.Equal(t, 3, r.looks)
	require.Equal(t, 1, r.passes)
}
