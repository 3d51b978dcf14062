package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

// A Learner is one model as the Tinker training API trains it: a client
// sends datums and a loss, the gradient accumulates over any number of
// ForwardBackward calls, and OptimStep applies it with the Adam settings of
// that request. Nothing is scheduled or averaged inside: the loss is a sum
// over tokens, and the weights a datum carries are the client's to choose.
// Local is the other way to train the same policy, one batch per step.

// Loss functions of the Tinker API, with SkyRL tx's elementwise formulas.
const (
	// LossFnCrossEntropy is −w·log π.
	LossFnCrossEntropy = "cross_entropy"
	// LossFnImportanceSampling is −w·(π/μ)·A, μ the sampling policy.
	LossFnImportanceSampling = "importance_sampling"
	// LossFnPPO is −w·min(r·A, clip(r, low, high)·A), r = π/μ.
	LossFnPPO = "ppo"
)

// The ppo loss's ratio bounds when a request sets none (SkyRL tx's
// defaults; the Tinker documentation gives none).
const (
	DefaultPPOClipLow  = 0.8
	DefaultPPOClipHigh = 1.2
)

// ErrInvalidInput marks an error that is the caller's fault: a malformed
// datum, an unknown loss, Adam settings out of range. A server answers it
// with a 4xx.
var ErrInvalidInput = errors.New("invalid input")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidInput, fmt.Sprintf(format, args...))
}

// TokenDatum is one sequence to score, in the Tinker convention: Targets[i]
// is the token that follows Input[i], so the sequence is Input plus the last
// target, and Targets[i] must equal Input[i+1].
type TokenDatum struct {
	Input   []int
	Targets []int
	// Weights multiply each position's loss; nil means 1 everywhere. A
	// weight of 0 drops the position (its loss and gradient are 0 even if
	// the formula would not be finite).
	Weights []float32
	// Logprobs are the sampling policy's log-probs of the targets and
	// Advantages the per-position advantages; importance_sampling and ppo
	// need both.
	Logprobs   []float32
	Advantages []float32
}

// Loss names a loss function and its settings.
type Loss struct {
	// Fn is LossFnCrossEntropy, LossFnImportanceSampling or LossFnPPO.
	Fn string
	// ClipLow and ClipHigh bound the ppo ratio; 0 takes
	// DefaultPPOClipLow / DefaultPPOClipHigh.
	ClipLow, ClipHigh float64
}

func (l Loss) withDefaults() Loss {
	if l.ClipLow == 0 {
		l.ClipLow = DefaultPPOClipLow
	}
	if l.ClipHigh == 0 {
		l.ClipHigh = DefaultPPOClipHigh
	}
	return l
}

func (l Loss) validate() error {
	switch l.Fn {
	case LossFnCrossEntropy, LossFnImportanceSampling:
	case LossFnPPO:
		if !(l.ClipLow >= 0 && l.ClipLow <= 1 && l.ClipHigh >= 1 && !math.IsInf(l.ClipHigh, 0)) {
			return invalidf("ppo clip thresholds [%v, %v] must satisfy 0 ≤ low ≤ 1 ≤ high", l.ClipLow, l.ClipHigh)
		}
	default:
		return invalidf("loss function %q is not one of %s, %s, %s", l.Fn, LossFnCrossEntropy, LossFnImportanceSampling, LossFnPPO)
	}
	return nil
}

// needsSampling reports whether the loss reads Logprobs and Advantages.
func (l Loss) needsSampling() bool { return l.Fn != LossFnCrossEntropy }

// tokenLoss is one position's loss and its derivative with respect to
// log π, exactly as SkyRL tx's loss_fns.py defines them.
func (l Loss) tokenLoss(logp, w, sampling, adv float64) (loss, dLogp float64) {
	if w == 0 {
		return 0, 0
	}
	switch l.Fn {
	case LossFnCrossEntropy:
		return -w * logp, -w
	case LossFnImportanceSampling:
		r := math.Exp(logp - sampling)
		return -w * r * adv, -w * r * adv
	}
	r := math.Exp(logp - sampling)
	un, cl := r*adv, math.Min(math.Max(r, l.ClipLow), l.ClipHigh)*adv
	if cl < un {
		return -w * cl, 0 // the clipped branch is constant in θ
	}
	return -w * un, -w * un
}

// ForwardResult is what Forward and ForwardBackward return, datum by datum.
type ForwardResult struct {
	// Logprobs[d][i] is log π(Targets[i]) of datum d, and Loss[d][i] that
	// position's loss.
	Logprobs [][]float32
	Loss     [][]float32
	// LossSum is the sum of every position's loss (Tinker's loss:sum).
	LossSum float64
	// Tokens is the number of positions over all datums; UniqueTokens the
	// number the passes computed after prefix sharing.
	Tokens       int
	UniqueTokens int
	// FLOPs executed (a backward pass costs two forwards).
	FLOPs float64
}

// AdamStep is one optimizer step's settings, as a request sends them.
type AdamStep struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	// ClipNorm bounds the global gradient norm; 0 means no clipping.
	ClipNorm float64
}

func (s AdamStep) validate() error {
	ok := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if !ok(s.LR) || s.LR < 0 {
		return invalidf("learning rate %v must be ≥ 0", s.LR)
	}
	if !ok(s.Beta1) || !ok(s.Beta2) || s.Beta1 < 0 || s.Beta1 >= 1 || s.Beta2 < 0 || s.Beta2 >= 1 {
		return invalidf("betas (%v, %v) must be in [0, 1)", s.Beta1, s.Beta2)
	}
	if !ok(s.Eps) || s.Eps <= 0 {
		return invalidf("eps %v must be > 0", s.Eps)
	}
	if !ok(s.WeightDecay) || s.WeightDecay < 0 || !ok(s.ClipNorm) || s.ClipNorm < 0 {
		return invalidf("weight decay %v and clip norm %v must be ≥ 0", s.WeightDecay, s.ClipNorm)
	}
	return nil
}

// OptimResult reports one optimizer step.
type OptimResult struct {
	// GradNorm is the global norm of the accumulated gradient, before
	// clipping.
	GradNorm float64
	LR       float64
	// Step counts the optimizer steps taken, this one included.
	Step int
}

// Learner trains one model: full weights, or LoRA adapters over a frozen
// base. It is safe for concurrent use; calls run one at a time.
type Learner struct {
	mu   sync.Mutex
	lora LoRAConfig
	base *Model // never written; in LoRA mode the adapters sit on it
	// model is what the passes run on: the trained weights themselves in
	// full mode, base + adapters (rebuilt after every step) in LoRA mode.
	model *Model
	// params is the trainable vector (model.W in full mode, every A and B
	// in LoRA mode), laid out by train; grad accumulates its gradient.
	train    []paramSpec
	params   []float32
	adapters []adapter
	grad     []float32
	opt      *adamW
}

// NewLearner starts a learner on base, which it never writes. With
// lora.Rank 0 it trains a copy of every weight; otherwise adapters that
// leave the model equal to base until the first step.
func NewLearner(base *Model, lora LoRAConfig) (*Learner, error) {
	if base == nil {
		return nil, errors.New("new learner: nil base model")
	}
	lora = lora.withDefaults()
	if err := lora.Validate(base.Config); err != nil {
		return nil, fmt.Errorf("new learner: %w", err)
	}
	l := &Learner{lora: lora, base: base}
	if lora.Rank == 0 {
		l.model = base.Clone()
		l.params, l.train = l.model.W, base.lay.Specs
	} else {
		l.adapters, l.train = newAdapters(base, lora)
		l.params = make([]float32, specsTotal(l.train))
		initAdapters(l.params, l.adapters, lora.Seed)
		l.model = base.Clone()
		l.merge()
	}
	l.grad = make([]float32, len(l.params))
	l.opt = newAdamW(OptimConfig{}, &layout{Specs: l.train, Total: len(l.params)})
	return l, nil
}

func specsTotal(specs []paramSpec) int {
	if len(specs) == 0 {
		return 0
	}
	last := specs[len(specs)-1]
	return last.Offset + last.Size
}

// LoRA is the learner's adapter configuration (Rank 0: full weights).
func (l *Learner) LoRA() LoRAConfig { return l.lora }

// Config is the model's configuration.
func (l *Learner) Config() ModelConfig { return l.base.Config }

// NumTrainable is the number of weights the optimizer updates.
func (l *Learner) NumTrainable() int { return len(l.params) }

// Step is the number of optimizer steps taken.
func (l *Learner) Step() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.opt.step
}

// Merged returns the weights the learner's model runs on (base with the
// adapters folded in): what serving runs. The copy is the caller's.
func (l *Learner) Merged() *Model {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.model.Clone()
}

// Forward scores data under loss without touching the gradient.
func (l *Learner) Forward(ctx context.Context, data []TokenDatum, loss Loss) (ForwardResult, error) {
	return l.pass(ctx, data, loss, false)
}

// ForwardBackward scores data under loss and adds the gradient of the summed
// loss to the one OptimStep will apply.
func (l *Learner) ForwardBackward(ctx context.Context, data []TokenDatum, loss Loss) (ForwardResult, error) {
	return l.pass(ctx, data, loss, true)
}

func (l *Learner) pass(ctx context.Context, data []TokenDatum, loss Loss, withGrad bool) (ForwardResult, error) {
	loss = loss.withDefaults()
	if err := loss.validate(); err != nil {
		return ForwardResult{}, err
	}
	c := l.base.Config
	if err := validateData(data, loss, c); err != nil {
		return ForwardResult{}, err
	}
	seqs := make([][]int, len(data))
	for d, dt := range data {
		seqs[d] = append(append(make([]int, 0, len(dt.Input)+1), dt.Input...), dt.Targets[len(dt.Targets)-1])
	}
	pk, err := BuildPack(seqs, true)
	if err != nil {
		return ForwardResult{}, invalidf("%v", err)
	}
	// Position i of datum d is the node of token i+1 of its sequence; a
	// node shared by several datums is scored once and its derivative is
	// the sum of theirs.
	targetOf := make([]int, pk.NumNodes())
	for i := range targetOf {
		targetOf[i] = -1
	}
	var targets []int
	for d := range data {
		for _, n := range pk.SampleNodes[d][1:] {
			if targetOf[n] < 0 {
				targetOf[n] = len(targets)
				targets = append(targets, n)
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return ForwardResult{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	sc := &scratch{}
	defer sc.release()
	st := l.model.forwardIn(sc, pk, targets, 1)
	res := ForwardResult{Logprobs: make([][]float32, len(data)), Loss: make([][]float32, len(data)), UniqueTokens: pk.NumNodes()}
	dLogp := make([]float32, len(targets))
	for d, dt := range data {
		lp, el := make([]float32, len(dt.Targets)), make([]float32, len(dt.Targets))
		for i := range dt.Targets {
			ti := targetOf[pk.SampleNodes[d][i+1]]
			w, sampling, adv := 1.0, 0.0, 0.0
			if dt.Weights != nil {
				w = float64(dt.Weights[i])
			}
			if loss.needsSampling() {
				sampling, adv = float64(dt.Logprobs[i]), float64(dt.Advantages[i])
			}
			lp[i] = st.TargetLogp[ti]
			v, g := loss.tokenLoss(float64(lp[i]), w, sampling, adv)
			el[i] = float32(v)
			res.LossSum += v
			dLogp[ti] += float32(g)
		}
		res.Logprobs[d], res.Loss[d] = lp, el
		res.Tokens += len(dt.Targets)
	}
	res.FLOPs = st.forwardFLOPs()
	if !withGrad {
		return res, nil
	}
	if err := ctx.Err(); err != nil {
		return ForwardResult{}, err
	}
	res.FLOPs *= 3
	if l.lora.Rank == 0 {
		st.backward(dLogp, l.grad)
		return res, nil
	}
	full := sc.floats(len(l.model.W))
	st.backward(dLogp, full)
	l.adapterGrads(full)
	return res, nil
}

// validateData checks every datum against the model and the loss; the
// error names the datum and the position.
func validateData(data []TokenDatum, loss Loss, c ModelConfig) error {
	if len(data) == 0 {
		return invalidf("no datums")
	}
	finite := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }
	for d, dt := range data {
		n := len(dt.Input)
		switch {
		case n == 0:
			return invalidf("datum %d: empty input", d)
		case len(dt.Targets) != n:
			return invalidf("datum %d: %d target tokens for %d input tokens", d, len(dt.Targets), n)
		case n+1 > c.Context:
			return invalidf("datum %d: %d tokens (input and the last target) exceed the context of %d", d, n+1, c.Context)
		case dt.Weights != nil && len(dt.Weights) != n:
			return invalidf("datum %d: %d weights for %d positions", d, len(dt.Weights), n)
		}
		if loss.needsSampling() {
			if len(dt.Logprobs) != n || len(dt.Advantages) != n {
				return invalidf("datum %d: loss %s needs %d logprobs and advantages, got %d and %d", d, loss.Fn, n, len(dt.Logprobs), len(dt.Advantages))
			}
		}
		for i := 0; i < n; i++ {
			if tok := dt.Input[i]; tok < 0 || tok >= c.Vocab {
				return invalidf("datum %d position %d: input token %d outside the vocabulary [0, %d)", d, i, tok, c.Vocab)
			}
			if tok := dt.Targets[i]; tok < 0 || tok >= c.Vocab {
				return invalidf("datum %d position %d: target token %d outside the vocabulary [0, %d)", d, i, tok, c.Vocab)
			}
			if i+1 < n && dt.Targets[i] != dt.Input[i+1] {
				return invalidf("datum %d position %d: target %d is not the next input token %d (targets must be the input shifted by one)", d, i, dt.Targets[i], dt.Input[i+1])
			}
			if dt.Weights != nil && !finite(dt.Weights[i]) {
				return invalidf("datum %d position %d: weight %v is not finite", d, i, dt.Weights[i])
			}
			if loss.needsSampling() && (!finite(dt.Logprobs[i]) || !finite(dt.Advantages[i])) {
				return invalidf("datum %d position %d: logprob %v and advantage %v must be finite", d, i, dt.Logprobs[i], dt.Advantages[i])
			}
		}
	}
	return nil
}

// OptimStep applies AdamW with s to the gradient accumulated since the last
// step (decay on matrices only, as Local does), then clears it. A step with
// nothing accumulated still advances the moments, as Adam on a zero
// gradient does.
func (l *Learner) OptimStep(s AdamStep) (OptimResult, error) {
	if err := s.validate(); err != nil {
		return OptimResult{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer clear(l.grad)
	norm := clipGrad(l.grad, s.ClipNorm)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return OptimResult{}, invalidf("gradient norm is %v; step skipped and the gradient dropped", norm)
	}
	// No schedule: the rate is the request's, so LRAt returns LR.
	l.opt.cfg = OptimConfig{LR: s.LR, MinLR: s.LR, Beta1: s.Beta1, Beta2: s.Beta2, Eps: s.Eps, WeightDecay: s.WeightDecay}
	lr := l.opt.update(l.params, l.grad, 1)
	if l.lora.Rank > 0 {
		l.merge()
	}
	return OptimResult{GradNorm: norm, LR: lr, Step: l.opt.step}, nil
}
