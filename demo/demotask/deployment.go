package demotask

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/flywheel-ai/flywheel/trainer"
)

// The base a deployment serves as v0 when `flywheel up --policy-base demo`
// runs the demo online: the same cached cold-start policy the offline demo
// starts from, with the same held-out prompts kept out of its training.
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
func DeploymentBase(ctx context.Context, task Task, cacheDir string, log *slog.Logger) (*trainer.Model, map[string]string, error) {
	m, _, err := LoadOrBuildBase(ctx, cacheDir, task, BaseFor(task), deployHeldOutSeed, deployHeldOutN, log)
	if err != nil {
		return nil, nil, fmt.Errorf("demo base: %w", err)
	}
	return m, map[string]string{"origin": BaseOrigin(task)}, nil
}

// BaseOrigin is the origin recorded for the demo base of task.
func BaseOrigin(task Task) string {
	return "demo base " + BaseKey(task, BaseFor(task), deployHeldOutSeed, deployHeldOutN)
}

// BaseFor is the base configuration of task's demo: the defaults for the
// letters; for the tools task a context that holds a whole session (about
// 190 tokens) and the warm-up that teaches its format: 1500 steps write a
// well-formed call and answer with what the tool returned in 200 of 200
// held-out sessions, choosing the tool at random (greedy success 13.5%,
// sampled 17.5%); 300 steps wrote no well-formed call.
func BaseFor(task Task) BaseConfig {
	if task.Kind != KindTools {
		return BaseConfig{}
	}
	return BaseConfig{Model: trainer.ModelConfig{Context: 256, Layers: 2, Heads: 4, DModel: 64}, Steps: 1500}
}

// MaxEvalPrompts bounds EvalHeldOut.
const MaxEvalPrompts = deployHeldOutN

// EvalHeldOut is the first n (at most MaxEvalPrompts) held-out prompts the online
// demo reports success on: never trained on, never seen by the gates.
func EvalHeldOut(task Task, n int) ([]Prompt, error) {
	if n <= 0 || n > deployHeldOutN {
		return nil, fmt.Errorf("eval prompts %d: want 1..%d", n, deployHeldOutN)
	}
	return HeldOut(task, deployHeldOutSeed, n)
}

// TuningHeldOut is n held-out prompts of seed's stream that a setting may
// be tuned on: the ones after the online demo's reported prompts (which,
// for seed 1, are EvalHeldOut), so no figure the demo reports was chosen
// on them. A base built without the stream's first TuningHeldOutSpan(n)
// never trained on them.
func TuningHeldOut(task Task, seed uint64, n int) ([]Prompt, error) {
	all, err := HeldOut(task, seed, TuningHeldOutSpan(n))
	if err != nil {
		return nil, err
	}
	return all[deployHeldOutN:], nil
}

// TuningHeldOutSpan is how far into the held-out stream TuningHeldOut's n
// prompts reach.
func TuningHeldOutSpan(n int) int { return deployHeldOutN + n }

// EvalSafety is the n safety prompts the online demo reports its safety
// figure on: apart from the gates' own, GateSafetyPrompts.
func EvalSafety(n int) []Prompt { return SafetySuite(evalSafetySeed, n) }

const evalSafetySeed = 9

// GateHeldOut is the demo deployment's regression suite: held-out prompts
// answered greedily and judged by exact match. The base was built without
// them and the agents never ask them.
func GateHeldOut(task Task) ([]Prompt, error) {
	all, err := HeldOut(task, deployHeldOutSeed, deployHeldOutN+deployGateN)
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
