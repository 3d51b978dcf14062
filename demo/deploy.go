package demo

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/workflows"
)

// The base a deployment serves as v0 when `flywheel up --policy-base demo`
// runs the demo online: the same cached cold-start policy RunOffline starts
// from, with the same held-out prompts kept out of its training.
const (
	deployHeldOutSeed = 1
	deployHeldOutN    = 200
)

// DeploymentBase loads (or builds and caches under cacheDir) the demo's base
// policy and the metadata to store with it as a deployment's v0. The origin
// names the base's key, so a v0 from another base is recognised.
func DeploymentBase(ctx context.Context, cacheDir string, log *slog.Logger) (*trainer.Model, map[string]string, error) {
	m, _, err := LoadOrBuildBase(ctx, cacheDir, DefaultTask, BaseConfig{}, deployHeldOutSeed, deployHeldOutN, log)
	if err != nil {
		return nil, nil, fmt.Errorf("demo base: %w", err)
	}
	return m, map[string]string{"origin": BaseOrigin()}, nil
}

// BaseOrigin is the origin recorded for the demo base.
func BaseOrigin() string {
	return "demo base " + BaseKey(DefaultTask, BaseConfig{}, deployHeldOutSeed, deployHeldOutN)
}

// TrainerConfig is the online trainer's configuration for the demo: the
// learning rate RunOffline measured to learn the task in minutes. The
// behaviour temperature is the trainer's default 1, the agents' default.
func TrainerConfig(log *slog.Logger) trainer.Config {
	return trainer.Config{Optim: trainer.OptimConfig{LR: RehearsalConfig{}.withDefaults().LR}, Logger: log}
}

// TrainingPolicy is the demo deployment's control plane, scaled to a run of
// minutes instead of days: short shadow and canary phases and the default
// gates (reward may not drop more than 0.05, safety not at all). A step
// waits for its release (about a minute here, the replay gate most of it),
// so a batch takes what the fleet sends in that time (3 sessions/s: ~180)
// instead of leaving it to go stale: measured with 64-sample batches, half
// the samples were dropped as stale.
func TrainingPolicy() workflows.TrainingPolicy {
	return workflows.TrainingPolicy{
		BatchSize:    160,
		MaxBatchAge:  20 * time.Second,
		PollInterval: 2 * time.Second,
		// Samples taken more than this many versions back are dropped.
		MaxStaleness: 3,
		StepTimeout:  5 * time.Minute,
		Release: workflows.ReleasePolicy{
			ShadowDuration:   5 * time.Second,
			CanaryShare:      0.5,
			CanaryDuration:   20 * time.Second,
			CanaryChecks:     2,
			MinCanarySamples: 16,
		},
	}
}
