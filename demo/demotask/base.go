package demotask

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/tinkerstep"
	"github.com/flywheel-ai/flywheel/trainer"
)

// Cold-start priors. Both teach the format and the letters but not the
// order, so the base succeeds only by chance and RL must find the order.
const (
	// PriorWalks answers with the letters read cyclically from a random
	// start in a random direction: 2n orders, base success 1/(2n) (1/6 for
	// three letters, 1/8 for four). The reversal is one of them, so RL
	// selects and sharpens an ability the base has, as with a pretrained
	// model.
	PriorWalks = "walks"
	// PriorPermutations answers with a uniformly random ordering: n!
	// orders (1/6, 1/24). RL must build the backward walk itself, which
	// measured slower and less reliable within a few minutes.
	PriorPermutations = "permutations"
)

// BaseConfig configures the cold-start base policy: a fresh transformer that
// a short supervised run teaches the answer format (some ordering of the
// prompt's letters, and the refusal for safety prompts) but not the order,
// so it succeeds about 1/n! of the time and RL has to discover the rest.
type BaseConfig struct {
	// Model sizes the policy. Default: context 48, 2 layers, 4 heads,
	// d_model 64.
	Model trainer.ModelConfig `json:"model"`
	// Seed makes the base policy reproducible. Default 1.
	Seed uint64 `json:"seed"`
	// Steps of supervised training. Default 2500: at 800 the base sampled
	// at temperature 1 wrote letters that are not in the prompt 45% of the
	// time and GRPO unlearned more than it learned for 200 steps; at 2500
	// 60% of its answers are walks (10% the reversal) and RL rises from the
	// first steps. 5000 measured no better.
	Steps int `json:"steps"`
	// BatchSize is the number of prompts per step. Default 32.
	BatchSize int `json:"batch_size"`
	// AnswersPerPrompt is the number of different orderings taught per
	// prompt in a step; they share the prompt's computation (prefix
	// packing). Default 1: measured, more distinct prompts teach the
	// copying faster than more orderings of fewer prompts.
	AnswersPerPrompt int `json:"answers_per_prompt"`
	// LR is the supervised learning rate. Default 3e-3.
	LR float64 `json:"lr"`
	// Prior is what the cold start teaches as the answer: PriorWalks
	// (default) or PriorPermutations.
	Prior string `json:"prior"`
	// SafetyFraction is the share of safety prompts in each batch.
	// Default 0.125.
	SafetyFraction float64 `json:"safety_fraction"`
}

// WithDefaults fills in the fields left zero.
func (c BaseConfig) WithDefaults() BaseConfig {
	if c.Model == (trainer.ModelConfig{}) {
		c.Model = trainer.ModelConfig{Context: 48, Layers: 2, Heads: 4, DModel: 64}
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Steps == 0 {
		c.Steps = 2500
	}
	if c.BatchSize == 0 {
		c.BatchSize = 32
	}
	if c.AnswersPerPrompt == 0 {
		c.AnswersPerPrompt = 1
	}
	if c.LR == 0 {
		c.LR = 3e-3
	}
	if c.SafetyFraction == 0 {
		c.SafetyFraction = 0.125
	}
	if c.Prior == "" {
		c.Prior = PriorWalks
	}
	return c
}

// Validate names every field out of range.
func (c BaseConfig) Validate() error {
	var errs []error
	if c.Steps < 1 || c.Steps > 100_000 {
		errs = append(errs, fmt.Errorf("base steps %d must be in [1, 100000]", c.Steps))
	}
	if c.BatchSize < 1 || c.BatchSize > 4096 {
		errs = append(errs, fmt.Errorf("base batch_size %d must be in [1, 4096]", c.BatchSize))
	}
	if c.AnswersPerPrompt < 1 || c.AnswersPerPrompt > 64 {
		errs = append(errs, fmt.Errorf("base answers_per_prompt %d must be in [1, 64]", c.AnswersPerPrompt))
	}
	if c.LR <= 0 || c.LR > 1 {
		errs = append(errs, fmt.Errorf("base lr %v must be in (0, 1]", c.LR))
	}
	if c.Prior != PriorWalks && c.Prior != PriorPermutations {
		errs = append(errs, fmt.Errorf("base prior %q must be %q or %q", c.Prior, PriorWalks, PriorPermutations))
	}
	if c.SafetyFraction < 0 || c.SafetyFraction >= 1 {
		errs = append(errs, fmt.Errorf("base safety_fraction %v must be in [0, 1)", c.SafetyFraction))
	}
	return errors.Join(errs...)
}

// PromptIDs renders a user message with the in-process policy's chat
// template, exactly as the engine does for a chat-completions request.
func PromptIDs(text string) ([]int, error) {
	return trainer.RenderPrompt([]inference.Message{{Role: inference.RoleUser, Content: text}}, nil, "", nil)
}

// AnswerIDs are the completion tokens for answer, end marker included.
func AnswerIDs(answer string) []int {
	return append(trainer.Tokenizer{}.Encode(answer), trainer.TokImEnd)
}

// BuildBase trains the base policy from scratch. heldOut prompts are never
// used; it is deterministic for a given configuration.
func BuildBase(ctx context.Context, task Task, cfg BaseConfig, heldOut []Prompt) (*trainer.Model, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("base config: %w", err)
	}
	gen, err := NewGenerator(task, cfg.Seed^0xba5e, heldOut)
	if err != nil {
		return nil, err
	}
	m, err := trainer.NewModel(cfg.Model, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("base model: %w", err)
	}
	// The warm-up trains through the Tinker API as every training of the
	// policy does: cross_entropy on full weights with the in-process
	// trainer's AdamW (its defaults, the rate on a cosine over the steps).
	w, err := StartLoopback(ctx, m, deployment.LoRA{FullWeights: true})
	if err != nil {
		return nil, fmt.Errorf("base warm-up: %w", err)
	}
	defer w.Close()
	optim := trainer.OptimConfig{LR: cfg.LR, DecaySteps: cfg.Steps}.WithDefaults()
	adam := AdamFrom(optim)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xc01d))
	for step := 0; step < cfg.Steps; step++ {
		var batch []trainer.Sample
		for i := 0; i < cfg.BatchSize; i++ {
			safety := rng.Float64() < cfg.SafetyFraction
			p := gen.Next()
			if safety {
				p = gen.NextSafety()
			}
			for j := 0; j < cfg.AnswersPerPrompt; j++ {
				ss, err := warmUpSamples(task, cfg, gen, p)
				if err != nil {
					return nil, err
				}
				batch = append(batch, ss...)
			}
		}
		// The token mean of −log π over the masked tokens, as the
		// in-process trainer's SFT.
		sft := tinkerstep.Config{SFT: true, LR: optim.LRAt(step), Trainer: deployment.Trainer{MiniBatches: 1, Adam: adam}}
		if _, err := w.Step(ctx, batch, sft); err != nil {
			return nil, fmt.Errorf("base step %d: %w", step, err)
		}
	}
	base, err := w.Weights(ctx)
	if err != nil {
		return nil, fmt.Errorf("base warm-up: %w", err)
	}
	return base, nil
}

// warmUpSamples are what the warm-up teaches for p: the format of an
// answer (the letters in some order the prior draws, or a session that
// calls a random tool and answers with its result), and the refusal for a
// safety prompt.
func warmUpSamples(task Task, cfg BaseConfig, gen *Generator, p Prompt) ([]trainer.Sample, error) {
	if task.Kind == KindTools {
		return toolsSamples(p, gen.RandomTool())
	}
	answer := p.Want
	switch {
	case p.Want == Refusal:
	case cfg.Prior == PriorPermutations:
		answer = gen.Permutation(p)
	default:
		answer = gen.Walk(p)
	}
	s, err := sftSample(p.Text, answer)
	return []trainer.Sample{s}, err
}

func sftSample(text, answer string) (trainer.Sample, error) {
	return sftStep([]inference.Message{{Role: inference.RoleUser, Content: text}}, nil, AnswerIDs(answer))
}

// baseRevision changes whenever BuildBase would build a different policy
// from the same configuration, so stale cached bases are not reused.
const baseRevision = 4

// baseHeldOut is the least number of held-out prompts a base is built
// without: the demo deployment measures success on the first 200 of the
// held-out stream and gates releases on the next 800 (GateHeldOut), and
// neither set may have been trained on.
const baseHeldOut = deployHeldOutN + deployGateN

// BaseKey identifies a base policy: its configuration and task, hashed.
func BaseKey(task Task, cfg BaseConfig, heldOutSeed uint64, heldOutN int) string {
	cfg = cfg.WithDefaults()
	heldOutN = max(heldOutN, baseHeldOut)
	raw, _ := json.Marshal(struct {
		Task    Task
		Base    BaseConfig
		HeldOut [2]uint64
		Rev     int
	}{task.WithDefaults(), cfg, [2]uint64{heldOutSeed, uint64(heldOutN)}, baseRevision})
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8])
}

// LoadOrBuildBase returns the cached base policy under dir, building and
// caching it when absent. dir "" disables the cache.
func LoadOrBuildBase(ctx context.Context, dir string, task Task, cfg BaseConfig, heldOutSeed uint64, heldOutN int, log *slog.Logger) (*trainer.Model, bool, error) {
	if log == nil {
		log = slog.Default()
	}
	heldOut, err := HeldOut(task, heldOutSeed, max(heldOutN, baseHeldOut))
	if err != nil {
		return nil, false, err
	}
	var path string
	if dir != "" {
		path = filepath.Join(dir, "demo-base-"+BaseKey(task, cfg, heldOutSeed, heldOutN)+".safetensors")
		if m, _, _, err := trainer.LoadCheckpoint(path); err == nil {
			log.Info("demo base policy loaded from cache", "path", path)
			return m, true, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			log.Warn("demo base policy cache unreadable; rebuilding", "path", path, "error", err)
		}
	}
	start := time.Now()
	m, err := BuildBase(ctx, task, cfg, heldOut)
	if err != nil {
		return nil, false, err
	}
	log.Info("demo base policy built", "duration", time.Since(start).Round(time.Millisecond), "params", m.NumParams())
	if path != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, false, fmt.Errorf("base cache dir: %w", err)
		}
		if err := trainer.SaveCheckpoint(path, m, 0, map[string]string{"demo_base_key": filepath.Base(path)}); err != nil {
			// A cache that cannot be written only costs the next run the build.
			log.Warn("demo base policy not cached", "path", path, "error", err)
		}
	}
	return m, false, nil
}
