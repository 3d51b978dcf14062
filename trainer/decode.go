package trainer

import "math"

// kvCache holds the keys and values of one sequence, per layer, so each new
// token costs one row of work instead of a pass over the whole prefix.
type kvCache struct {
	k, v [][]float32 // [layer] ctx×D
	n    int
}

func (m *Model) newCache() *kvCache {
	c := m.Config
	kv := &kvCache{k: make([][]float32, c.Layers), v: make([][]float32, c.Layers)}
	for l := range kv.k {
		kv.k[l] = make([]float32, c.Context*c.DModel)
		kv.v[l] = make([]float32, c.Context*c.DModel)
	}
	return kv
}

// clone copies the first n positions into a fresh cache of the same size.
func (kv *kvCache) clone(d int) *kvCache {
	c := &kvCache{k: make([][]float32, len(kv.k)), v: make([][]float32, len(kv.v)), n: kv.n}
	for l := range kv.k {
		c.k[l] = make([]float32, len(kv.k[l]))
		c.v[l] = make([]float32, len(kv.v[l]))
		copy(c.k[l], kv.k[l][:kv.n*d])
		copy(c.v[l], kv.v[l][:kv.n*d])
	}
	return c
}

// prefill runs ids through the batched forward pass and stores their keys
// and values; the last prompt token then goes through decodeStep, which
// yields the first logits.
func (m *Model) prefill(kv *kvCache, ids []int) {
	if len(ids) == 0 {
		return
	}
	pk, err := BuildPack([][]int{ids}, false)
	if err != nil {
		return // unreachable: ids is not empty
	}
	D := m.Config.DModel
	// A chain shifted to start at the cache's current length is not needed:
	// prefill only ever runs on an empty cache.
	st := m.forward(pk, nil, 1)
	for l, lc := range st.layers {
		for i := range ids {
			copy(kv.k[l][i*D:i*D+D], lc.qkv[i*3*D+D:i*3*D+2*D])
			copy(kv.v[l][i*D:i*D+D], lc.qkv[i*3*D+2*D:i*3*D+3*D])
		}
	}
	kv.n = len(ids)
}

// decodeStep appends one token to each cache and writes each sequence's
// next-token logits into logits (B×V).
func (m *Model) decodeStep(w modelW, caches []*kvCache, toks []int, logits []float32) {
	c := m.Config
	B, D, F, H, V := len(toks), c.DModel, c.FFN, c.Heads, c.Vocab
	dh := D / H
	scale := float32(1 / math.Sqrt(float64(dh)))
	x := make([]float32, B*D)
	for b, tok := range toks {
		pos := caches[b].n
		te, pe := w.tokEmb[tok*D:tok*D+D], w.posEmb[pos*D:pos*D+D]
		for j := 0; j < D; j++ {
			x[b*D+j] = te[j] + pe[j]
		}
	}
	h := make([]float32, B*D)
	inv := make([]float32, B)
	qkv := make([]float32, B*3*D)
	att := make([]float32, B*D)
	u, tg := make([]float32, B*F), make([]float32, B*F)
	for l := 0; l < c.Layers; l++ {
		lw := w.layers[l]
		rmsNorm(h, inv, x, lw.ln1, B, D)
		psgemm(false, false, B, 3*D, D, 1, h, D, lw.wqkv, 3*D, 0, qkv, 3*D)
		parallelFor(B, float64(4*D*caches[0].n+1), func(lo, hi int) {
			scores := make([]float32, c.Context)
			for b := lo; b < hi; b++ {
				m.attendOne(caches[b], l, qkv[b*3*D:b*3*D+3*D], att[b*D:b*D+D], scores, scale)
			}
		})
		psgemm(false, false, B, D, D, 1, att, D, lw.wo, D, 1, x, D)
		rmsNorm(h, inv, x, lw.ln2, B, D)
		psgemm(false, false, B, F, D, 1, h, D, lw.w1, F, 0, u, F)
		geluForward(u, tg, u)
		psgemm(false, false, B, D, F, 1, u, F, lw.w2, D, 1, x, D)
	}
	rmsNorm(h, inv, x, w.lnF, B, D)
	psgemm(false, false, B, V, D, 1, h, D, w.head, V, 0, logits, V)
	for _, kv := range caches {
		kv.n++
	}
}

// attendOne stores a token's key and value in its cache and writes its
// attention output over every cached position (all heads).
func (m *Model) attendOne(kv *kvCache, l int, row, out, scores []float32, scale float32) {
	D, H := m.Config.DModel, m.Config.Heads
	dh := D / H
	pos := kv.n
	copy(kv.k[l][pos*D:pos*D+D], row[D:2*D])
	copy(kv.v[l][pos*D:pos*D+D], row[2*D:3*D])
	for hd := 0; hd < H; hd++ {
		q := row[hd*dh : hd*dh+dh]
		mx := float32(math.Inf(-1))
		for t := 0; t <= pos; t++ {
			k := kv.k[l][t*D+hd*dh : t*D+hd*dh+dh]
			var s float32
			for j, qv := range q {
				s += qv * k[j]
			}
			s *= scale
			scores[t] = s
			if s > mx {
				mx = s
			}
		}
		var sum float32
		for t := 0; t <= pos; t++ {
			e := expf(scores[t] - mx)
			scores[t] = e
			sum += e
		}
		o := out[hd*dh : hd*dh+dh]
		for j := range o {
			o[j] = 0
		}
		for t := 0; t <= pos; t++ {
			p := scores[t] / sum
			vv := kv.v[l][t*D+hd*dh : t*D+hd*dh+dh]
			for j := range o {
				o[j] += p * vv[j]
			}
		}
	}
}
