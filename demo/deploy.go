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
	// deployGateN held-out prompts after those are the deployment's
	// regression suite: what its release gates and watchdog measure, kept
	// apart from the prompts the demo reports success on, so the reported
	// curve is not the one the gates selected versions by. Consecutive
	// versions disagree on 15-25% of the prompts: the paired standard
	// error is about 0.022 with 400, 0.015 with 800 and 0.010 with 2000.
	// 2000 made the gate more precise but the demo learnt far less (13% →
	// 37.5% in 10 minutes against 13% → 87% with 800, one run each, same
	// commit otherwise; the base is rebuilt with the suite's size, see
	// BaseKey), so it stays 800 until the cause is known (docs/gates.md).
	deployGateN = 800
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

// EvalHeldOut is the first n (at most 200) held-out prompts the online
// demo reports success on: never trained on, never seen by the gates.
func EvalHeldOut(n int) ([]Prompt, error) {
	if n <= 0 || n > deployHeldOutN {
		return nil, fmt.Errorf("eval prompts %d: want 1..%d", n, deployHeldOutN)
	}
	return HeldOut(DefaultTask, deployHeldOutSeed, n)
}

// EvalSafety is the n safety prompts the online demo reports its safety
// figure on: apart from the gates' own, GateSafetyPrompts.
func EvalSafety(n int) []Prompt { return SafetySuite(evalSafetySeed, n) }

const evalSafetySeed = 9

// GateHeldOut is the demo deployment's regression suite: held-out prompts
// answered greedily and judged by exact match. The base was built without
// them and the agents never ask them.
func GateHeldOut() ([]Prompt, error) {
	all, err := HeldOut(DefaultTask, deployHeldOutSeed, deployHeldOutN+deployGateN)
	if err != nil {
		return nil, err
	}
	return all[deployHeldOutN:], nil
}

// GateSafetyPrompts is the demo deployment's safety suite for the release
// gate and the watchdog: fixed prompts (their own seed, so the fleet's
// fresh safety prompts practically never repeat them) whose only right
// answer is the refusal, judged exactly as the demo's evaluation judges
// them. 64 of them: with 16 the gate kept its own prompts refused while
// the evaluation's fell from 100% to 87.5% in one 10-minute run.
func GateSafetyPrompts() []Prompt { return SafetySuite(0x6a7e, 64) }

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
		// Twelve GRPO groups of eight a step. Per sample, steps of 32
		// learned about as fast in the rehearsal (0.53 after 6,400
		// samples), but twice the steps is twice the releases and twice
		// the staleness counted in steps. The trainer waits for releases
		// (at most η steps ahead of serving), so a step takes what came
		// meanwhile: with 64 a step, 41% of the samples went stale unused.
		BatchSize:   96,
		MaxBatchAge: 5 * time.Second,
		// A group's 8 sessions come one after another from one agent and
		// are assembled apart; trained before the last arrive, 64 samples
		// made 10-28 partial groups (one run: 28 groups of 2.3 on average).
		GroupWait:    15 * time.Second,
		PollInterval: 500 * time.Millisecond,
		// Samples taken more than this many steps back are dropped. With
		// the rehearsal's trainer (Dr. GRPO, two
		// updates a batch) sampling 8 steps behind learns nearly as fast as
		// 4 (0.64 vs 0.70 at step 160), and η = 4 online dropped a third
		// of the samples as stale while releases trailed the trainer.
		MaxStaleness: 16,
		// The trainer leads serving by at most half of η, so samples of the
		// last few serving versions still train (the loss corrects for the
		// policy they came from). With η = 8 and the trainer up to 8 ahead,
		// the claim could take only the serving version's own samples:
		// on a machine where a sample took 2.9 s from its call to the queue
		// (p90 5.3 s), runs dropped 26-34% of their samples as stale.
		MaxAhead:    8,
		StepTimeout: 5 * time.Minute,
		Release: workflows.ReleasePolicy{
			// A release every few seconds: the replay and safety gates
			// judge every candidate on fixed prompts, so the live canary
			// only has to catch a clear loss on real traffic.
			ShadowDuration:   time.Second,
			CanaryShare:      0.5,
			CanaryDuration:   4 * time.Second,
			CanaryChecks:     1,
			MinCanarySamples: 12,
			// A phase with too little traffic for a verdict (the fleet
			// slowed for a backlog) waits this much longer, then fails.
			MaxTrafficWait: 20 * time.Second,
		},
	}
}
