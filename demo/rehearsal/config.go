package rehearsal

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/trainer"
)

// Config configures the in-process learning loop: sample a group of
// completions per fresh prompt, score them with the verifier, train one
// GRPO step, publish the new version, and every few steps measure greedy
// success on held-out prompts and on the safety suite.
type Config struct {
	Task demotask.Task       `json:"task"`
	Base demotask.BaseConfig `json:"base"`
	// GroupSize is the number of completions per prompt. Default 8.
	GroupSize int `json:"group_size"`
	// Groups is the number of prompts per step. Default 16.
	Groups int `json:"groups"`
	// SafetyGroups of every step's Groups are safety prompts, rewarded for
	// the refusal, so learning the task does not erode it. Default Groups/8;
	// negative means none.
	SafetyGroups int `json:"safety_groups"`
	// Temperature for sampling. Default 1. The trainer takes log π at
	// temperature 1 (the Tinker API has none), so another temperature
	// skews the behaviour weight π_prox/μ.
	Temperature float64 `json:"temperature"`
	// LR is the RL learning rate. Default 5e-4: sampling 4 steps behind the
	// trainer (as online), 1e-3 learned on one seed of two and 2e-3 or more
	// not at all.
	LR float64 `json:"lr"`
	// EvalEvery is the number of steps between evaluations. Default 5.
	EvalEvery int `json:"eval_every"`
	// EvalPrompts is the size of the held-out set, the tuning set of
	// demotask.TuningHeldOut (never the prompts the online demo reports).
	// Default 200.
	EvalPrompts int `json:"eval_prompts"`
	// SafetyPrompts is the size of the safety suite. Default 32.
	SafetyPrompts int `json:"safety_prompts"`
	// GatePrompts is the size of the gate's own held-out set (kept apart
	// from the reported one so the reported curve is not selection-biased).
	// Default 100.
	GatePrompts int `json:"gate_prompts"`
	// GateTolerance is how far below the serving version a candidate's gate
	// success may be and still be promoted. Default 0.02.
	GateTolerance float64 `json:"gate_tolerance"`
	// SafetyTolerance is how far below the serving version a candidate's
	// safety may be before it is rolled back (training restarts from the
	// serving weights). A smaller drop only holds the candidate back: a
	// version with lower safety is never released. Default 0.1.
	SafetyTolerance float64 `json:"safety_tolerance"`
	// Budget bounds the wall time of the RL loop (the base build is not in
	// it). Default 6 minutes.
	Budget time.Duration `json:"budget"`
	// MaxSteps bounds the number of RL steps; 0 means only Budget does.
	MaxSteps int `json:"max_steps"`
	// Seed makes the run reproducible up to timing. Default 1.
	Seed uint64 `json:"seed"`
	// CacheDir keeps the base policy between runs; "" rebuilds it.
	CacheDir string `json:"cache_dir"`
	// RLSeed varies the RL loop's prompts and sampling without changing
	// the base or the held-out sets. Default 0.
	RLSeed uint64 `json:"rl_seed"`
	// Lag samples each step with the weights from that many steps before,
	// as an online loop whose releases trail the trainer does. Default 0.
	Lag int `json:"lag"`
	// FromServing samples each step from the serving version, as the
	// online loop does (its traffic is what serves), instead of from the
	// trainer's own line (Lag steps back). With MaxAhead, a line held
	// that many steps past the serving version goes back to it, as the
	// online loop's does when nothing is left to release.
	FromServing bool `json:"from_serving"`
	MaxAhead    int  `json:"max_ahead"`
	// Anchor judges a candidate's gate success against the best promoted
	// version's (the online regression gate's anchor) instead of the
	// serving version's.
	Anchor bool `json:"anchor"`
	// ReleaseGate judges the gate set as the release's regression gate
	// does (evolution.JudgeRegression): prompt by prompt against the
	// serving version and the anchor (the best promoted version, whatever
	// Anchor says), the anchor's looks at error rates set by LOND, the
	// release policy's default budget, allowed drop and alpha. A
	// regression rolls the line back; a candidate not shown within the
	// budget is held. Without it the rule is a point one: promoted when at
	// most GateTolerance below (see decide).
	ReleaseGate bool `json:"release_gate"`
	// Trainer configures the RL trainer; LR comes from LR when
	// Trainer.Optim.LR is 0. Defaults: the Dr. GRPO advantage (r − group
	// mean, no division by the group's std: with partial credit a group of
	// near-equal rewards otherwise gets full-size advantages from noise,
	// and held-out success fell from 0.09 to 0.00 for 100 steps), and two
	// optimizer updates per batch (0.70 vs 0.59 at step 160, 4 steps
	// behind). A group whose answers all earned the top reward gets the
	// advantage perfectAdvantage (negative: none).
	Trainer trainer.Config `json:"trainer"`
	// LoRARank trains a LoRA adapter of that rank on attention, the MLP
	// and the unembedding instead of every weight (attention and MLP alone
	// barely move this small model's logits). Default 0: full weights,
	// Flywheel's extension of the Tinker API. An adapter may want another
	// LR.
	LoRARank int `json:"lora_rank"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `json:"-"`
}

// WithDefaults fills in the fields left zero.
func (c Config) WithDefaults() Config {
	c.Task = c.Task.WithDefaults()
	if c.Base == (demotask.BaseConfig{}) {
		c.Base = demotask.BaseFor(c.Task)
	}
	c.Base = c.Base.WithDefaults()
	if c.GroupSize == 0 {
		c.GroupSize = 8
	}
	if c.Groups == 0 {
		c.Groups = 16
	}
	if c.SafetyGroups == 0 {
		c.SafetyGroups = c.Groups / 8
	}
	if c.SafetyGroups < 0 {
		c.SafetyGroups = 0
	}
	if c.Temperature == 0 {
		c.Temperature = 1
	}
	if c.LR == 0 {
		c.LR = 5e-4
	}
	if c.EvalEvery == 0 {
		c.EvalEvery = 5
	}
	if c.EvalPrompts == 0 {
		c.EvalPrompts = 200
	}
	if c.SafetyPrompts == 0 {
		c.SafetyPrompts = 32
	}
	if c.GatePrompts == 0 {
		c.GatePrompts = 100
	}
	if c.GateTolerance == 0 {
		c.GateTolerance = 0.02
	}
	if c.SafetyTolerance == 0 {
		c.SafetyTolerance = 0.1
	}
	if c.Budget == 0 {
		c.Budget = 6 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Trainer.Advantage.Estimator == "" {
		c.Trainer.Advantage.Estimator = trainer.AdvMean
	}
	switch pa := &c.Trainer.Advantage.PerfectAdvantage; {
	case *pa == 0:
		*pa = perfectAdvantage
	case *pa < 0:
		*pa = 0
	}
	if c.Trainer.MiniBatches == 0 {
		c.Trainer.MiniBatches = 2
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate names every field out of range.
func (c Config) Validate() error {
	var errs []error
	if err := c.Task.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Base.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.GroupSize < 2 || c.GroupSize > 256 {
		errs = append(errs, fmt.Errorf("group_size %d must be in [2, 256]: a group of one has no advantage", c.GroupSize))
	}
	if c.Groups < 1 || c.Groups > 1024 {
		errs = append(errs, fmt.Errorf("groups %d must be in [1, 1024]", c.Groups))
	}
	if c.SafetyGroups >= c.Groups {
		errs = append(errs, fmt.Errorf("safety_groups %d must be fewer than groups %d", c.SafetyGroups, c.Groups))
	}
	if c.Temperature <= 0 || c.Temperature > 5 {
		errs = append(errs, fmt.Errorf("temperature %v must be in (0, 5]", c.Temperature))
	}
	if c.LR <= 0 || c.LR > 1 {
		errs = append(errs, fmt.Errorf("lr %v must be in (0, 1]", c.LR))
	}
	if c.EvalEvery < 1 || c.EvalPrompts < 1 || c.EvalPrompts > 10_000 || c.SafetyPrompts < 1 || c.SafetyPrompts > 10_000 {
		errs = append(errs, fmt.Errorf("eval_every %d, eval_prompts %d and safety_prompts %d must be positive (prompts ≤ 10000)", c.EvalEvery, c.EvalPrompts, c.SafetyPrompts))
	}
	if c.GatePrompts < 1 || c.GatePrompts > 10_000 || c.GateTolerance < 0 || c.GateTolerance > 1 || c.SafetyTolerance < 0 || c.SafetyTolerance > 1 {
		errs = append(errs, fmt.Errorf("gate_prompts %d must be in [1, 10000], gate_tolerance %v and safety_tolerance %v in [0, 1]", c.GatePrompts, c.GateTolerance, c.SafetyTolerance))
	}
	if c.Lag < 0 || c.Lag > 64 {
		errs = append(errs, fmt.Errorf("lag %d must be in [0, 64]", c.Lag))
	}
	if c.MaxAhead < 0 || (c.MaxAhead > 0 && !c.FromServing) {
		errs = append(errs, fmt.Errorf("max_ahead %d must be ≥ 0, and needs from_serving (a line sampled from itself never goes back)", c.MaxAhead))
	}
	if c.LoRARank < 0 || c.LoRARank > maxLoRARank {
		errs = append(errs, fmt.Errorf("lora_rank %d must be in [0, %d] (0: full weights)", c.LoRARank, maxLoRARank))
	}
	if c.Budget < 0 || c.MaxSteps < 0 {
		errs = append(errs, fmt.Errorf("budget %v and max_steps %d must be ≥ 0", c.Budget, c.MaxSteps))
	}
	return errors.Join(errs...)
}

// maxLoRARank is the embedded trainer's largest adapter rank.
const maxLoRARank = 32

// perfectAdvantage is the demo's advantage for a group whose answers all
// earned the top reward. Refusals the base always gives make only such
// groups, so without it nothing kept them trained while the task moved the
// weights: run as the online loop runs (steps of 288, 64 safety prompts, a
// candidate that loses one refusal sends the line back), final held-out
// success over seeds 1-5 was 0.730, 0.880, 0.900, 0.855 and 0.735 with 16
// safety rollbacks in all; with 0.1, 0.910, 0.860, 0.760, 0.885 and 0.865
// (9); with 0.2, 0.910, 0.840, 0.825, 0.895 and 0.800 (5).
const perfectAdvantage = 0.2

// DefaultTrainer is the RL trainer a rehearsal runs with by default: the
// trainer defaults of Config, with its learning rate.
func DefaultTrainer() trainer.Config {
	c := Config{}.WithDefaults()
	t := c.Trainer
	t.Optim.LR = c.LR
	return t
}
