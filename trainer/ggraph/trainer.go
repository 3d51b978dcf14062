package ggraph

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/trainer"
)

// Trainer is trainer.Local with the loss and gradient computed by gorgonia
// instead of the hand-written passes: the same staleness filter,
// advantages, packing, loss, clipping and AdamW, so either can sit behind
// the trainer.Trainer interface.
type Trainer struct {
	cfg     trainer.Config
	mu      sync.Mutex
	model   *trainer.Model // training weights, shared with eng's graphs
	eng     *Engine
	refEng  *Engine // frozen reference policy for the KL term
	opt     *trainer.Optimizer
	base    *trainer.Baseline
	version int64
	pub     trainer.Publisher
}

var _ trainer.Trainer = (*Trainer)(nil)

// NewTrainer trains a copy of m, starting at version; pub (may be nil) gets
// every new version. cfg is trainer.Local's configuration.
func NewTrainer(m *trainer.Model, version int64, cfg trainer.Config, pub trainer.Publisher) (*Trainer, error) {
	if m == nil {
		return nil, errors.New("ggraph: nil model")
	}
	cfg, err := cfg.Resolve()
	if err != nil {
		return nil, fmt.Errorf("trainer config: %w", err)
	}
	t := &Trainer{cfg: cfg, model: m.Clone(), base: trainer.NewBaseline(cfg.Advantage.BaselineRate), version: version, pub: pub}
	if t.eng, err = New(t.model, cfg.Loss); err != nil {
		return nil, err
	}
	if t.opt, err = trainer.NewOptimizer(cfg.Optim, t.model); err != nil {
		return nil, err
	}
	if cfg.Loss.KLCoef > 0 {
		if t.refEng, err = New(m.Clone(), cfg.Loss); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Close releases the graphs.
func (t *Trainer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	err := t.eng.Close()
	if t.refEng != nil {
		err = errors.Join(err, t.refEng.Close())
	}
	return err
}

// Version is the current policy version.
func (t *Trainer) Version() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.version
}

// Snapshot returns a copy of the current weights.
func (t *Trainer) Snapshot() *trainer.Model {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.model.Clone()
}

// TrainStep runs one optimizer step on b through the gorgonia graph and
// publishes the new version.
func (t *Trainer) TrainStep(ctx context.Context, b *trainer.Batch) (trainer.StepResult, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	start := time.Now()
	c := t.model.Config
	samples, res, err := trainer.PrepareStep(b, c, func(v int64) int64 { return t.version - v }, t.cfg, t.base)
	if err != nil {
		return res, err
	}
	sft := b.Objective == trainer.ObjectiveSFT
	plan, err := trainer.PlanLoss(samples, b.Temperature, sft, !t.cfg.NoPacking)
	if err != nil {
		return res, fmt.Errorf("train step: %w", err)
	}
	res.TotalTokens, res.UniqueTokens, res.TrainedTokens = plan.Pack.NumSampleTokens(), plan.Pack.NumNodes(), len(plan.Occ)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	var ref []float32
	if t.refEng != nil && !sft {
		if ref, err = t.refEng.TargetLogp(plan.Pack, plan.Targets, plan.Temp); err != nil {
			return res, fmt.Errorf("train step: reference policy: %w", err)
		}
	}
	out, err := t.eng.Step(plan, nil, ref)
	if err != nil {
		return res, fmt.Errorf("train step: %w", err)
	}
	res.Loss = out.Loss
	if !sft {
		t.countTokens(plan, out.TargetLogp, ref, &res)
	}
	res.FLOPs = 3 * ForwardFLOPs(c, plan)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	res.GradNorm, res.LR, err = t.opt.Step(t.model.W, out.Grad, t.cfg.LRScale(len(samples)))
	if err != nil {
		return res, fmt.Errorf("train step: %w", err)
	}
	t.version++
	res.Version = t.version
	if t.pub != nil {
		if err := t.pub.Publish(t.model.Clone(), t.version); err != nil {
			return res, fmt.Errorf("publish version %d: %w", t.version, err)
		}
	}
	res.Duration = time.Since(start)
	t.cfg.Logger.Debug("gorgonia train step done", "version", res.Version, "loss", res.Loss, "grad_norm", res.GradNorm,
		"samples", res.Samples, "unique_tokens", res.UniqueTokens, "duration", res.Duration)
	return res, nil
}

// countTokens fills the step's masked, clipped and KL statistics from the
// graph's log-probs with the hand-written per-token rule (π_prox = π).
func (t *Trainer) countTokens(p *trainer.LossPlan, logp, ref []float32, res *trainer.StepResult) {
	var klSum float64
	for _, o := range p.Occ {
		lp := float64(logp[o.Target])
		in := trainer.PPOTokenIn{Logp: lp, LogpProx: lp, LogpBehav: o.LogpBehav, Adv: o.Adv}
		if ref != nil {
			in.LogpRef = float64(ref[o.Target])
		}
		out := trainer.PPOToken(t.cfg.Loss, in)
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
	res.MeanKL = klSum / float64(len(p.Occ))
}

// ForwardFLOPs counts the useful multiply-adds ×2 of one forward pass over
// plan, with the hand-written path's formula (dense layers per node, the
// output layer per logits row, attention over each tree's square), so that
// both paths report FLOP rates for the same work. The graph itself computes
// attention over the whole N×N square of the pack.
func ForwardFLOPs(c trainer.ModelConfig, p *trainer.LossPlan) float64 {
	d, f := float64(c.DModel), float64(c.FFN)
	pk := p.Pack
	dense := 2 * float64(c.Layers) * (3*d*d + d*d + 2*d*f) * float64(pk.NumNodes())
	rows := map[int]bool{}
	for _, tn := range p.Targets {
		rows[pk.Parent[tn]] = true
	}
	head := 2 * d * float64(c.Vocab) * float64(len(rows))
	var att float64
	for _, t := range pk.Trees {
		att += 4 * float64(t.N) * float64(t.N) * d * float64(c.Layers)
	}
	return dense + head + att
}
