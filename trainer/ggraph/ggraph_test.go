package ggraph

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	G "gorgonia.org/gorgonia"

	"github.com/flywheel-ai/flywheel/trainer"
)

// randomModel is a small policy with weights far from the init so every
// path of the network matters in a comparison.
func randomModel(t testing.TB, seed uint64, cfg trainer.ModelConfig) *trainer.Model {
	t.Helper()
	m, err := trainer.NewModel(cfg, seed)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range m.W {
		m.W[i] += float32(rng.NormFloat64() * 0.3)
	}
	return m
}

var smallCfg = trainer.ModelConfig{Context: 32, Layers: 2, Heads: 2, DModel: 16, FFN: 24}

// randomSeqs makes groups that share prompts, so the pack has branching
// trees, plus an unrelated sequence (a separate tree).
func randomSeqs(rng *rand.Rand, groups, size, prompt, maxLen int) [][]int {
	var seqs [][]int
	for g := 0; g < groups; g++ {
		p := make([]int, prompt)
		for i := range p {
			p[i] = rng.IntN(trainer.VocabSize)
		}
		for j := 0; j < size; j++ {
			s := append([]int(nil), p...)
			n := prompt + 1 + rng.IntN(maxLen-prompt)
			for len(s) < n {
				s = append(s, rng.IntN(trainer.VocabSize))
			}
			seqs = append(seqs, s)
		}
	}
	return append(seqs, []int{5, 6, 7, 8, 9})
}

func allTargets(pk *trainer.Pack) []int {
	var ts []int
	for n, p := range pk.Parent {
		if p >= 0 {
			ts = append(ts, n)
		}
	}
	return ts
}

func requireClose(t *testing.T, want, got []float32, rel, abs float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		require.False(t, math.IsNaN(g), "%s[%d] is NaN", what, i)
		require.InDelta(t, w, g, abs+rel*math.Abs(w), "%s[%d]", what, i)
	}
}

func TestForwardMatchesHandWritten(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		m := randomModel(t, seed, smallCfg)
		before := append([]float32(nil), m.W...)
		e, err := New(m, trainer.LossConfig{})
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(seed, 11))
		for _, share := range []bool{true, false} {
			pk, err := trainer.BuildPack(randomSeqs(rng, 2, 3, 4, 12), share)
			require.NoError(t, err)
			targets := allTargets(pk)
			temp := float32(0.7 + 0.3*float64(seed))
			want := m.ReferenceTargetLogp(pk, targets, temp)
			got, err := e.TargetLogp(pk, targets, temp)
			require.NoError(t, err)
			requireClose(t, want, got, 1e-4, 1e-5, "logp")
		}
		require.Equal(t, before, m.W, "running the graph must not write the weights")
		require.NoError(t, e.Close())
	}
}

// grpoSamples are groups sharing prompts with trained completions; the
// behaviour log-probs are the model's own plus noise wide enough that IcePop
// and KPop drop some tokens.
func grpoSamples(t *testing.T, m *trainer.Model, rng *rand.Rand) []trainer.Sample {
	t.Helper()
	seqs := randomSeqs(rng, 2, 4, 5, 14)
	var samples []trainer.Sample
	for i, s := range seqs {
		smp := trainer.Sample{GroupID: string(rune('a' + i/4)), TokenIDs: s, LossMask: make([]uint8, len(s)),
			Logprobs: make([]float32, len(s)), Versions: make([]int64, len(s))}
		for j := min(5, len(s)-1); j < len(s); j++ {
			smp.LossMask[j] = 1
		}
		adv := rng.NormFloat64()
		smp.Advantage = &adv
		samples = append(samples, smp)
	}
	// Behaviour log-probs from the model itself, perturbed.
	for i := range samples {
		pk, err := trainer.BuildPack([][]int{samples[i].TokenIDs}, false)
		require.NoError(t, err)
		targets := allTargets(pk)
		lp := m.ReferenceTargetLogp(pk, targets, 1)
		for j, tn := range targets {
			pos := pk.Pos[tn]
			samples[i].Logprobs[pos] = min(0, lp[j]+float32(rng.NormFloat64()*0.8))
		}
	}
	return samples
}

func TestGradientsMatchHandWritten(t *testing.T) {
	type tc struct {
		name     string
		loss     trainer.LossConfig
		prox, kl bool
		sft      bool
	}
	cases := []tc{
		{name: "local_prox", loss: trainer.LossConfig{IcePop: true, KPop: true}},
		{name: "clip_masks_k3", loss: trainer.LossConfig{IcePop: true, KPop: true, KLCoef: 0.3}, prox: true, kl: true},
		{name: "clip_k1", loss: trainer.LossConfig{KLCoef: 0.2, KLEstimator: trainer.KLk1}, prox: true, kl: true},
		{name: "clip_k2_icepop", loss: trainer.LossConfig{IcePop: true, KLCoef: 0.5, KLEstimator: trainer.KLk2}, prox: true, kl: true},
		{name: "sft", sft: true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seed := uint64(20 + i)
			m := randomModel(t, seed, smallCfg)
			rng := rand.New(rand.NewPCG(seed, 5))
			samples := grpoSamples(t, m, rng)
			plan, err := trainer.PlanLoss(samples, 0.9, c.sft, true)
			require.NoError(t, err)
			require.Less(t, plan.Pack.NumNodes(), plan.Pack.NumSampleTokens(), "prompts must be shared")

			cur := m.ReferenceTargetLogp(plan.Pack, plan.Targets, plan.Temp)
			var prox, ref []float32
			if c.prox {
				prox = make([]float32, len(cur))
				for j := range prox {
					prox[j] = cur[j] + float32(rng.NormFloat64()*0.4)
				}
			}
			if c.kl {
				refModel := randomModel(t, seed+100, smallCfg)
				ref = refModel.ReferenceTargetLogp(plan.Pack, plan.Targets, plan.Temp)
			}
			// The case must exercise what it names.
			if !c.sft {
				lc, err := c.loss.Resolve()
				require.NoError(t, err)
				var clipped, masked int
				for _, o := range plan.Occ {
					in := trainer.PPOTokenIn{Logp: float64(cur[o.Target]), LogpProx: float64(cur[o.Target]), LogpBehav: o.LogpBehav, Adv: o.Adv}
					if prox != nil {
						in.LogpProx = float64(prox[o.Target])
					}
					out := trainer.PPOToken(lc, in)
					if out.Clipped {
						clipped++
					}
					if out.Masked {
						masked++
					}
				}
				if c.prox {
					require.Positive(t, clipped, "no token clipped")
				}
				if lc.IcePop || lc.KPop {
					require.Positive(t, masked, "no token masked")
					require.Less(t, masked, len(plan.Occ), "every token masked")
				}
			}

			wantLoss, wantGrad := m.ReferenceLoss(c.loss, plan, prox, ref)
			e, err := New(m, c.loss)
			require.NoError(t, err)
			defer e.Close()
			gotLoss, gotGrad, err := e.LossAndGrad(plan, prox, ref)
			require.NoError(t, err)
			require.InDelta(t, wantLoss, gotLoss, 1e-5+1e-4*math.Abs(wantLoss), "loss")

			var scale float64
			for _, g := range wantGrad {
				scale = max(scale, math.Abs(float64(g)))
			}
			require.Positive(t, scale)
			for _, s := range m.ParamSpecs() {
				requireClose(t, wantGrad[s.Offset:s.Offset+s.Size], gotGrad[s.Offset:s.Offset+s.Size], 1e-3, 1e-4*scale, s.Name)
			}
		})
	}
}

// TestBothAttentionLayouts covers per-tree padded blocks and the single
// block (one dominant tree among tiny ones, or one tree), forward and
// gradient.
func TestBothAttentionLayouts(t *testing.T) {
	long := make([]int, 20)
	for i := range long {
		long[i] = 40 + i
	}
	cases := []struct {
		name   string
		seqs   [][]int
		blocks int
	}{
		{"per_tree", [][]int{{1, 2, 3, 4}, {1, 2, 5}, {7, 8, 9, 10, 11}, {7, 6}}, 2},
		{"one_dominant_tree", [][]int{long, {1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}}, 1},
		{"one_tree", [][]int{{1, 2, 3, 4}, {1, 2, 5, 6, 7}}, 1},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := randomModel(t, uint64(40+i), smallCfg)
			pk, err := trainer.BuildPack(c.seqs, true)
			require.NoError(t, err)
			targets := allTargets(pk)
			e, err := New(m, trainer.LossConfig{})
			require.NoError(t, err)
			defer e.Close()
			in, err := e.packInputs(pk, targets)
			require.NoError(t, err)
			require.Equal(t, c.blocks, in.blocks)

			got, err := e.TargetLogp(pk, targets, 1)
			require.NoError(t, err)
			requireClose(t, m.ReferenceTargetLogp(pk, targets, 1), got, 1e-4, 1e-5, "logp")

			var samples []trainer.Sample
			for _, s := range c.seqs {
				mask := make([]uint8, len(s))
				for j := 1; j < len(s); j++ {
					mask[j] = 1
				}
				samples = append(samples, trainer.Sample{TokenIDs: s, LossMask: mask})
			}
			plan, err := trainer.PlanLoss(samples, 1, true, true)
			require.NoError(t, err)
			wantLoss, wantGrad := m.ReferenceLoss(trainer.LossConfig{}, plan, nil, nil)
			gotLoss, gotGrad, err := e.LossAndGrad(plan, nil, nil)
			require.NoError(t, err)
			require.InDelta(t, wantLoss, gotLoss, 1e-4*math.Abs(wantLoss))
			requireClose(t, wantGrad, gotGrad, 1e-3, 1e-5, "grad")
		})
	}
}

func TestGraphProductsRunOnTheTrainersSGEMM(t *testing.T) {
	m := randomModel(t, 5, smallCfg)
	e, err := New(m, trainer.LossConfig{})
	require.NoError(t, err)
	defer e.Close()
	_, ok := G.WhichBLAS().(fastBLAS)
	require.True(t, ok, "gorgonia uses %T", G.WhichBLAS())
	pk, err := trainer.BuildPack([][]int{{1, 2, 3, 4}}, true)
	require.NoError(t, err)
	before := sgemmCalls.Load()
	_, err = e.TargetLogp(pk, allTargets(pk), 1)
	require.NoError(t, err)
	// Per layer and head: Q, K, V, the two batched attention products and
	// the output projection; per layer W1 and W2; then the output layer.
	require.GreaterOrEqual(t, sgemmCalls.Load()-before, int64(smallCfg.Layers*(6*smallCfg.Heads+2)+1))
}
