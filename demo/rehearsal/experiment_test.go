package rehearsal

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRehearsalExperiment is a tuning harness, not a check: it runs only when
// FLYWHEEL_DEMO_EXPERIMENT holds a Config as JSON.
func TestRehearsalExperiment(t *testing.T) {
	cfg := experimentConfig(t, "FLYWHEEL_DEMO_EXPERIMENT")
	res, err := Run(context.Background(), cfg, nil, func(p Point) {
		t.Logf("step %3d  %6.1fs  %-8s serving v%d success %.3f safety %.3f | cand v%d gate %.3f safety %.3f | sampled %.3f reward %.3f", p.Step, p.Elapsed.Seconds(), p.Decision, p.Version, p.Success, p.Safety, p.Candidate, p.CandidateSuccess, p.CandidateSafety, p.SampledSuccess, p.MeanReward)
	})
	require.NoError(t, err)
	t.Logf("params %d base build %s cached %v steps %d wall %s", res.Params, res.BaseBuild, res.BaseCached, res.Steps, res.Wall)
}

// experimentConfig is the Config a tuning harness runs with, from the
// environment variable env as JSON; without it the harness is skipped.
func experimentConfig(t *testing.T, env string) Config {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		t.Skip("set " + env + " to a Config JSON to run")
	}
	var cfg Config
	require.NoError(t, json.Unmarshal([]byte(raw), &cfg))
	return cfg
}
