package trainer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// Trainer turns a batch into a new policy version. Local is the built-in
// implementation; an external (distributed) trainer is reached by exporting
// the Batch (WriteJSONL) and importing the weights it produces (LoadCheckpoint
// and Engine.Publish).
type Trainer interface {
	TrainStep(ctx context.Context, b *Batch) (StepResult, error)
}

// Publisher receives every new version; Engine implements it.
type Publisher interface {
	Publish(m *Model, version int64) error
}

// StepResult summarises one optimizer step.
type StepResult struct {
	// Version is the policy version after the step.
	Version  int64   `json:"version"`
	Loss     float64 `json:"loss"`
	GradNorm float64 `json:"grad_norm"`
	LR       float64 `json:"lr"`
	// Samples trained and samples dropped for staleness (older than η).
	Samples      int `json:"samples"`
	DroppedStale int `json:"dropped_stale"`
	// TrainedTokens is the loss denominator; masked tokens are in it too.
	TrainedTokens int `json:"trained_tokens"`
	IcePopMasked  int `json:"icepop_masked"`
	KPopMasked    int `json:"kpop_masked"`
	Clipped       int `json:"clipped"`
	// MeanKL is the mean KL estimate to the reference (0 when off).
	MeanKL     float64        `json:"mean_kl"`
	MeanReward float64        `json:"mean_reward"`
	Advantages AdvantageStats `json:"advantages"`
	// TotalTokens over all samples and UniqueTokens actually computed after
	// prefix sharing.
	TotalTokens int `json:"total_tokens"`
	// FLOPs executed by the forward and backward passes (matrix products,
	// attention over the full per-tree square included).
	FLOPs        float64       `json:"flops"`
	UniqueTokens int           `json:"unique_tokens"`
	Duration     time.Duration `json:"duration"`
}

// Config configures Local.
type Config struct {
	Loss      LossConfig      `json:"loss"`
	Advantage AdvantageConfig `json:"advantage"`
	Optim     OptimConfig     `json:"optim"`
	// MaxStaleness is η: a sample whose oldest trained token came from a
	// version more than η behind the current one is dropped. Default 4;
	// negative means no bound.
	MaxStaleness int `json:"max_staleness"`
	// NoPacking turns prefix sharing off (for comparisons). Default false.
	NoPacking bool `json:"no_packing"`
	// Logger defaults to slog.Default().
	Logger *slog.Logger `json:"-"`
}

func (c Config) withDefaults() Config {
	c.Loss = c.Loss.withDefaults()
	c.Advantage = c.Advantage.withDefaults()
	c.Optim = c.Optim.withDefaults()
	if c.MaxStaleness == 0 {
		c.MaxStaleness = 4
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	return errors.Join(c.Loss.validate(), c.Advantage.validate(), c.Optim.validate())
}

// Local trains the in-process policy.
type Local struct {
	cfg     Config
	mu      sync.Mutex
	model   *Model // training weights; never served directly
	ref     *Model // frozen reference for the KL term
	opt     *adamW
	base    *Baseline
	version int64
	pub     Publisher
}

// NewLocal trains a copy of m, starting at version; pub (may be nil) gets
// every new version.
func NewLocal(m *Model, version int64, cfg Config, pub Publisher) (*Local, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("trainer config: %w", err)
	}
	l := &Local{cfg: cfg, model: m.Clone(), opt: newAdamW(cfg.Optim, m.lay), base: NewBaseline(cfg.Advantage.BaselineRate), version: version, pub: pub}
	if cfg.Loss.KLCoef > 0 {
		l.ref = m.Clone()
	}
	return l, nil
}

// Version is the current policy version.
func (l *Local) Version() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// Snapshot returns a copy of the current weights.
func (l *Local) Snapshot() *Model {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.model.Clone()
}

// TrainStep runs one optimizer step on b and publishes the new version.
func (l *Local) TrainStep(ctx context.Context, b *Batch) (StepResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := time.Now()
	c := l.model.Config
	if b == nil {
		return StepResult{}, errors.New("train step: nil batch")
	}
	if err := b.validate(c.Vocab, c.Context); err != nil {
		return StepResult{}, fmt.Errorf("train step: %w", err)
	}
	res := StepResult{Version: l.version}
	sft := b.Objective == ObjectiveSFT

	samples := make([]Sample, 0, len(b.Samples))
	for _, s := range b.Samples {
		if !sft && l.cfg.MaxStaleness >= 0 {
			if v, ok := s.oldestVersion(); ok && l.version-v > int64(l.cfg.MaxStaleness) {
				res.DroppedStale++
				continue
			}
		}
		res.MeanReward += s.Reward
		samples = append(samples, s)
	}
	if len(samples) == 0 {
		return res, fmt.Errorf("train step: all %d samples are staler than η=%d", len(b.Samples), l.cfg.MaxStaleness)
	}
	res.MeanReward /= float64(len(samples))
	res.Samples = len(samples)
	if !sft {
		st, err := ComputeAdvantages(samples, l.cfg.Advantage, l.base)
		if err != nil {
			return res, fmt.Errorf("train step: %w", err)
		}
		res.Advantages = st
	}

	grad, err := l.lossAndGrad(ctx, samples, b.Temperature, sft, &res)
	if err != nil {
		return res, err
	}
	res.GradNorm = clipGrad(grad, l.cfg.Optim.ClipNorm)
	if math.IsNaN(res.GradNorm) || math.IsInf(res.GradNorm, 0) {
		return res, fmt.Errorf("train step: gradient norm is %v; weights left unchanged", res.GradNorm)
	}
	res.LR = l.opt.update(l.model.W, grad)
	l.version++
	res.Version = l.version
	if l.pub != nil {
		if err := l.pub.Publish(l.model.Clone(), l.version); err != nil {
			return res, fmt.Errorf("publish version %d: %w", l.version, err)
		}
	}
	res.Duration = time.Since(start)
	l.cfg.Logger.Debug("train step done", "version", res.Version, "loss", res.Loss, "grad_norm", res.GradNorm,
		"samples", res.Samples, "unique_tokens", res.UniqueTokens, "duration", res.Duration)
	return res, nil
}

// lossAndGrad computes the batch loss on the current weights and returns its
// gradient. Every token's loss depends on the network only through log π of
// that token, so the pass reduces the loss to d loss / d log π per node; a
// node shared by several samples sums their terms.
func (l *Local) lossAndGrad(ctx context.Context, samples []Sample, temperature float64, sft bool, res *StepResult) ([]float32, error) {
	seqs := make([][]int, len(samples))
	for i, s := range samples {
		seqs[i] = s.TokenIDs
	}
	pk, err := BuildPack(seqs, !l.cfg.NoPacking)
	if err != nil {
		return nil, fmt.Errorf("train step: %w", err)
	}
	res.TotalTokens, res.UniqueTokens = pk.NumSampleTokens(), pk.NumNodes()
	targetOf := make([]int, pk.NumNodes())
	for i := range targetOf {
		targetOf[i] = -1
	}
	var targets []int
	for s, smp := range samples {
		for t, mk := range smp.LossMask {
			if mk == 0 {
				continue
			}
			res.TrainedTokens++
			if n := pk.SampleNodes[s][t]; targetOf[n] < 0 {
				targetOf[n] = len(targets)
				targets = append(targets, n)
			}
		}
	}
	if res.TrainedTokens == 0 {
		return nil, errors.New("train step: no token has loss_mask 1")
	}
	temp := float32(temperature)
	if temp == 0 {
		temp = 1 // greedy samples report log-probs at T = 1
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := l.model.forward(pk, targets, temp)
	var refLogp []float32
	if l.ref != nil && !sft {
		refLogp = l.ref.forward(pk, targets, temp).TargetLogp
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dLogp := make([]float32, len(targets))
	inv := 1 / float64(res.TrainedTokens)
	var klSum float64
	for s, smp := range samples {
		for t, mk := range smp.LossMask {
			if mk == 0 {
				continue
			}
			ti := targetOf[pk.SampleNodes[s][t]]
			logp := float64(st.TargetLogp[ti])
			if sft {
				res.Loss -= logp * inv
				dLogp[ti] -= float32(inv)
				continue
			}
			in := tokenIn{Logp: logp, LogpProx: logp, LogpBehav: float64(smp.Logprobs[t]), Adv: *smp.Advantage}
			if refLogp != nil {
				in.LogpRef = float64(refLogp[ti])
			}
			out := ppoToken(l.cfg.Loss, in)
			res.Loss += out.Loss * inv
			dLogp[ti] += float32(out.DLogp * inv)
			klSum += out.KL
			if out.IcePopMasked {
				res.IcePopMasked++
			}
			if out.KPopMasked {
				res.KPopMasked++
			}
			if out.Clipped {
				res.Clipped++
			}
		}
	}
	res.MeanKL = klSum * inv
	grad := make([]float32, len(l.model.W))
	st.backward(dLogp, grad)
	res.FLOPs = 3 * st.forwardFLOPs()
	return grad, nil
}
