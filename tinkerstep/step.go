// Package tinkerstep is one train step of a batch on a model of a Tinker
// service: the datums, decoupled PPO's proximal pass, the minibatches and
// their optimizer steps. Flywheel's driver of Tinker trainers
// (activities.TinkerTraining), the demo's supervised warm-up and the
// rehearsal all train through it, on any server of the API.
package tinkerstep

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// Config is what a step needs of the deployment's trainer.
type Config struct {
	// Trainer gives the loss, its clip range, the behaviour weight's
	// cap, the minibatches, the nominal batch and Adam (after
	// WithDefaults).
	Trainer deployment.Trainer
	// SFT trains cross_entropy on the loss-masked tokens instead.
	SFT bool
	// Masks are the off-policy masks (IcePop, KPop) to apply, nil: none.
	Masks *deployment.TokenMasks
	// LR overrides Trainer.Adam.LR when positive (a schedule the caller
	// keeps, as the warm-up's cosine).
	LR float64
	// Reference is the model of the service that Trainer.KLCoef's penalty
	// is taken to (the base, never updated), and ReferenceSeq hands out
	// its next seq_id; needed only when Trainer.KLCoef > 0.
	Reference    string
	ReferenceSeq func() int64
	// Ready, when set, is awaited before the first update is queued: a
	// request queued on the model ahead of the step (the base state's
	// load_weights), which the proximal pass may overlap but no update
	// may follow unless it succeeded.
	Ready func(context.Context) error
	// Queued, when set, is called once the last update is queued, before
	// the results still in flight are read: what it queues on the model
	// (the saves) runs right after the last update, with no wait for the
	// client between them. It runs whether or not the updates succeed:
	// the caller trusts it only once Train has returned no error.
	Queued func(context.Context) error
}

// Stats sums a step's passes.
type Stats struct {
	// Loss is the sum of the minibatches' summed losses (each the token
	// mean of its minibatch).
	Loss          float64
	Tokens        int
	Updates       int
	IcePop, KPop  int
	ForwardPasses int
	GradNorm      float64 // mean over the updates
	// KL is the mean, over the trained tokens, of the behaviour log-prob
	// less the reference's (an estimate of the KL from the reference),
	// where a KL penalty was taken.
	KL *float64
}

// Metrics are the figures a version records.
func (st Stats) Metrics() map[string]float64 {
	m := map[string]float64{"updates": float64(st.Updates), "forward_passes": float64(st.ForwardPasses), "grad_norm": st.GradNorm,
		"icepop_masked_tokens": float64(st.IcePop), "kpop_masked_tokens": float64(st.KPop)}
	if st.KL != nil {
		m["kl_ref"] = *st.KL
	}
	return m
}

// pipelineDepth is how many minibatches Train queues ahead of the one
// whose results it reads.
const pipelineDepth = 2

// ErrNothingToTrain is a batch with no token of loss mask 1.
var ErrNothingToTrain = errors.New("no token has loss_mask 1")

// Train trains samples (advantages set, except for SFT) on model: seq
// hands out the model's next seq_id for each request.
func Train(ctx context.Context, c *tinker.Client, model string, samples []trainer.Sample, cfg Config, seq func() int64) (Stats, error) {
	var st Stats
	loss, err := lossConfig(cfg)
	if err != nil {
		return st, err
	}
	parts := trainer.SplitGroups(samples, cfg.Trainer.MiniBatches)
	var prox *partsPass
	if !cfg.SFT && (cfg.Trainer.Loss == deployment.LossPPO || loss.IcePop || loss.KPop) {
		// Every part's ratio is taken against the weights the step
		// starts from: one forward pass, queued before any update.
		if prox, err = forwardParts(ctx, c, model, parts, seq); err != nil {
			return st, err
		}
		st.ForwardPasses++
	}
	var kl *klPenalty
	if !cfg.SFT && cfg.Trainer.KLCoef > 0 {
		if kl, err = reference(ctx, c, parts, cfg); err != nil {
			return st, err
		}
		st.ForwardPasses++
		st.KL = &kl.mean
	}
	if cfg.Ready != nil {
		if err := cfg.Ready(ctx); err != nil {
			return st, err
		}
	}
	a := cfg.Trainer.Adam
	lr := a.LR
	if cfg.LR > 0 {
		lr = cfg.LR
	}
	if n := cfg.Trainer.NominalBatch; n > 0 && len(samples) < n {
		lr *= float64(len(samples)) / float64(n)
	}
	adam := tinker.AdamParams{LearningRate: lr, Beta1: a.Beta1, Beta2: a.Beta2, Eps: a.Eps, WeightDecay: a.WeightDecay, GradClipNorm: a.GradClipNorm}
	// A minibatch's forward_backward and optim_step are queued before the
	// results of the ones ahead of it are read (at most pipelineDepth
	// minibatches in flight): the service runs a model's requests in order,
	// so while it computes one minibatch the next is built, encoded and
	// uploaded, and an earlier one's result comes back.
	type inflight struct {
		fb  tinker.Pending[tinker.ForwardBackwardOutput]
		opt tinker.Pending[tinker.OptimStepResponse]
		partStats
	}
	var queue []inflight
	queued := 0
	collect := func() error {
		f := queue[0]
		queue = queue[1:]
		out, err := f.fb.Await(ctx)
		if err != nil {
			return err
		}
		res, err := f.opt.Await(ctx)
		if err != nil {
			return err
		}
		st.Loss += out.LossSum()
		st.Tokens += f.tokens
		st.IcePop += f.icePop
		st.KPop += f.kPop
		st.Updates++
		st.GradNorm += res.Metrics["grad_norm"]
		return nil
	}
	for i, part := range parts {
		var partProx [][]float64
		if prox != nil {
			if partProx, err = prox.part(ctx, i); err != nil {
				return st, err
			}
		}
		var partRef [][]float64
		if kl != nil {
			partRef = kl.ref[i]
		}
		in, pst := partInput(cfg, loss, part, partProx, partRef, kl.meanOrZero())
		if pst.tokens == 0 {
			continue // nothing to learn in prompt-only samples
		}
		fb, err := c.ForwardBackwardAsync(ctx, model, in, seq())
		if err != nil {
			return st, err
		}
		opt, err := c.OptimStepAsync(ctx, model, adam, seq())
		if err != nil {
			return st, err
		}
		queue = append(queue, inflight{fb, opt, pst})
		queued++
		if len(queue) > pipelineDepth {
			if err := collect(); err != nil {
				return st, err
			}
		}
	}
	if queued > 0 && cfg.Queued != nil {
		if err := cfg.Queued(ctx); err != nil {
			return st, err
		}
	}
	for len(queue) > 0 {
		if err := collect(); err != nil {
			return st, err
		}
	}
	if st.Updates == 0 {
		return st, ErrNothingToTrain
	}
	st.GradNorm /= float64(st.Updates)
	return st, nil
}

// lossConfig is the off-policy rule's settings: the cap and the masks.
func lossConfig(cfg Config) (trainer.LossConfig, error) {
	masks := trainer.Masks{}
	if m := cfg.Masks; m != nil {
		masks = trainer.Masks{IcePop: m.IcePop, IcePopLow: m.IcePopLow, IcePopHigh: m.IcePopHigh, KPop: m.KPop, KPopPhi: m.KPopPhi}
	}
	loss, err := masks.Apply(trainer.LossConfig{BehaviourWeightCap: cfg.Trainer.BehaviourWeightCap})
	if err != nil {
		return loss, fmt.Errorf("masks: %w", err)
	}
	return loss, nil
}

// klPenalty is a step's reference log-probs, ref[part][sample][t], and
// the batch's mean behaviour log-prob less the reference's.
type klPenalty struct {
	ref  [][][]float64
	mean float64
}

func (k *klPenalty) meanOrZero() float64 {
	if k == nil {
		return 0
	}
	return k.mean
}

// reference takes the reference model's log-probs of every part, one
// forward request a part, all queued before any is read, and their mean
// difference from the behaviour's over the trained tokens.
func reference(ctx context.Context, c *tinker.Client, parts [][]trainer.Sample, cfg Config) (*klPenalty, error) {
	if cfg.Reference == "" || cfg.ReferenceSeq == nil {
		return nil, errors.New("kl_coef > 0 needs a reference model")
	}
	pass, err := forwardParts(ctx, c, cfg.Reference, parts, cfg.ReferenceSeq)
	if err != nil {
		return nil, fmt.Errorf("reference forward: %w", err)
	}
	k := &klPenalty{ref: make([][][]float64, len(parts))}
	var sum float64
	var n int
	for i, part := range parts {
		if k.ref[i], err = pass.part(ctx, i); err != nil {
			return nil, fmt.Errorf("reference forward: %w", err)
		}
		for j, smp := range part {
			for t := 1; t < len(smp.TokenIDs); t++ {
				if smp.LossMask[t] != 0 {
					sum += float64(smp.Logprobs[t]) - k.ref[i][j][t]
					n++
				}
			}
		}
	}
	if n > 0 {
		k.mean = sum / float64(n)
	}
	return k, nil
}

// partsPass is a forward pass over a step's parts in two requests: the
// first part alone, whose result comes back soonest so that its update is
// built and queued while the service computes the rest, and the others
// in one request (a request costs the service fixed work beyond its
// tokens: six requests a step took 5 ms more than one on the demo's
// policy).
type partsPass struct {
	parts [][]trainer.Sample
	reqs  []tinker.Pending[tinker.ForwardBackwardOutput]
	// got[i] is part i's log-probs once its request is read.
	got [][][]float64
}

// forwardParts queues the pass's requests on model.
func forwardParts(ctx context.Context, c *tinker.Client, model string, parts [][]trainer.Sample, seq func() int64) (*partsPass, error) {
	p := &partsPass{parts: parts, got: make([][][]float64, len(parts))}
	if len(parts) == 0 {
		return p, nil
	}
	for _, span := range [][]trainer.Sample{slices.Concat(parts[:1]...), slices.Concat(parts[1:]...)} {
		if len(span) == 0 {
			continue
		}
		r, err := c.ForwardAsync(ctx, model, proximalInput(span), seq())
		if err != nil {
			return nil, err
		}
		p.reqs = append(p.reqs, r)
	}
	return p, nil
}

// part is part i's log-probs, prox[sample][t] (0 where t = 0), read from
// its request on first use.
func (p *partsPass) part(ctx context.Context, i int) ([][]float64, error) {
	if p.got[i] != nil {
		return p.got[i], nil
	}
	lo, hi, r := 0, 1, 0
	if i > 0 {
		lo, hi, r = 1, len(p.parts), 1
	}
	out, err := p.reqs[r].Await(ctx)
	if err != nil {
		return nil, err
	}
	for k := lo; k < hi; k++ {
		n := len(p.parts[k])
		one := tinker.ForwardBackwardOutput{LossFnOutputs: out.LossFnOutputs[:n]}
		out.LossFnOutputs = out.LossFnOutputs[n:]
		if p.got[k], err = proximal(p.parts[k], one); err != nil {
			return nil, err
		}
	}
	return p.got[i], nil
}

// proximalInput is the forward pass that gives the model's log-prob of
// every sequence's tokens.
func proximalInput(samples []trainer.Sample) tinker.ForwardBackwardInput {
	data := make([]tinker.Datum, len(samples))
	for i, smp := range samples {
		w := make([]float64, len(smp.TokenIDs)-1)
		for t := 1; t < len(smp.TokenIDs); t++ {
			w[t-1] = float64(smp.LossMask[t])
		}
		data[i] = SequenceDatum(smp.TokenIDs, w, nil, nil)
	}
	return tinker.ForwardBackwardInput{Data: data, LossFn: tinker.LossCrossEntropy}
}

// proximal reads proximalInput's result: prox[i][t] is samples[i]'s
// position t (0 where t = 0).
func proximal(samples []trainer.Sample, out tinker.ForwardBackwardOutput) ([][]float64, error) {
	prox := make([][]float64, len(samples))
	for i, smp := range samples {
		lp := out.LossFnOutputs[i][tinker.OutputLogprobs].Data
		if len(lp) != len(smp.TokenIDs)-1 {
			return nil, &tinker.APIError{Op: tinker.PathForward, Detail: fmt.Sprintf("datum %d: %d logprobs for %d targets", i, len(lp), len(smp.TokenIDs)-1), Retryable: true}
		}
		prox[i] = append([]float64{0}, lp...)
	}
	return prox, nil
}

// partStats counts a minibatch's trained and masked tokens.
type partStats struct{ tokens, icePop, kPop int }

// partInput is one minibatch's forward_backward: every sample's datum,
// weighted 1/N on its N trained tokens (the token mean the built-in
// trainer takes), with the loss's inputs per token. prox, when not
// empty, holds the part's proximal log-probs; ref, when not empty, the
// reference's, with klMean the batch's mean behaviour log-prob less the
// reference's: a token's advantage gains KLCoef·(klMean − d), d its own.
func partInput(cfg Config, loss trainer.LossConfig, part []trainer.Sample, prox, ref [][]float64, klMean float64) (tinker.ForwardBackwardInput, partStats) {
	var pst partStats
	for _, smp := range part {
		for _, m := range smp.LossMask {
			pst.tokens += int(m)
		}
	}
	in := tinker.ForwardBackwardInput{Data: make([]tinker.Datum, len(part))}
	ppo := cfg.Trainer.Loss == deployment.LossPPO
	switch {
	case cfg.SFT:
		in.LossFn = tinker.LossCrossEntropy
	case ppo:
		in.LossFn = tinker.LossPPO
		in.LossFnConfig = map[string]float64{tinker.ClipLow: 1 - cfg.Trainer.ClipLow, tinker.ClipHigh: 1 + cfg.Trainer.ClipHigh}
	default:
		in.LossFn = tinker.LossImportanceSampling
	}
	inv := 0.0
	if pst.tokens > 0 {
		inv = 1 / float64(pst.tokens)
	}
	for j, smp := range part {
		n := len(smp.TokenIDs) - 1
		w := make([]float64, n)
		var lp, adv []float64
		if !cfg.SFT {
			lp, adv = make([]float64, n), make([]float64, n)
		}
		for t := 1; t <= n; t++ {
			if smp.LossMask[t] == 0 {
				continue
			}
			w[t-1] = inv
			if cfg.SFT {
				continue
			}
			behav := float64(smp.Logprobs[t])
			a := *smp.Advantage
			if len(ref) > 0 {
				a += cfg.Trainer.KLCoef * (klMean - (behav - ref[j][t]))
			}
			lp[t-1] = behav
			if len(prox) > 0 {
				p := prox[j][t]
				weight, masked := loss.OffPolicy(p, behav)
				if masked.IcePop {
					pst.icePop++
				}
				if masked.KPop {
					pst.kPop++
				}
				if ppo {
					// The ratio is taken against the proximal policy and
					// the behaviour weight is a constant: it folds into
					// the advantage.
					lp[t-1], a = p, a*weight
				} else if masked.IcePop || masked.KPop {
					a = 0
				}
			}
			adv[t-1] = a
		}
		in.Data[j] = SequenceDatum(smp.TokenIDs, w, lp, adv)
	}
	return in, pst
}

// SequenceDatum is the datum of a whole sequence: position i of the input
// predicts tokens[i+1]; the per-target inputs are nil where unused.
func SequenceDatum(tokens []int, weights, logprobs, advantages []float64) tinker.Datum {
	d := tinker.Datum{ModelInput: tinker.Text(tokens[:len(tokens)-1]), LossFnInputs: map[string]tinker.TensorData{
		tinker.InputTargetTokens: tinker.Ints(tokens[1:]),
		tinker.InputWeights:      tinker.Floats(weights),
	}}
	if logprobs != nil {
		d.LossFnInputs[tinker.InputLogprobs] = tinker.Floats(logprobs)
	}
	if advantages != nil {
		d.LossFnInputs[tinker.InputAdvantages] = tinker.Floats(advantages)
	}
	return d
}
