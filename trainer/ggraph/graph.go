package ggraph

import (
	"errors"
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/flywheel-ai/flywheel/trainer"
)

// shape is what a graph is built for; batches of the same shape reuse it.
type shape struct {
	nodes, rows, targets, occ int
	// Attention runs over blocks×blockLen padded nodes: one block per tree
	// or, when padding would cost more, the whole pack as one block.
	blocks, blockLen int
	loss             lossKind
	prox, kl         bool // explicit proximal log-probs; KL term
}

type lossKind int

const (
	lossNone lossKind = iota // forward only
	lossSFT
	lossGRPO
)

// graph is one ExprGraph of the policy with its TapeMachine. Weight nodes
// are bound to tensors backed by Model.W, so weight updates are seen by the
// next run without copies; the per-batch inputs are rebound with Let.
type graph struct {
	sh shape
	g  *G.ExprGraph
	vm G.VM

	weights []*G.Node // in ParamSpecs order
	grads   G.Nodes   // d loss / d weights, same order

	// Indices of the gathers, set per batch.
	tok, pos, rows, flat, occ []int
	pad, unpad                []int // nodes ↔ padded attention blocks
	// Inputs.
	mask                  *G.Node // blocks×L×L additive: 0 or −Inf
	invT                  *G.Node // scalar 1/temperature
	behav, adv, prox, ref *G.Node // per occurrence

	targetLogp *G.Node // T
	loss       *G.Node // scalar (nil when forward only)

	// behavData is the current batch's behaviour log-probs, read by the
	// stop-gradient ops that form the PPO weight and the masks.
	behavData []float32
}

// build lays out the policy of trainer/forward.go as a graph: learned token
// and position embeddings, pre-norm blocks (RMS norm with gain, fused QKV
// projection, multi-head attention under the tree mask, output projection,
// RMS norm, GELU(tanh) MLP, residuals), final RMS norm, an untied output
// layer evaluated only on the rows that predict a target, log-softmax at
// temperature, and the log-prob of each target token.
func build(m *trainer.Model, lc trainer.LossConfig, sh shape) (*graph, error) {
	c := m.Config
	gr := &graph{sh: sh, g: G.NewGraph()}
	byName := gr.bindWeights(m)
	gr.mask = G.NewTensor(gr.g, tensor.Float32, 3, G.WithShape(sh.blocks, sh.blockLen, sh.blockLen), G.WithName("mask"))
	gr.invT = G.NewScalar(gr.g, tensor.Float32, G.WithName("invT"))

	b := &builder{}
	x := b.add(b.gather("tok", byName["tok_emb"], &gr.tok, sh.nodes), b.gather("pos", byName["pos_emb"], &gr.pos, sh.nodes))
	scale := G.NewConstant(float32(1 / math.Sqrt(float64(c.DModel/c.Heads))))
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("layers.%d.", l)
		x2 := gr.attention(b, c, byName, p, x, scale)
		x = gr.mlp(b, byName, p, x2)
	}
	gr.targetLogp = gr.output(b, byName, x, c.Vocab)
	if b.err != nil {
		return nil, fmt.Errorf("build graph: %w", b.err)
	}
	if sh.loss == lossNone {
		gr.vm = G.NewTapeMachine(gr.g)
		return gr, nil
	}

	lpo := b.gather("occurrences", gr.targetLogp, &gr.occ, sh.occ) // log π per trained occurrence
	invO := G.NewConstant(float32(1 / float64(sh.occ)))
	if sh.loss == lossSFT {
		gr.loss = b.hadamard(b.neg(b.sum(lpo)), invO)
	} else {
		gr.loss = b.hadamard(b.sum(gr.ppoTokens(b, lc, lpo)), invO)
	}
	if b.err != nil {
		return nil, fmt.Errorf("build loss: %w", b.err)
	}
	grads, err := G.Grad(gr.loss, gr.weights...)
	if err != nil {
		return nil, fmt.Errorf("symbolic gradient: %w", err)
	}
	gr.grads = grads
	gr.vm = G.NewTapeMachine(gr.g)
	return gr, nil
}

// bindWeights adds one node per tensor of m, in ParamSpecs order, whose
// value shares Model.W's memory, and returns them by name.
func (gr *graph) bindWeights(m *trainer.Model) map[string]*G.Node {
	byName := map[string]*G.Node{}
	for _, s := range m.ParamSpecs() {
		back := m.W[s.Offset : s.Offset+s.Size]
		val := tensor.New(tensor.WithShape(s.Shape...), tensor.WithBacking(back))
		var n *G.Node
		if len(s.Shape) == 1 {
			n = G.NewVector(gr.g, tensor.Float32, G.WithShape(s.Shape...), G.WithName(s.Name), G.WithValue(val))
		} else {
			n = G.NewMatrix(gr.g, tensor.Float32, G.WithShape(s.Shape...), G.WithName(s.Name), G.WithValue(val))
		}
		byName[s.Name] = n
		gr.weights = append(gr.weights, n)
	}
	return byName
}

// attention is x + attention(norm(x))·wo for the block whose weights are
// named with prefix p; scale is 1/√(head size).
//
// Attention runs per head, batched over blocks: the packed nodes are laid
// out as NB blocks of L (trees padded with zero rows, or the whole pack as
// one block), and the additive mask keeps each query on its ancestors.
// Heads take column slices of the fused QKV weight and row slices of the
// output projection, so no activation is transposed.
func (gr *graph) attention(b *builder, c trainer.ModelConfig, byName map[string]*G.Node, p string, x, scale *G.Node) *G.Node {
	N, D, H := gr.sh.nodes, c.DModel, c.Heads
	dh := D / H
	NB, L := gr.sh.blocks, gr.sh.blockLen
	h1 := b.rmsNorm(x, byName[p+"ln1"])
	hp := b.gather(p+"pad", h1, &gr.pad, NB*L) // NB·L×D
	wqkv, wo := byName[p+"wqkv"], byName[p+"wo"]
	var proj *G.Node
	for h := 0; h < H; h++ {
		col := func(part int) *G.Node {
			w := b.do(func() (*G.Node, error) { return G.Slice(wqkv, nil, G.S(part*D+h*dh, part*D+(h+1)*dh)) })
			return b.reshape(b.mul(hp, w), NB, L, dh)
		}
		q := b.hadamard(col(0), scale) // scale on q: fewer multiplies than on the scores
		k, v := col(1), col(2)
		s := b.add(b.batched(q, k, false, true), gr.mask) // NB×L×L
		o := b.batched(b.softmax(s, 2), v, false, false)  // NB×L×dh
		woH := b.do(func() (*G.Node, error) { return G.Slice(wo, G.S(h*dh, (h+1)*dh)) })
		ph := b.mul(b.reshape(o, NB*L, dh), woH) // NB·L×D
		if proj == nil {
			proj = ph
		} else {
			proj = b.add(proj, ph)
		}
	}
	return b.add(x, b.gather(p+"unpad", proj, &gr.unpad, N))
}

// mlp is x2 + gelu(norm(x2)·w1)·w2 for the block whose weights are named
// with prefix p.
func (gr *graph) mlp(b *builder, byName map[string]*G.Node, p string, x2 *G.Node) *G.Node {
	h2 := b.rmsNorm(x2, byName[p+"ln2"])
	u := b.mul(h2, byName[p+"w1"])
	return b.add(x2, b.mul(b.gelu(u), byName[p+"w2"]))
}

// output is the log-prob of each target token (T) from the last block's x:
// final norm, the output layer on the rows that predict a target only, and
// log-softmax at temperature.
func (gr *graph) output(b *builder, byName map[string]*G.Node, x *G.Node, V int) *G.Node {
	sh := gr.sh
	hf := b.rmsNorm(x, byName["ln_f"])
	hr := b.gather("rows", hf, &gr.rows, sh.rows)                                // R×D
	z := b.mul(b.hadamard(hr, gr.invT), byName["head"])                          // R×V
	logp := b.logSoftmax(z, 1)                                                   // R×V
	return b.gather("targets", b.reshape(logp, sh.rows*V), &gr.flat, sh.targets) // T
}

// ppoTokens is the decoupled-PPO loss of each trained occurrence, given its
// log π (lpo), with the behaviour weight, the IcePop and KPop masks and the
// KL term when the shape has one.
func (gr *graph) ppoTokens(b *builder, lc trainer.LossConfig, lpo *G.Node) *G.Node {
	g, sh, f32 := gr.g, gr.sh, tensor.Float32
	gr.behav = G.NewVector(g, f32, G.WithShape(sh.occ), G.WithName("behav"))
	gr.adv = G.NewVector(g, f32, G.WithShape(sh.occ), G.WithName("adv"))
	var prox *G.Node
	if sh.prox {
		gr.prox = G.NewVector(g, f32, G.WithShape(sh.occ), G.WithName("prox"))
		prox = gr.prox
	} else {
		// Local's step: π_prox is the current policy, as a constant.
		prox = b.apply(&constFn{name: "stop_gradient", fn: func(in, out []float32) { copy(out, in) }}, lpo)
	}
	lcfg := lc
	wcap := lcfg.BehaviourWeightCap
	keep := b.apply(&constFn{name: "keep", fn: func(in, out []float32) {
		for i, lp := range in {
			if _, m := lcfg.OffPolicy(float64(lp), float64(gr.behavData[i])); !m.IcePop && !m.KPop {
				out[i] = 1
			}
		}
	}}, prox)
	// w = min(π_prox/μ, cap), zero where masked.
	w := b.apply(&constFn{name: "behaviour_weight", fn: func(in, out []float32) {
		for i, lp := range in {
			out[i] = float32(math.Min(math.Exp(float64(lp)-float64(gr.behavData[i])), wcap))
		}
	}}, prox)
	w = b.hadamard(w, keep)
	filled := func(name string, v float64) *G.Node {
		vals := make([]float32, sh.occ)
		for i := range vals {
			vals[i] = float32(v)
		}
		return G.NewVector(g, f32, G.WithShape(sh.occ), G.WithName(name),
			G.WithValue(tensor.New(tensor.WithShape(sh.occ), tensor.WithBacking(vals))))
	}
	lo, hi := filled("clip_low", 1-lc.ClipLow), filled("clip_high", 1+lc.ClipHigh)
	r := b.exp(b.sub(lpo, prox))
	rc := b.minBetween(b.maxBetween(r, lo), hi)
	un, cl := b.hadamard(r, gr.adv), b.hadamard(rc, gr.adv)
	// −w·min(r·A, clip(r)·A); at a tie MinBetween sends the gradient to
	// its first argument, the unclipped branch, as ppoToken does.
	tok := b.neg(b.hadamard(w, b.minBetween(un, cl)))
	if sh.kl {
		tok = b.add(tok, b.hadamard(gr.klTerm(b, lc, lpo), keep))
	}
	return tok
}

// klTerm is KLCoef times the chosen estimator of the KL to the reference
// policy, per occurrence.
func (gr *graph) klTerm(b *builder, lc trainer.LossConfig, lpo *G.Node) *G.Node {
	gr.ref = G.NewVector(gr.g, tensor.Float32, G.WithShape(gr.sh.occ), G.WithName("ref"))
	lr := b.sub(lpo, gr.ref)
	var kl *G.Node
	switch lc.KLEstimator {
	case trainer.KLk1:
		kl = lr
	case trainer.KLk2:
		kl = b.hadamard(b.square(lr), G.NewConstant(float32(0.5)))
	default:
		kl = b.add(b.sub(b.exp(b.neg(lr)), G.NewConstant(float32(1))), lr)
	}
	return b.hadamard(kl, G.NewConstant(float32(lc.KLCoef)))
}

// builder threads the first error through a chain of graph operations so
// the layout above reads like the math.
type builder struct{ err error }

func (b *builder) do(f func() (*G.Node, error)) *G.Node {
	if b.err != nil {
		return nil
	}
	n, err := f()
	if err != nil {
		b.err = err
	}
	return n
}

func (b *builder) add(x, y *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Add(x, y) })
}
func (b *builder) sub(x, y *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Sub(x, y) })
}
func (b *builder) mul(x, y *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Mul(x, y) })
}
func (b *builder) hadamard(x, y *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.HadamardProd(x, y) })
}
func (b *builder) neg(x *G.Node) *G.Node { return b.do(func() (*G.Node, error) { return G.Neg(x) }) }
func (b *builder) exp(x *G.Node) *G.Node { return b.do(func() (*G.Node, error) { return G.Exp(x) }) }
func (b *builder) square(x *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Square(x) })
}
func (b *builder) sum(x *G.Node) *G.Node { return b.do(func() (*G.Node, error) { return G.Sum(x) }) }
func (b *builder) minBetween(x, y *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.MinBetween(x, y) })
}
func (b *builder) maxBetween(x, y *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.MaxBetween(x, y) })
}
func (b *builder) gather(name string, x *G.Node, idx *[]int, n int) *G.Node {
	return b.do(func() (*G.Node, error) {
		return G.ApplyOp(&gatherOp{name: name, idx: idx, n: n, in: x.Shape().Clone()}, x)
	})
}
func (b *builder) reshape(x *G.Node, to ...int) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Reshape(x, tensor.Shape(to)) })
}
func (b *builder) transpose(x *G.Node, axes ...int) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Transpose(x, axes...) })
}
func (b *builder) slice(x *G.Node, s tensor.Slice) *G.Node {
	return b.do(func() (*G.Node, error) { return G.Slice(x, s) })
}
func (b *builder) batched(x, y *G.Node, tx, ty bool) *G.Node {
	return b.do(func() (*G.Node, error) { return G.BatchedMatMul(x, y, tx, ty) })
}
func (b *builder) softmax(x *G.Node, axis int) *G.Node {
	return b.do(func() (*G.Node, error) { return G.SoftMax(x, axis) })
}
func (b *builder) logSoftmax(x *G.Node, axis int) *G.Node {
	return b.do(func() (*G.Node, error) { return G.LogSoftMax(x, axis) })
}
func (b *builder) apply(op G.Op, x *G.Node) *G.Node {
	return b.do(func() (*G.Node, error) { return G.ApplyOp(op, x) })
}

// rmsNorm is x / √(mean(x²) + ε) · gain, row-wise.
func (b *builder) rmsNorm(x, gain *G.Node) *G.Node {
	sq := b.square(x)
	ms := b.do(func() (*G.Node, error) { return G.Mean(sq, 1) })
	ms = b.add(ms, G.NewConstant(float32(trainer.RMSNormEps)))
	// 1/√ as two ops: InverseSqrt's symbolic derivative in gorgonia v0.9.18
	// is wrong (checked against finite differences in this package's tests).
	rms := b.do(func() (*G.Node, error) { return G.Sqrt(ms) })
	inv := b.do(func() (*G.Node, error) { return G.Inverse(rms) })
	y := b.do(func() (*G.Node, error) { return G.BroadcastHadamardProd(x, inv, nil, []byte{1}) })
	return b.do(func() (*G.Node, error) { return G.BroadcastHadamardProd(y, gain, nil, []byte{0}) })
}

// gelu is the tanh approximation, as trainer's geluT and gelu.
func (b *builder) gelu(u *G.Node) *G.Node {
	const c = 0.7978845608028654 // √(2/π)
	cube := b.do(func() (*G.Node, error) { return G.Cube(u) })
	inner := b.hadamard(b.add(u, b.hadamard(cube, G.NewConstant(float32(0.044715)))), G.NewConstant(float32(c)))
	t := b.do(func() (*G.Node, error) { return G.Tanh(inner) })
	return b.hadamard(b.hadamard(u, G.NewConstant(float32(0.5))), b.add(t, G.NewConstant(float32(1))))
}

var errShape = errors.New("batch does not match the graph's shape")
