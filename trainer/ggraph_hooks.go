package trainer

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Hooks for trainer/ggraph, the gorgonia training path of the same policy.
// They expose the parameter layout, the packed inputs, the hand-written
// passes (as the reference the graph is checked against) and the loss
// pieces, without copying any of them.

// ParamSpec names one tensor inside the flat parameter vector Model.W.
type ParamSpec struct {
	Name   string
	Shape  []int
	Offset int
	Size   int
}

// ParamSpecs lists the tensors of m in layout order.
func (m *Model) ParamSpecs() []ParamSpec {
	out := make([]ParamSpec, len(m.lay.Specs))
	for i, s := range m.lay.Specs {
		out[i] = ParamSpec{Name: s.Name, Shape: append([]int(nil), s.Shape...), Offset: s.Offset, Size: s.Size}
	}
	return out
}

// RMSNormEps is the epsilon inside every RMS norm of the policy.
const RMSNormEps = rmsEps

// AncestorMask returns the N×N row-major matrix whose entry (i, j) is true
// when node j is node i or one of its ancestors: the packed attention
// pattern over all nodes, across trees.
func (p *Pack) AncestorMask() []bool {
	n := p.NumNodes()
	out := make([]bool, n*n)
	for _, t := range p.Trees {
		for i := 0; i < t.N; i++ {
			copy(out[(t.Start+i)*n+t.Start:(t.Start+i)*n+t.Start+t.N], t.Anc[i*t.N:i*t.N+t.N])
		}
	}
	return out
}

// ReferenceTargetLogp runs the hand-written forward pass: log π of each
// target node's token given its ancestors, at temperature temp.
func (m *Model) ReferenceTargetLogp(pk *Pack, targets []int, temp float32) []float32 {
	return m.forward(pk, targets, temp).TargetLogp
}

// ReferenceGrad runs the hand-written forward and backward passes and
// returns the gradient (laid out like W) of Σ_i dLogp[i]·log π(target_i).
func (m *Model) ReferenceGrad(pk *Pack, targets []int, temp float32, dLogp []float32) []float32 {
	g := make([]float32, len(m.W))
	m.forward(pk, targets, temp).backward(dLogp, g)
	return g
}

// ParallelSgemm is the SGEMM the hand-written passes use (OpenBLAS under
// cgo, else gonum), split across the SetParallelism workers; row-major,
// same arguments as gonum's blas.Float32.Sgemm.
func ParallelSgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	psgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

// BenchBatch is the benchmark's batch: groups×size GRPO samples of n tokens
// whose first shared tokens are common within a group.
func BenchBatch(rng *rand.Rand, groups, size, n, shared int) *Batch {
	return benchBatch(rng, groups, size, n, shared)
}

// Resolve applies the documented defaults and validates.
func (c LossConfig) Resolve() (LossConfig, error) {
	c = c.withDefaults()
	return c, c.validate()
}

// Resolve applies the documented defaults and validates.
func (c Config) Resolve() (Config, error) {
	c = c.withDefaults()
	return c, c.validate()
}

// PPOTokenIn and PPOTokenOut are the per-token loss's input and output.
type (
	PPOTokenIn  = tokenIn
	PPOTokenOut = tokenOut
)

// PPOToken is the hand-written decoupled-PPO token loss and its derivative
// with respect to log π (defaults applied to c).
func PPOToken(c LossConfig, in PPOTokenIn) PPOTokenOut { return ppoToken(c.withDefaults(), in) }

// LossPlan is a batch reduced to what the network and the loss need: the
// pack, the unique target nodes, and every trained token occurrence (a
// target node shared by several samples occurs once per sample).
type LossPlan struct {
	Pack    *Pack
	Targets []int
	Occ     []TokenOcc
	// Temp is the temperature log π is taken at (0 in the batch means 1).
	Temp float32
	SFT  bool
}

// TokenOcc is one trained token of one sample.
type TokenOcc struct {
	Target    int // index into LossPlan.Targets
	LogpBehav float64
	Adv       float64
}

// PlanLoss builds the plan exactly as Local's step does: samples must be
// validated, stale ones dropped and advantages filled (unless sft).
func PlanLoss(samples []Sample, temperature float64, sft, share bool) (*LossPlan, error) {
	seqs := make([][]int, len(samples))
	for i, s := range samples {
		seqs[i] = s.TokenIDs
	}
	pk, err := BuildPack(seqs, share)
	if err != nil {
		return nil, err
	}
	p := &LossPlan{Pack: pk, Temp: float32(temperature), SFT: sft}
	if p.Temp == 0 {
		p.Temp = 1 // greedy samples report log-probs at T = 1
	}
	targetOf := make([]int, pk.NumNodes())
	for i := range targetOf {
		targetOf[i] = -1
	}
	for s, smp := range samples {
		if !sft && smp.Advantage == nil {
			return nil, fmt.Errorf("sample %d has no advantage", s)
		}
		for t, mk := range smp.LossMask {
			if mk == 0 {
				continue
			}
			n := pk.SampleNodes[s][t]
			if targetOf[n] < 0 {
				targetOf[n] = len(p.Targets)
				p.Targets = append(p.Targets, n)
			}
			o := TokenOcc{Target: targetOf[n]}
			if !sft {
				o.LogpBehav, o.Adv = float64(smp.Logprobs[t]), *smp.Advantage
			}
			p.Occ = append(p.Occ, o)
		}
	}
	if len(p.Occ) == 0 {
		return nil, errors.New("no token has loss_mask 1")
	}
	return p, nil
}

// ReferenceLoss is the hand-written step's loss and gradient for plan, with
// the proximal log-probs prox (nil: the current weights, as Local uses) and
// the reference log-probs ref (nil: no KL term) per target.
func (m *Model) ReferenceLoss(c LossConfig, p *LossPlan, prox, ref []float32) (float64, []float32) {
	c = c.withDefaults()
	st := m.forward(p.Pack, p.Targets, p.Temp)
	dLogp := make([]float32, len(p.Targets))
	inv := 1 / float64(len(p.Occ))
	var loss float64
	for _, o := range p.Occ {
		logp := float64(st.TargetLogp[o.Target])
		if p.SFT {
			loss -= logp * inv
			dLogp[o.Target] -= float32(inv)
			continue
		}
		in := tokenIn{Logp: logp, LogpProx: logp, LogpBehav: o.LogpBehav, Adv: o.Adv}
		if prox != nil {
			in.LogpProx = float64(prox[o.Target])
		}
		if ref != nil {
			in.LogpRef = float64(ref[o.Target])
		}
		out := ppoToken(c, in)
		loss += out.Loss * inv
		dLogp[o.Target] += float32(out.DLogp * inv)
	}
	g := make([]float32, len(m.W))
	st.backward(dLogp, g)
	return loss, g
}

// Optimizer is the AdamW of Local with its global-norm clipping.
type Optimizer struct {
	a    *adamW
	clip float64
}

// NewOptimizer returns AdamW for m's layout (defaults applied to cfg).
func NewOptimizer(cfg OptimConfig, m *Model) (*Optimizer, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("optimizer config: %w", err)
	}
	return &Optimizer{a: newAdamW(cfg, m.lay), clip: cfg.ClipNorm}, nil
}

// Step clips grad in place, applies one update to w at scale times the
// scheduled rate (Config.LRScale) and returns the norm before clipping and
// the learning rate; a non-finite norm leaves w alone.
func (o *Optimizer) Step(w, grad []float32, scale float64) (norm, lr float64, err error) {
	norm = clipGrad(grad, o.clip)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return norm, 0, fmt.Errorf("gradient norm is %v; weights left unchanged", norm)
	}
	return norm, o.a.update(w, grad, scale), nil
}

// Validate checks b as Local's step does, for a model of this vocabulary
// and context.
func (b *Batch) Validate(vocab, context int) error { return b.validate(vocab, context) }

// OldestVersion is the oldest policy version among s's trained tokens.
func (s *Sample) OldestVersion() (int64, bool) { return s.oldestVersion() }
