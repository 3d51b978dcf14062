package trainer

import "math"

// layerCache keeps what the backward pass of one block needs.
type layerCache struct {
	x, inv1, h1, qkv []float32
	probs            [][]float32 // [segment*heads+head] L×P
	kpath, vpath     [][]float32 // [segment] P×D: keys and values it sees
	att, x2          []float32
	inv2, h2, u, g   []float32
	tg               []float32 // tanh inside GELU
}

// fwdState is one forward pass over a Pack: the log-probabilities of the
// target nodes and, when kept, every activation for backward.
type fwdState struct {
	m       *Model
	sc      *scratch // where its buffers come from
	w       modelW
	pk      *Pack
	invT    float32
	layers  []layerCache
	xf      []float32
	invF    []float32
	hf      []float32
	rows    []int // node whose logits are row r
	rowOf   []int // node → row, -1 if none
	logp    []float32
	targets []int
	// TargetLogp[i] is log π(token of targets[i] | its ancestors).
	TargetLogp []float32
	// Finals holds, per layer, the qkv of every node (for the KV cache).
}

// forward runs the policy over pk and returns log π for each target node
// (a node's token given its ancestors) at temperature temp.
func (m *Model) forward(pk *Pack, targets []int, temp float32) *fwdState {
	return m.forwardIn(nil, pk, targets, temp)
}

// forwardIn is forward with its buffers (and its backward's) taken from
// sc: the state is good until sc is released.
func (m *Model) forwardIn(sc *scratch, pk *Pack, targets []int, temp float32) *fwdState {
	c := m.Config
	N, D, F, H := pk.NumNodes(), c.DModel, c.FFN, c.Heads
	st := &fwdState{m: m, sc: sc, w: m.view(m.W), pk: pk, invT: 1 / temp, targets: targets}
	w := st.w

	x := sc.floats(N * D)
	for i, tok := range pk.Tokens {
		te, pe := w.tokEmb[tok*D:tok*D+D], w.posEmb[pk.Pos[i]*D:pk.Pos[i]*D+D]
		xr := x[i*D : i*D+D]
		for j := range xr {
			xr[j] = te[j] + pe[j]
		}
	}
	dh := D / H
	scale := float32(1 / math.Sqrt(float64(dh)))
	for l := 0; l < c.Layers; l++ {
		lw := w.layers[l]
		lc := layerCache{x: x}
		lc.inv1, lc.h1 = sc.floats(N), sc.floats(N*D)
		rmsNorm(lc.h1, lc.inv1, x, lw.ln1, N, D)
		lc.qkv = sc.floats(N * 3 * D)
		psgemm(false, false, N, 3*D, D, 1, lc.h1, D, lw.wqkv, 3*D, 0, lc.qkv, 3*D)
		lc.att = sc.floats(N * D)
		lc.probs = make([][]float32, len(pk.Segs)*H)
		lc.kpath, lc.vpath = gatherPaths(sc, pk, lc.qkv, D)
		parallelFor(len(pk.Segs)*H, attnCost(pk, D, H), func(lo, hi int) {
			for task := lo; task < hi; task++ {
				si, h := task/H, task%H
				sg := pk.Segs[si]
				L, P := sg.L, sg.P
				p := sc.floats(L * P)
				q := lc.qkv[sg.Start*3*D+h*dh:]
				sgemm(false, true, L, P, dh, scale, q, 3*D, lc.kpath[si][h*dh:], D, 0, p, P)
				for i := 0; i < L; i++ {
					softmaxPrefix(p[i*P:i*P+P], P-L+i+1)
				}
				sgemm(false, false, L, dh, P, 1, p, P, lc.vpath[si][h*dh:], D, 0, lc.att[sg.Start*D+h*dh:], D)
				lc.probs[task] = p
			}
		})
		lc.x2 = sc.floats(N * D)
		copy(lc.x2, x)
		psgemm(false, false, N, D, D, 1, lc.att, D, lw.wo, D, 1, lc.x2, D)
		lc.inv2, lc.h2 = sc.floats(N), sc.floats(N*D)
		rmsNorm(lc.h2, lc.inv2, lc.x2, lw.ln2, N, D)
		lc.u, lc.g, lc.tg = sc.floats(N*F), sc.floats(N*F), sc.floats(N*F)
		psgemm(false, false, N, F, D, 1, lc.h2, D, lw.w1, F, 0, lc.u, F)
		parallelFor(N, float64(F)*8, func(lo, hi int) {
			geluForward(lc.u[lo*F:hi*F], lc.tg[lo*F:hi*F], lc.g[lo*F:hi*F])
		})
		x = sc.floats(N * D)
		copy(x, lc.x2)
		psgemm(false, false, N, D, F, 1, lc.g, F, lw.w2, D, 1, x, D)
		st.layers = append(st.layers, lc)
	}
	st.xf = x
	st.invF, st.hf = sc.floats(N), sc.floats(N*D)
	rmsNorm(st.hf, st.invF, x, w.lnF, N, D)

	// Logits only for nodes that predict a target: prompt-only nodes in a
	// packed group cost nothing at the output layer.
	st.rowOf = make([]int, N)
	for i := range st.rowOf {
		st.rowOf[i] = -1
	}
	for _, tn := range targets {
		p := pk.Parent[tn]
		if st.rowOf[p] < 0 {
			st.rowOf[p] = len(st.rows)
			st.rows = append(st.rows, p)
		}
	}
	R, V := len(st.rows), c.Vocab
	hr := sc.floats(R * D)
	for r, n := range st.rows {
		copy(hr[r*D:r*D+D], st.hf[n*D:n*D+D])
	}
	logits := sc.floats(R * V)
	psgemm(false, false, R, V, D, 1, hr, D, w.head, V, 0, logits, V)
	st.logp = sc.floats(R * V)
	for r := 0; r < R; r++ {
		logSoftmaxRow(st.logp[r*V:r*V+V], logits[r*V:r*V+V], st.invT)
	}
	st.TargetLogp = sc.floats(len(targets))
	for i, tn := range targets {
		r := st.rowOf[pk.Parent[tn]]
		st.TargetLogp[i] = st.logp[r*V+pk.Tokens[tn]]
	}
	return st
}

// attnCost is the rough flops of one (segment, head) attention task.
func attnCost(pk *Pack, D, H int) float64 {
	var lp float64
	for _, sg := range pk.Segs {
		lp += float64(sg.L) * float64(sg.P)
	}
	return 4 * lp * float64(D/H) / float64(len(pk.Segs))
}

// gatherPaths copies, for every segment, the keys and values of the nodes
// it attends to (its ancestor segments, then itself) into P×D blocks.
func gatherPaths(sc *scratch, pk *Pack, qkv []float32, D int) (kp, vp [][]float32) {
	kp, vp = make([][]float32, len(pk.Segs)), make([][]float32, len(pk.Segs))
	for si, sg := range pk.Segs {
		k, v := sc.floats(sg.P*D), sc.floats(sg.P*D)
		r := 0
		forPath(sg, func(n int) {
			copy(k[r*D:r*D+D], qkv[n*3*D+D:n*3*D+2*D])
			copy(v[r*D:r*D+D], qkv[n*3*D+2*D:n*3*D+3*D])
			r++
		})
		kp[si], vp[si] = k, v
	}
	return kp, vp
}

// forPath calls fn for every node a segment attends to, in key order.
func forPath(sg segment, fn func(n int)) {
	for _, rg := range sg.Path {
		for n := rg[0]; n < rg[1]; n++ {
			fn(n)
		}
	}
	for n := sg.Start; n < sg.Start+sg.L; n++ {
		fn(n)
	}
}

// rowEntropy is the entropy of the next-token distribution at node n (one
// of the rows whose logits were computed).
func (st *fwdState) rowEntropy(n int) float64 {
	V := st.m.Config.Vocab
	r := st.rowOf[n]
	var h float64
	for _, lp := range st.logp[r*V : r*V+V] {
		h -= float64(expf(lp) * lp)
	}
	return h
}
