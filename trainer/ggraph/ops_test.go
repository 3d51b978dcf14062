package ggraph

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// checkFD compares the symbolic gradient of Σ y⊙W (W fixed) for a small
// subgraph y = f(xs) with central finite differences in float32.
func checkFD(t *testing.T, name string, shapes [][]int, f func(b *builder, xs []*G.Node) *G.Node) {
	rng := rand.New(rand.NewPCG(1, 2))
	var data [][]float32
	for _, s := range shapes {
		n := 1
		for _, d := range s {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		data = append(data, v)
	}
	eval := func(withGrad bool) (float64, [][]float32) {
		g := G.NewGraph()
		var xs []*G.Node
		for i, s := range shapes {
			xs = append(xs, G.NewTensor(g, tensor.Float32, len(s), G.WithShape(s...), G.WithName(fmt.Sprint("x", i)),
				G.WithValue(tensor.New(tensor.WithShape(s...), tensor.WithBacking(data[i])))))
		}
		b := &builder{}
		y := f(b, xs)
		// weighted sum with fixed weights
		w := make([]float32, y.Shape().TotalSize())
		for i := range w {
			w[i] = float32(math.Sin(float64(i) + 1))
		}
		wn := G.NewTensor(g, tensor.Float32, y.Dims(), G.WithShape(y.Shape()...), G.WithValue(tensor.New(tensor.WithShape(y.Shape()...), tensor.WithBacking(w))))
		loss := b.sum(b.hadamard(y, wn))
		if b.err != nil {
			require.NoError(t, b.err)
		}
		var grads G.Nodes
		if withGrad {
			var err error
			grads, err = G.Grad(loss, xs...)
			if err != nil {
				require.NoError(t, err)
			}
		}
		vm := G.NewTapeMachine(g)
		if err := vm.RunAll(); err != nil {
			require.NoError(t, err)
		}
		var gs [][]float32
		for _, gn := range grads {
			gs = append(gs, append([]float32(nil), gn.Value().Data().([]float32)...))
		}
		return float64(loss.Value().Data().(float32)), gs
	}
	_, gs := eval(true)
	var md float64
	for i := range data {
		for j := range data[i] {
			o := data[i][j]
			data[i][j] = o + 1e-2
			up, _ := eval(false)
			data[i][j] = o - 1e-2
			dn, _ := eval(false)
			data[i][j] = o
			num := (up - dn) / 2e-2
			md = math.Max(md, math.Abs(num-float64(gs[i][j])))
		}
	}
	require.Less(t, md, 2e-3, "%s: largest gradient error", name)
}

// TestBuildingBlocksAgainstFiniteDifferences checks every operation the
// policy graph is made of. It caught two gorgonia v0.9.18 defects the graph
// now avoids: InverseSqrt's derivative and ByIndices' backward on vectors.
func TestBuildingBlocksAgainstFiniteDifferences(t *testing.T) {
	idx := []int{1, 1, 3}
	checkFD(t, "gather_rows", [][]int{{5, 3}}, func(b *builder, xs []*G.Node) *G.Node { return b.gather("g", xs[0], &idx, 3) })
	checkFD(t, "gather_vector", [][]int{{5}}, func(b *builder, xs []*G.Node) *G.Node { return b.gather("g", xs[0], &idx, 3) })
	checkFD(t, "rmsnorm", [][]int{{3, 4}, {4}}, func(b *builder, xs []*G.Node) *G.Node { return b.rmsNorm(xs[0], xs[1]) })
	checkFD(t, "gelu", [][]int{{3, 4}}, func(b *builder, xs []*G.Node) *G.Node { return b.gelu(xs[0]) })
	checkFD(t, "mul", [][]int{{3, 4}, {4, 5}}, func(b *builder, xs []*G.Node) *G.Node { return b.mul(xs[0], xs[1]) })
	checkFD(t, "softmax3", [][]int{{2, 3, 3}}, func(b *builder, xs []*G.Node) *G.Node { return b.softmax(xs[0], 2) })
	checkFD(t, "logsoftmax", [][]int{{2, 5}}, func(b *builder, xs []*G.Node) *G.Node { return b.logSoftmax(xs[0], 1) })
	checkFD(t, "bmmT", [][]int{{2, 3, 4}, {2, 3, 4}}, func(b *builder, xs []*G.Node) *G.Node { return b.batched(xs[0], xs[1], false, true) })
	checkFD(t, "bmm", [][]int{{2, 3, 3}, {2, 3, 4}}, func(b *builder, xs []*G.Node) *G.Node { return b.batched(xs[0], xs[1], false, false) })
	checkFD(t, "transpose", [][]int{{3, 6, 2}}, func(b *builder, xs []*G.Node) *G.Node { return b.transpose(xs[0], 1, 0, 2) })
	checkFD(t, "slice", [][]int{{6, 3, 2}}, func(b *builder, xs []*G.Node) *G.Node { return b.slice(xs[0], G.S(2, 4)) })
	checkFD(t, "transpose4", [][]int{{2, 3, 6, 2}}, func(b *builder, xs []*G.Node) *G.Node { return b.transpose(xs[0], 2, 0, 1, 3) })
	pad := []int{2, -1, 0, 1, -1}
	checkFD(t, "gather_pad", [][]int{{3, 2}}, func(b *builder, xs []*G.Node) *G.Node { return b.gather("p", xs[0], &pad, 5) })
}
