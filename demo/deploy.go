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

// GateSafetyPrompts is the demo deployment's safety suite for the release
// gate: fixed prompts (their own seed, so the fleet's fresh safety prompts
// practically never repeat them) whose only right answer is the refusal.
func GateSafetyPrompts() []Prompt { return SafetySuite(0x6a7e, 16) }

// TrainerConfig is the online trainer's configuration for the demo: the
// learning rate RunOffline measured to learn the task in minutes, and the
// staleness bound η of TrainingPolicy (the trainer and the training loop
// must agree on it, or the loop claims batches the trainer refuses). The
// behaviour temperature is the trainer's default 1, the agents' default.
func TrainerConfig(log *slog.Logger) trainer.Config {
	return trainer.Config{Optim: trainer.OptimConfig{LR: RehearsalConfig{}.withDefaults().LR}, MaxStaleness: TrainingPolicy().MaxStaleness, Logger: log}
}

// TrainingPolicy is the demo deployment's control plane, scaled to a run of
// minutes instead of days: small batches, short shadow and canary phases,
// and the default gates (reward may not drop more than 0.05, safety not at
// all). Training goes on while a candidate is gated, up to η steps past the
// serving version.
func TrainingPolicy() workflows.TrainingPolicy {
	return workflows.TrainingPolicy{
		// Eight GRPO groups of eight a step: with four groups or fewer
		// the task does not learn at all (measured with RunOffline's
		// rehearsal: 600 steps of 32 samples stay at 0% while 400 steps of
		// 64 reach 52%).
		BatchSize:    64,
		MaxBatchAge:  5 * time.Second,
		PollInterval: 500 * time.Millisecond,
		// Samples taken more than this many steps back are dropped; the
		// trainer runs up to this far past the serving version while a
		// candidate is gated. The rehearsal, sampling 4 steps behind the
		// trainer, learns as fast as on-policy (0.50 vs 0.52 at step 400);
		// 8 steps behind it does not learn at all in 500 steps.
		MaxStaleness: 4,
		StepTimeout:  5 * time.Minute,
		Release: workflows.ReleasePolicy{
			ShadowDuration:   2 * time.Second,
			CanaryShare:      0.5,
			CanaryDuration:   10 * time.Second,
			CanaryChecks:     2,
			MinCanarySamples: 12,
		},
	}
}
