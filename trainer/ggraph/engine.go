package ggraph

import (
	"errors"
	"fmt"
	"math"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/flywheel-ai/flywheel/trainer"
)

// DefaultMaxGraphs bounds the graph cache of an Engine.
const DefaultMaxGraphs = 8

// Engine runs the policy m through gorgonia graphs. Graphs are built per
// batch shape (nodes, logits rows, targets, trained tokens, loss kind) and
// cached; their weight nodes share m.W, so the caller may update m.W in
// place between calls (an optimizer step) without rebuilding. An Engine is
// not safe for concurrent use.
type Engine struct {
	m      *trainer.Model
	loss   trainer.LossConfig
	graphs map[shape]*graph
	order  []shape // insertion order, for eviction
	// Built counts graph builds (cache misses) and BuildTime sums their
	// duration.
	Built     int
	BuildTime time.Duration
}

// New returns an Engine for m with the loss configuration lc (defaults
// applied and validated as trainer.Local does).
func New(m *trainer.Model, lc trainer.LossConfig) (*Engine, error) {
	if m == nil {
		return nil, errors.New("ggraph: nil model")
	}
	lc, err := lc.Resolve()
	if err != nil {
		return nil, fmt.Errorf("ggraph: loss config: %w", err)
	}
	useFastBLAS()
	return &Engine{m: m, loss: lc, graphs: map[shape]*graph{}}, nil
}

// Close releases the cached graphs' machines.
func (e *Engine) Close() error {
	var errs []error
	for _, g := range e.graphs {
		errs = append(errs, g.vm.Close())
	}
	e.graphs, e.order = map[shape]*graph{}, nil
	return errors.Join(errs...)
}

func (e *Engine) graphFor(sh shape) (*graph, error) {
	if g, ok := e.graphs[sh]; ok {
		return g, nil
	}
	start := time.Now()
	g, err := build(e.m, e.loss, sh)
	if err != nil {
		return nil, err
	}
	e.Built++
	e.BuildTime += time.Since(start)
	if len(e.order) >= DefaultMaxGraphs {
		old := e.order[0]
		e.order = e.order[1:]
		_ = e.graphs[old].vm.Close()
		delete(e.graphs, old)
	}
	e.graphs[sh] = g
	e.order = append(e.order, sh)
	return g, nil
}

// packInputs are a pack's values for a graph's input nodes.
type packInputs struct {
	tok, pos, rows, flat []int
	pad, unpad           []int
	blocks, blockLen     int
	mask                 []float32 // one block mask, L×L per block
}

func (e *Engine) packInputs(pk *trainer.Pack, targets []int) (packInputs, error) {
	c := e.m.Config
	N := pk.NumNodes()
	if N == 0 {
		return packInputs{}, errors.New("ggraph: empty pack")
	}
	if len(targets) == 0 {
		return packInputs{}, errors.New("ggraph: no targets")
	}
	in := packInputs{tok: pk.Tokens, pos: pk.Pos}
	for i, t := range pk.Tokens {
		if t < 0 || t >= c.Vocab {
			return packInputs{}, fmt.Errorf("ggraph: node %d: token %d outside the vocabulary of %d", i, t, c.Vocab)
		}
		if pk.Pos[i] >= c.Context {
			return packInputs{}, fmt.Errorf("ggraph: node %d: position %d beyond the context of %d", i, pk.Pos[i], c.Context)
		}
	}
	// Logits rows, in the order the hand-written forward makes them.
	rowOf := make([]int, N)
	for i := range rowOf {
		rowOf[i] = -1
	}
	for _, tn := range targets {
		if tn < 0 || tn >= N || pk.Parent[tn] < 0 {
			return packInputs{}, fmt.Errorf("ggraph: target node %d has no parent to predict it", tn)
		}
		if p := pk.Parent[tn]; rowOf[p] < 0 {
			rowOf[p] = len(in.rows)
			in.rows = append(in.rows, p)
		}
	}
	in.flat = make([]int, len(targets))
	for i, tn := range targets {
		in.flat[i] = rowOf[pk.Parent[tn]]*c.Vocab + pk.Tokens[tn]
	}
	in.layout(pk)
	return in, nil
}

func letF32(n *G.Node, v []float32, shape ...int) error {
	if len(shape) == 0 {
		shape = []int{len(v)}
	}
	return G.Let(n, tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v)))
}

// layout places the nodes in attention blocks: one per tree, padded to the
// largest, when that costs less attention than the whole pack as one
// sequence (NB·L² < N²), else one block of all N nodes under the forest's
// ancestor mask. Either way a query sees exactly its ancestors and itself.
func (in *packInputs) layout(pk *trainer.Pack) {
	N := pk.NumNodes()
	L := 0
	for _, t := range pk.Trees {
		L = max(L, t.N)
	}
	NB := len(pk.Trees)
	ninf := float32(math.Inf(-1))
	in.unpad = make([]int, N)
	if NB > 1 && float64(NB)*float64(L)*float64(L) < float64(N)*float64(N) {
		in.blocks, in.blockLen = NB, L
		in.pad = make([]int, NB*L)
		in.mask = make([]float32, NB*L*L)
		for bi, t := range pk.Trees {
			for i := 0; i < L; i++ {
				row := in.mask[(bi*L+i)*L : (bi*L+i+1)*L]
				if i >= t.N {
					// A padding query attends to itself only, which keeps its
					// softmax finite; its output is dropped.
					in.pad[bi*L+i] = -1
					for j := range row {
						row[j] = ninf
					}
					row[i] = 0
					continue
				}
				in.pad[bi*L+i] = t.Start + i
				in.unpad[t.Start+i] = bi*L + i
				for j := range row {
					if j >= t.N || !t.Anc[i*t.N+j] {
						row[j] = ninf
					}
				}
			}
		}
		return
	}
	in.blocks, in.blockLen = 1, N
	in.pad = make([]int, N)
	for i := range in.pad {
		in.pad[i], in.unpad[i] = i, i
	}
	anc := pk.AncestorMask()
	in.mask = make([]float32, N*N)
	for i, ok := range anc {
		if !ok {
			in.mask[i] = ninf
		}
	}
}

func (gr *graph) bindPack(in packInputs, temp float32) error {
	gr.tok, gr.pos, gr.rows, gr.flat = in.tok, in.pos, in.rows, in.flat
	gr.pad, gr.unpad = in.pad, in.unpad
	return errors.Join(
		letF32(gr.mask, in.mask, in.blocks, in.blockLen, in.blockLen),
		G.Let(gr.invT, 1/temp),
	)
}

func (gr *graph) run() error {
	defer gr.vm.Reset()
	if err := gr.vm.RunAll(); err != nil {
		return fmt.Errorf("ggraph: run: %w", err)
	}
	return nil
}

func f32s(n *G.Node) ([]float32, error) {
	v := n.Value()
	if v == nil {
		return nil, fmt.Errorf("ggraph: node %s has no value", n.Name())
	}
	switch d := v.Data().(type) {
	case []float32:
		return d, nil
	case float32:
		return []float32{d}, nil
	}
	{
		return nil, fmt.Errorf("ggraph: node %s holds %T, want float32", n.Name(), v.Data())
	}
}

// TargetLogp is log π(token of each target node | its ancestors) at
// temperature temp, computed by the graph (the same numbers as the
// hand-written forward).
func (e *Engine) TargetLogp(pk *trainer.Pack, targets []int, temp float32) ([]float32, error) {
	if !(temp > 0) || math.IsInf(float64(temp), 0) {
		return nil, fmt.Errorf("ggraph: temperature %v must be positive and finite", temp)
	}
	in, err := e.packInputs(pk, targets)
	if err != nil {
		return nil, err
	}
	gr, err := e.graphFor(shape{nodes: pk.NumNodes(), rows: len(in.rows), targets: len(targets), blocks: in.blocks, blockLen: in.blockLen})
	if err != nil {
		return nil, err
	}
	if err := gr.bindPack(in, temp); err != nil {
		return nil, fmt.Errorf("ggraph: bind inputs: %w", err)
	}
	if err := gr.run(); err != nil {
		return nil, err
	}
	lp, err := f32s(gr.targetLogp)
	if err != nil {
		return nil, err
	}
	return append([]float32(nil), lp...), nil
}

// LossAndGrad computes the step loss of plan p and its gradient with
// respect to the weights, laid out like Model.W (the hand-written path's
// layout): cross-entropy for SFT plans, else the decoupled-PPO loss of
// trainer.LossConfig with clipping, IcePop/KPop masks and the KL term.
// prox holds π_prox per target (nil: the current weights, as
// trainer.Local uses); ref holds the reference policy's log-probs per
// target and is required when the KL coefficient is positive.
func (e *Engine) LossAndGrad(p *trainer.LossPlan, prox, ref []float32) (float64, []float32, error) {
	r, err := e.Step(p, prox, ref)
	return r.Loss, r.Grad, err
}

// Result is one run of a loss graph.
type Result struct {
	Loss float64
	// Grad is laid out like Model.W.
	Grad []float32
	// TargetLogp is log π per plan target, as the graph computed it.
	TargetLogp []float32
}

// Step is LossAndGrad that also returns the target log-probs, from which
// the caller can count clipped and masked tokens.
func (e *Engine) Step(p *trainer.LossPlan, prox, ref []float32) (Result, error) {
	r, err := e.step(p, prox, ref)
	if err != nil {
		return Result{}, err
	}
	return r, nil
}

func (e *Engine) step(p *trainer.LossPlan, prox, ref []float32) (Result, error) {
	if p == nil || p.Pack == nil {
		return Result{}, errors.New("ggraph: nil loss plan")
	}
	if !(p.Temp > 0) {
		return Result{}, fmt.Errorf("ggraph: temperature %v must be positive", p.Temp)
	}
	T := len(p.Targets)
	kl := !p.SFT && e.loss.KLCoef > 0
	switch {
	case len(p.Occ) == 0:
		return Result{}, errors.New("ggraph: plan has no trained tokens")
	case prox != nil && len(prox) != T:
		return Result{}, fmt.Errorf("ggraph: %d proximal log-probs for %d targets", len(prox), T)
	case kl && len(ref) != T:
		return Result{}, fmt.Errorf("ggraph: KL needs %d reference log-probs, got %d", T, len(ref))
	}
	in, err := e.packInputs(p.Pack, p.Targets)
	if err != nil {
		return Result{}, err
	}
	sh := shape{nodes: p.Pack.NumNodes(), rows: len(in.rows), targets: T, occ: len(p.Occ), loss: lossGRPO, prox: prox != nil, kl: kl,
		blocks: in.blocks, blockLen: in.blockLen}
	if p.SFT {
		sh.loss, sh.prox = lossSFT, false
	}
	gr, err := e.graphFor(sh)
	if err != nil {
		return Result{}, err
	}
	if err := gr.bindPack(in, p.Temp); err != nil {
		return Result{}, fmt.Errorf("ggraph: bind inputs: %w", err)
	}
	occ := make([]int, len(p.Occ))
	for i, o := range p.Occ {
		if o.Target < 0 || o.Target >= T {
			return Result{}, fmt.Errorf("ggraph: trained token %d points at target %d of %d", i, o.Target, T)
		}
		occ[i] = o.Target
	}
	gr.occ = occ
	var errs []error
	if !p.SFT {
		behav, adv := make([]float32, len(p.Occ)), make([]float32, len(p.Occ))
		for i, o := range p.Occ {
			behav[i], adv[i] = float32(o.LogpBehav), float32(o.Adv)
		}
		gr.behavData = behav
		errs = append(errs, letF32(gr.behav, behav), letF32(gr.adv, adv))
		if sh.prox {
			errs = append(errs, letF32(gr.prox, perOcc(prox, occ)))
		}
		if kl {
			errs = append(errs, letF32(gr.ref, perOcc(ref, occ)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Result{}, fmt.Errorf("ggraph: bind loss inputs: %w", err)
	}
	if err := gr.run(); err != nil {
		return Result{}, err
	}
	lv, err := f32s(gr.loss)
	if err != nil {
		return Result{}, err
	}
	grad := make([]float32, len(e.m.W))
	for i, s := range e.m.ParamSpecs() {
		d, err := f32s(gr.grads[i])
		if err != nil {
			return Result{}, err
		}
		if len(d) != s.Size {
			return Result{}, fmt.Errorf("ggraph: gradient of %s has %d values, want %d", s.Name, len(d), s.Size)
		}
		copy(grad[s.Offset:s.Offset+s.Size], d)
	}
	tl, err := f32s(gr.targetLogp)
	if err != nil {
		return Result{}, err
	}
	return Result{Loss: float64(lv[0]), Grad: grad, TargetLogp: append([]float32(nil), tl...)}, nil
}

func perOcc(perTarget []float32, occ []int) []float32 {
	out := make([]float32, len(occ))
	for i, t := range occ {
		out[i] = perTarget[t]
	}
	return out
}
