package trainer

import "math"

// backward adds into grad (laid out like Model.W) the gradient of
// Σ_i dLogp[i]·TargetLogp[i]; the loss functions reduce everything they need
// to this per-target derivative.
func (st *fwdState) backward(dLogp []float32, grad []float32) {
	gw := st.m.view(grad)
	dx := st.outputBackward(dLogp, gw)
	for l := st.m.Config.Layers - 1; l >= 0; l-- {
		// Both halves of a block add into dx in place: the residuals carry
		// it through unchanged.
		st.mlpBackward(l, dx, gw.layers[l])
		st.attentionBackward(l, dx, gw.layers[l])
	}
	st.embeddingBackward(dx, gw)
}

// outputBackward runs the output layer and the final norm backward and
// returns d loss / d x at the top of the last block (N×D).
func (st *fwdState) outputBackward(dLogp []float32, gw modelW) []float32 {
	pk, w := st.pk, st.w
	c := st.m.Config
	N, D, V := pk.NumNodes(), c.DModel, c.Vocab
	// d logp[tok] / d z = invT·(onehot − softmax).
	R := len(st.rows)
	dz := st.sc.floats(R * V)
	for i, tn := range st.targets {
		g := dLogp[i]
		if g == 0 {
			continue
		}
		r := st.rowOf[pk.Parent[tn]]
		lp, dr := st.logp[r*V:r*V+V], dz[r*V:r*V+V]
		for v := range dr {
			dr[v] -= g * st.invT * float32(math.Exp(float64(lp[v])))
		}
		dr[pk.Tokens[tn]] += g * st.invT
	}
	hr := st.sc.floats(R * D)
	for r, n := range st.rows {
		copy(hr[r*D:r*D+D], st.hf[n*D:n*D+D])
	}
	psgemm(true, false, D, V, R, 1, hr, D, dz, V, 1, gw.head, V)
	dhr := st.sc.floats(R * D)
	psgemm(false, true, R, D, V, 1, dz, V, w.head, V, 0, dhr, D)
	dhf := st.sc.floats(N * D)
	for r, n := range st.rows {
		copy(dhf[n*D:n*D+D], dhr[r*D:r*D+D])
	}
	dx := st.sc.floats(N * D)
	rmsNormBack(dx, gw.lnF, dhf, st.xf, st.invF, w.lnF, N, D)
	return dx
}

// mlpBackward runs x3 = x2 + gelu(norm(x2)·w1)·w2 of layer l backward:
// dx holds d loss / d x3 and becomes d loss / d x2.
func (st *fwdState) mlpBackward(l int, dx []float32, lg layerW) {
	c := st.m.Config
	N, D, F := st.pk.NumNodes(), c.DModel, c.FFN
	lc, lw := &st.layers[l], st.w.layers[l]
	psgemm(true, false, F, D, N, 1, lc.g, F, dx, D, 1, lg.w2, D)
	du := st.sc.floats(N * F)
	psgemm(false, true, N, F, D, 1, dx, D, lw.w2, D, 0, du, F)
	parallelFor(N, float64(F)*20, func(lo, hi int) {
		for i := lo * F; i < hi*F; i++ {
			du[i] *= geluGrad(lc.u[i], lc.tg[i])
		}
	})
	psgemm(true, false, D, F, N, 1, lc.h2, D, du, F, 1, lg.w1, F)
	dh2 := st.sc.floats(N * D)
	psgemm(false, true, N, D, F, 1, du, F, lw.w1, F, 0, dh2, D)
	rmsNormBack(dx, lg.ln2, dh2, lc.x2, lc.inv2, lw.ln2, N, D)
}

// attentionBackward runs x2 = x + attention(norm(x))·wo of layer l
// backward: dx holds d loss / d x2 and becomes d loss / d x.
func (st *fwdState) attentionBackward(l int, dx []float32, lg layerW) {
	pk := st.pk
	c := st.m.Config
	N, D, H := pk.NumNodes(), c.DModel, c.Heads
	lc, lw := &st.layers[l], st.w.layers[l]
	psgemm(true, false, D, D, N, 1, lc.att, D, dx, D, 1, lg.wo, D)
	datt := st.sc.floats(N * D)
	psgemm(false, true, N, D, D, 1, dx, D, lw.wo, D, 0, datt, D)
	dqkv := st.sc.floats(N * 3 * D)
	// One task per head: every segment adds into the keys and values of
	// its ancestors, so segments of one head run in turn, while heads own
	// disjoint columns.
	parallelFor(H, 2*attnCost(pk, D, H)*float64(len(pk.Segs)), func(lo, hi int) {
		for h := lo; h < hi; h++ {
			st.headBackward(lc, h, datt, dqkv)
		}
	})
	psgemm(true, false, D, 3*D, N, 1, lc.h1, D, dqkv, 3*D, 1, lg.wqkv, 3*D)
	dh1 := st.sc.floats(N * D)
	psgemm(false, true, N, D, 3*D, 1, dqkv, 3*D, lw.wqkv, 3*D, 0, dh1, D)
	rmsNormBack(dx, lg.ln1, dh1, lc.x, lc.inv1, lw.ln1, N, D)
}

// headBackward writes head h's columns of dqkv (N×3D) from datt (N×D), the
// gradient of the attention output, segment by segment.
func (st *fwdState) headBackward(lc *layerCache, h int, datt, dqkv []float32) {
	c := st.m.Config
	D, H := c.DModel, c.Heads
	dh := D / H
	scale := float32(1 / math.Sqrt(float64(dh)))
	for si, sg := range st.pk.Segs {
		L, P := sg.L, sg.P
		p := lc.probs[si*H+h]
		dp := st.sc.floats(L * P)
		dkp, dvp := st.sc.floats(P*dh), st.sc.floats(P*dh)
		q := lc.qkv[sg.Start*3*D+h*dh:]
		do := datt[sg.Start*D+h*dh:]
		// dP = dO·Vᵀ; dV = Pᵀ·dO.
		sgemm(false, true, L, P, dh, 1, do, D, lc.vpath[si][h*dh:], D, 0, dp, P)
		sgemm(true, false, P, dh, L, 1, p, P, do, D, 0, dvp, dh)
		// dS = P ⊙ (dP − rowsum(dP ⊙ P)), times the score scale; hidden
		// keys have P = 0 and get nothing.
		for i := 0; i < L; i++ {
			pr, dr := p[i*P:i*P+P], dp[i*P:i*P+P]
			var s float32
			for j := range pr {
				s += pr[j] * dr[j]
			}
			for j := range pr {
				dr[j] = pr[j] * (dr[j] - s) * scale
			}
		}
		sgemm(false, false, L, dh, P, 1, dp, P, lc.kpath[si][h*dh:], D, 0, dqkv[sg.Start*3*D+h*dh:], 3*D)
		sgemm(true, false, P, dh, L, 1, dp, P, q, 3*D, 0, dkp, dh)
		r := 0
		forPath(sg, func(n int) {
			dk := dqkv[n*3*D+D+h*dh : n*3*D+D+h*dh+dh]
			dv := dqkv[n*3*D+2*D+h*dh : n*3*D+2*D+h*dh+dh]
			for j := 0; j < dh; j++ {
				dk[j] += dkp[r*dh+j]
				dv[j] += dvp[r*dh+j]
			}
			r++
		})
	}
}

// embeddingBackward adds each node's d loss / d x into its token's and its
// position's embedding rows.
func (st *fwdState) embeddingBackward(dx []float32, gw modelW) {
	D := st.m.Config.DModel
	for i, tok := range st.pk.Tokens {
		dr := dx[i*D : i*D+D]
		te, pe := gw.tokEmb[tok*D:tok*D+D], gw.posEmb[st.pk.Pos[i]*D:st.pk.Pos[i]*D+D]
		for j, v := range dr {
			te[j] += v
			pe[j] += v
		}
	}
}
