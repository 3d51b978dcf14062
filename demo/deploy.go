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
// rehearsal's (learning rate, advantage, updates per batch), a learning
// rate scaled down for batches shorter than TrainingPolicy's, and the
// staleness bound η of TrainingPolicy (the trainer and the training loop
// must agree on it, or the loop claims batches the trainer refuses). The
// behaviour temperature is the trainer's default 1, the agents' default.
func TrainerConfig(log *slog.Logger) trainer.Config {
	r := RehearsalConfig{}.withDefaults()
	c := r.Trainer
	p := TrainingPolicy()
	c.Optim.LR, c.MaxStaleness, c.NominalBatch, c.Logger = r.LR, p.MaxStaleness, p.BatchSize, log
	return c
}

// TrainingPolicy is the demo deployment's control plane, scaled to a run of
// minutes instead of days: small batches, short shadow and canary phases,
// and the default gates (reward may not drop more than 0.05, safety not at
// all). Training goes on while a candidate is gated, up to η steps past the
// serving version.
func TrainingPolicy() workflows.TrainingPolicy {
	return workflows.TrainingPolicy{
		// Eight GRPO groups of eight a step. Per sample, steps of 32
		// learned about as fast in the rehearsal (0.53 after 6,400
		// samples), but twice the steps is twice the releases and twice
		// the staleness counted in steps.
		BatchSize:    64,
		MaxBatchAge:  5 * time.Second,
		PollInterval: 500 * time.Millisecond,
		// Samples taken more than this many steps back are dropped; the
		// trainer runs up to this far past the serving version while a
		// candidate is gated. With the rehearsal's trainer (Dr. GRPO, two
		// updates a batch) sampling 8 steps behind learns nearly as fast as
		// 4 (0.64 vs 0.70 at step 160), and η = 4 online dropped a third
		// of the samples as stale while releases trailed the trainer.
		MaxStaleness: 8,
		StepTimeout:  5 * time.Minute,
		Release: workflows.ReleasePolicy{
			// A release every few seconds: the replay and safety gates
			// judge every candidate on fixed prompts, so the live canary
			// only has to catch a clear loss on real traffic.
			ShadowDuration:   time.Second,
			CanaryShare:      0.5,
			CanaryDuration:   4 * time.Second,
			CanaryChecks:     1,
			MinCanarySamples: 12,
		},
	}
}
