package ggraph

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// constFn is a gorgonia op whose output is a function of its input's value
// but carries no gradient: the graph's stop-gradient. The decoupled-PPO loss
// needs it because the proximal policy of a step is the current weights
// themselves, yet π_prox, the behaviour weight and the IcePop/KPop masks
// computed from it are constants of the loss.
type constFn struct {
	name string
	fn   func(in, out []float32)
}

func (op *constFn) Arity() int { return 1 }

func (op *constFn) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *constFn) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	s, ok := in[0].(tensor.Shape)
	if !ok {
		return nil, fmt.Errorf("%s: input shape is %T", op.name, in[0])
	}
	return s.Clone(), nil
}

func (op *constFn) Do(vals ...gorgonia.Value) (gorgonia.Value, error) {
	in, err := f32Input(op.name, vals)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(in))
	op.fn(in, out)
	return tensor.New(tensor.WithShape(vals[0].Shape().Clone()...), tensor.WithBacking(out)), nil
}

func (op *constFn) ReturnsPtr() bool      { return false }
func (op *constFn) CallsExtern() bool     { return false }
func (op *constFn) OverwritesInput() int  { return -1 }
func (op *constFn) WriteHash(h hash.Hash) { fmt.Fprintf(h, "constFn{%s}", op.name) }
func (op *constFn) String() string        { return "constFn{" + op.name + "}" }

func (op *constFn) Hashcode() uint32 { return hashOf(op) }

// DiffWRT says the input gets no gradient through this op, so symbolic
// differentiation never asks for SymDiff.
func (op *constFn) DiffWRT(int) []bool { return []bool{false} }

func (op *constFn) SymDiff(gorgonia.Nodes, *gorgonia.Node, *gorgonia.Node) (gorgonia.Nodes, error) {
	return nil, fmt.Errorf("%s is not differentiable", op.name)
}

// gatherOp selects rows of a matrix (or elements of a vector) by index:
// embedding lookups, the logits rows and the target log-probs. gorgonia's
// ByIndices has the same forward, but its backward (tensor v0.9.24
// SelectByIndicesB) scatters rows to the wrong offsets, so the graph uses
// this op, whose backward is a scatter-add that sums repeated indices.
// The indices change per batch; the op reads them through idx. Index −1
// selects a row of zeros (padding).
type gatherOp struct {
	name string
	idx  *[]int
	n    int          // number of indices the graph was built for
	in   tensor.Shape // input shape
}

func (op *gatherOp) width() int {
	w := 1
	for _, d := range op.in[1:] {
		w *= d
	}
	return w
}

func (op *gatherOp) Arity() int { return 1 }

func (op *gatherOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *gatherOp) InferShape(in ...gorgonia.DimSizer) (tensor.Shape, error) {
	out := op.in.Clone()
	out[0] = op.n
	return out, nil
}

func (op *gatherOp) Do(vals ...gorgonia.Value) (gorgonia.Value, error) {
	in, err := f32Input(op.name, vals)
	if err != nil {
		return nil, err
	}
	idx := *op.idx
	if len(idx) != op.n {
		return nil, fmt.Errorf("%s: %d indices, graph built for %d", op.name, len(idx), op.n)
	}
	w := op.width()
	out := make([]float32, op.n*w)
	for i, r := range idx {
		if r == -1 {
			continue
		}
		if r < 0 || r >= op.in[0] {
			return nil, fmt.Errorf("%s: index %d outside [0, %d)", op.name, r, op.in[0])
		}
		copy(out[i*w:i*w+w], in[r*w:r*w+w])
	}
	shp, _ := op.InferShape()
	return tensor.New(tensor.WithShape(shp...), tensor.WithBacking(out)), nil
}

func (op *gatherOp) ReturnsPtr() bool      { return false }
func (op *gatherOp) CallsExtern() bool     { return false }
func (op *gatherOp) OverwritesInput() int  { return -1 }
func (op *gatherOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "gather{%s}", op.name) }
func (op *gatherOp) String() string        { return "gather{" + op.name + "}" }
func (op *gatherOp) Hashcode() uint32      { return hashOf(op) }
func (op *gatherOp) DiffWRT(int) []bool    { return []bool{true} }

func (op *gatherOp) SymDiff(_ gorgonia.Nodes, _ *gorgonia.Node, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	d, err := gorgonia.ApplyOp(&scatterAddOp{g: op}, grad)
	if err != nil {
		return nil, err
	}
	return gorgonia.Nodes{d}, nil
}

// scatterAddOp is gatherOp's backward: zeros of the input's shape with each
// output row's gradient added at its index.
type scatterAddOp struct{ g *gatherOp }

func (op *scatterAddOp) Arity() int { return 1 }

func (op *scatterAddOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *scatterAddOp) InferShape(...gorgonia.DimSizer) (tensor.Shape, error) {
	return op.g.in.Clone(), nil
}

func (op *scatterAddOp) Do(vals ...gorgonia.Value) (gorgonia.Value, error) {
	grad, err := f32Input(op.String(), vals)
	if err != nil {
		return nil, err
	}
	w := op.g.width()
	out := make([]float32, op.g.in.TotalSize())
	for i, r := range *op.g.idx {
		if r < 0 {
			continue
		}
		dst, src := out[r*w:r*w+w], grad[i*w:i*w+w]
		for j, v := range src {
			dst[j] += v
		}
	}
	return tensor.New(tensor.WithShape(op.g.in.Clone()...), tensor.WithBacking(out)), nil
}

func (op *scatterAddOp) ReturnsPtr() bool      { return false }
func (op *scatterAddOp) CallsExtern() bool     { return false }
func (op *scatterAddOp) OverwritesInput() int  { return -1 }
func (op *scatterAddOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "scatter_add{%s}", op.g.name) }
func (op *scatterAddOp) String() string        { return "scatter_add{" + op.g.name + "}" }
func (op *scatterAddOp) Hashcode() uint32      { return hashOf(op) }

func hashOf(op interface{ WriteHash(hash.Hash) }) uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}

func f32Input(name string, vals []gorgonia.Value) ([]float32, error) {
	if len(vals) != 1 {
		return nil, fmt.Errorf("%s: %d inputs, want 1", name, len(vals))
	}
	t, ok := vals[0].(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%s: input is %T, want *tensor.Dense", name, vals[0])
	}
	if t.IsView() {
		m, ok := t.Materialize().(*tensor.Dense)
		if !ok {
			return nil, fmt.Errorf("%s: cannot materialize the input view", name)
		}
		t = m
	}
	in, ok := t.Data().([]float32)
	if !ok {
		return nil, fmt.Errorf("%s: input dtype %v, want float32", name, t.Dtype())
	}
	return in, nil
}
