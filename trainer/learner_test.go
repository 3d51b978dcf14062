package trainer

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// seqDatum is the datum of a whole sequence: every token after the first
// is a target.
func seqDatum(seq []int) TokenDatum {
	return TokenDatum{Input: append([]int{}, seq[:len(seq)-1]...), Targets: append([]int{}, seq[1:]...)}
}

// learnerData are sequences that share prefixes (so packing matters) with
// random weights, sampling log-probs and advantages.
func learnerData(rng *rand.Rand) []TokenDatum {
	seqs := [][]int{{1, 2, 3, 4, 5, 6}, {1, 2, 3, 9, 8}, {1, 2, 7}, {4, 4, 4, 4}}
	data := make([]TokenDatum, len(seqs))
	for i, s := range seqs {
		d := seqDatum(s)
		for range d.Targets {
			d.Weights = append(d.Weights, float32(rng.Float64()))
			d.Logprobs = append(d.Logprobs, float32(-1-rng.Float64()))
			d.Advantages = append(d.Advantages, float32(rng.NormFloat64()))
		}
		data[i] = d
	}
	return data
}

func maxAbsDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i]-b[i])))
	}
	return m
}

func TestLoRAGradientMatchesFiniteDifferences(t *testing.T) {
	ctx := context.Background()
	base := tinyModel(t, 1)
	l, err := NewLearner(base, LoRAConfig{Rank: 2, Alpha: 4, Seed: 5, Attn: true, MLP: true, Unembed: true})
	require.NoError(t, err)
	require.Len(t, l.adapters, 2*4+1)
	// B starts at zero, which would make every dA zero: give it values.
	rng := rand.New(rand.NewPCG(9, 9))
	for _, ad := range l.adapters {
		for i := ad.b.Offset; i < ad.b.Offset+ad.b.Size; i++ {
			l.params[i] = float32(rng.NormFloat64() * 0.3)
		}
	}
	l.merge()
	data := learnerData(rng)
	for _, loss := range []Loss{{Fn: LossFnCrossEntropy}, {Fn: LossFnImportanceSampling}} {
		clear(l.grad)
		_, err := l.ForwardBackward(ctx, data, loss)
		require.NoError(t, err)
		grad := append([]float32(nil), l.grad...)
		for _, s := range l.train {
			for trial := 0; trial < 4; trial++ {
				i := s.Offset + rng.IntN(s.Size)
				orig := l.params[i]
				const eps = 2e-3
				lossAt := func(v float32) float64 {
					l.params[i] = v
					l.merge()
					res, err := l.Forward(ctx, data, loss)
					require.NoError(t, err)
					return res.LossSum
				}
				num := (lossAt(orig+eps) - lossAt(orig-eps)) / (2 * eps)
				l.params[i] = orig
				l.merge()
				require.InDelta(t, num, float64(grad[i]), 2e-2+2e-2*math.Abs(num), "%s %s index %d", loss.Fn, s.Name, i-s.Offset)
			}
		}
	}
}

func TestNewLearnerEqualsItsBase(t *testing.T) {
	ctx := context.Background()
	base := tinyModel(t, 2)
	data := learnerData(rand.New(rand.NewPCG(1, 1)))
	pk, err := BuildPack([][]int{{1, 2, 3, 4, 5, 6}}, true)
	require.NoError(t, err)
	want := base.forward(pk, allTargets(pk), 1).TargetLogp
	for _, lora := range []LoRAConfig{{}, {Rank: 4, Unembed: true}} {
		l, err := NewLearner(base, lora)
		require.NoError(t, err)
		res, err := l.Forward(ctx, data, Loss{Fn: LossFnCrossEntropy})
		require.NoError(t, err)
		require.Less(t, maxAbsDiff(want, res.Logprobs[0]), 1e-5, "rank %d", lora.Rank)
		require.Equal(t, 14, res.Tokens)
		require.Less(t, res.UniqueTokens, 14+len(data), "shared prefixes are computed once")
		var sum float64
		for d := range data {
			for i, lp := range res.Logprobs[d] {
				require.InDelta(t, -float64(data[d].Weights[i])*float64(lp), float64(res.Loss[d][i]), 1e-6)
				sum += float64(res.Loss[d][i])
			}
		}
		require.InDelta(t, sum, res.LossSum, 1e-5)
	}
	l, err := NewLearner(base, LoRAConfig{Rank: 4})
	require.NoError(t, err)
	require.Equal(t, LoRAConfig{Rank: 4, Alpha: 32, Attn: true, MLP: true}, l.LoRA(), "Tinker's defaults")
	// Per layer, A and B of wqkv (4×8, 24×4), wo (4×8, 8×4), w1 (4×8, 16×4), w2 (4×16, 8×4).
	require.Equal(t, 2*(32+96+32+32+32+64+64+32), l.NumTrainable())
}

func TestLearnerLossesAreSkyRLs(t *testing.T) {
	ppo := Loss{Fn: LossFnPPO}.withDefaults()
	require.Equal(t, 0.8, ppo.ClipLow)
	require.Equal(t, 1.2, ppo.ClipHigh)
	lp, q := math.Log(0.5), math.Log(0.25) // ratio 2: clipped at 1.2
	loss, d := ppo.tokenLoss(lp, 0.5, q, 1)
	require.InDelta(t, -0.5*1.2, loss, 1e-12)
	require.Zero(t, d)
	loss, d = ppo.tokenLoss(lp, 0.5, q, -1) // A < 0: the unclipped ratio is the minimum
	require.InDelta(t, 0.5*2, loss, 1e-12)
	require.InDelta(t, 0.5*2, d, 1e-12)
	is := Loss{Fn: LossFnImportanceSampling}
	loss, d = is.tokenLoss(lp, 0.5, q, 3)
	require.InDelta(t, -0.5*2*3, loss, 1e-12)
	require.InDelta(t, -0.5*2*3, d, 1e-12)
	loss, d = Loss{Fn: LossFnCrossEntropy}.tokenLoss(lp, 0, 0, 0)
	require.Zero(t, loss+d, "weight 0 masks the position")
}

func TestLearnerRejectsMalformedData(t *testing.T) {
	ctx := context.Background()
	l, err := NewLearner(tinyModel(t, 3), LoRAConfig{Rank: 2})
	require.NoError(t, err)
	good := func() []TokenDatum { return learnerData(rand.New(rand.NewPCG(2, 2))) }
	cases := map[string]struct {
		mutate func(d []TokenDatum) []TokenDatum
		loss   string
		msg    string
	}{
		"no data":        {func([]TokenDatum) []TokenDatum { return nil }, LossFnCrossEntropy, "no datums"},
		"shifted wrong":  {func(d []TokenDatum) []TokenDatum { d[1].Targets[2] = 5; return d }, LossFnCrossEntropy, "datum 1 position 2: target 5 is not the next input token 9"},
		"short targets":  {func(d []TokenDatum) []TokenDatum { d[2].Targets = d[2].Targets[:1]; return d }, LossFnCrossEntropy, "datum 2: 1 target tokens for 2 input tokens"},
		"empty input":    {func(d []TokenDatum) []TokenDatum { d[0] = TokenDatum{}; return d }, LossFnCrossEntropy, "datum 0: empty input"},
		"token range":    {func(d []TokenDatum) []TokenDatum { d[3].Targets[2] = VocabSize; return d }, LossFnCrossEntropy, "datum 3 position 2: target token"},
		"negative token": {func(d []TokenDatum) []TokenDatum { d[3].Input[0] = -1; return d }, LossFnCrossEntropy, "datum 3 position 0: input token -1"},
		"too long":       {func(d []TokenDatum) []TokenDatum { d[0] = seqDatum(make([]int, 17)); return d }, LossFnCrossEntropy, "exceed the context of 16"},
		"nan weight":     {func(d []TokenDatum) []TokenDatum { d[0].Weights[1] = float32(math.NaN()); return d }, LossFnCrossEntropy, "datum 0 position 1: weight NaN"},
		"weights length": {func(d []TokenDatum) []TokenDatum { d[0].Weights = d[0].Weights[:2]; return d }, LossFnCrossEntropy, "datum 0: 2 weights for 5 positions"},
		"no logprobs":    {func(d []TokenDatum) []TokenDatum { d[1].Logprobs = nil; return d }, LossFnPPO, "datum 1: loss ppo needs 4 logprobs"},
		"inf advantage":  {func(d []TokenDatum) []TokenDatum { d[2].Advantages[0] = float32(math.Inf(1)); return d }, LossFnImportanceSampling, "datum 2 position 0"},
		"unknown loss":   {func(d []TokenDatum) []TokenDatum { return d }, "cispo", `loss function "cispo"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := l.ForwardBackward(ctx, c.mutate(good()), Loss{Fn: c.loss})
			require.ErrorIs(t, err, ErrInvalidInput)
			require.ErrorContains(t, err, c.msg)
		})
	}
	require.Zero(t, maxAbsDiff(l.grad, make([]float32, len(l.grad))), "a refused request adds nothing")
	_, err = l.OptimStep(AdamStep{LR: 1e-3, Beta1: 1, Beta2: 0.99, Eps: 1e-8})
	require.ErrorIs(t, err, ErrInvalidInput)
	_, err = NewLearner(tinyModel(t, 3), LoRAConfig{Rank: 9})
	require.ErrorIs(t, err, ErrInvalidInput)
	_, err = NewLearner(tinyModel(t, 3), LoRAConfig{Rank: -1})
	require.ErrorIs(t, err, ErrInvalidInput)
}

// localSettings are Local's defaults written out as a request sends them.
var localSettings = AdamStep{LR: 3e-3, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8, WeightDecay: 0.01, ClipNorm: 1}

// TestFullLearnerMatchesLocal: Local's token-mean SFT loss is the
// Learner's cross_entropy sum with weights 1/N, its on-policy GRPO step the
// ppo (or importance_sampling) sum with weights 1/N; with the same AdamW
// the two reach the same weights.
func TestFullLearnerMatchesLocal(t *testing.T) {
	ctx := context.Background()
	base := tinyModel(t, 4)
	seqs := [][]int{{1, 2, 3, 4, 5, 6}, {1, 2, 3, 9, 8}, {1, 2, 7, 7}, {4, 4, 4, 4}}
	const prompt = 2 // tokens 0 and 1 are the prompt
	n := 0
	for _, s := range seqs {
		n += len(s) - prompt
	}
	rng := rand.New(rand.NewPCG(8, 8))
	probe, err := NewLearner(base, LoRAConfig{})
	require.NoError(t, err)
	var plain []TokenDatum
	for _, s := range seqs {
		plain = append(plain, seqDatum(s))
	}
	cur, err := probe.Forward(ctx, plain, Loss{Fn: LossFnCrossEntropy})
	require.NoError(t, err)

	for _, objective := range []string{ObjectiveSFT, LossFnPPO, LossFnImportanceSampling} {
		t.Run(objective, func(t *testing.T) {
			b := &Batch{Objective: ObjectiveGRPO}
			if objective == ObjectiveSFT {
				b.Objective = ObjectiveSFT
			}
			loss := Loss{Fn: objective}
			if objective == ObjectiveSFT {
				loss.Fn = LossFnCrossEntropy
			}
			var data []TokenDatum
			for d, s := range seqs {
				adv := rng.NormFloat64()
				smp := Sample{TokenIDs: s, LossMask: make([]uint8, len(s)), Logprobs: make([]float32, len(s)), Versions: make([]int64, len(s)), Advantage: &adv}
				dt := seqDatum(s)
				for i := range dt.Targets {
					w := float32(0)
					// The behaviour policy differs a little from the current
					// one, inside the clip range.
					behav := cur.Logprobs[d][i] + float32(0.1*(rng.Float64()-0.5))
					if i+1 >= prompt {
						w = 1 / float32(n)
						smp.LossMask[i+1], smp.Logprobs[i+1], smp.Versions[i+1] = 1, behav, 1
					}
					dt.Weights = append(dt.Weights, w)
					dt.Logprobs = append(dt.Logprobs, behav)
					dt.Advantages = append(dt.Advantages, float32(adv))
				}
				b.Samples, data = append(b.Samples, smp), append(data, dt)
			}
			local, err := NewLocal(base, 1, Config{MaxStaleness: -1}, nil)
			require.NoError(t, err)
			res, err := local.TrainStep(ctx, b)
			require.NoError(t, err)

			l, err := NewLearner(base, LoRAConfig{})
			require.NoError(t, err)
			fb, err := l.ForwardBackward(ctx, data, loss)
			require.NoError(t, err)
			step, err := l.OptimStep(localSettings)
			require.NoError(t, err)

			require.InDelta(t, res.Loss, fb.LossSum, 1e-5*math.Max(1, math.Abs(res.Loss)))
			require.InDelta(t, res.GradNorm, step.GradNorm, 1e-4*res.GradNorm)
			require.Equal(t, res.LR, step.LR)
			require.Positive(t, fb.FLOPs)
			diff := maxAbsDiff(local.Snapshot().W, l.Merged().W)
			t.Logf("%s: loss Local %.6f Learner %.6f, grad norm %.5f / %.5f, max weight difference %.2g", objective, res.Loss, fb.LossSum, res.GradNorm, step.GradNorm, diff)
			require.Less(t, diff, 1e-5)
		})
	}
}

// TestLearnerLearns trains the same small SFT set with full weights and
// with LoRA: each must bring the loss down, and the base must not move.
func TestLearnerLearns(t *testing.T) {
	ctx := context.Background()
	base, err := NewModel(ModelConfig{Context: 32, Layers: 2, Heads: 2, DModel: 32, FFN: 64}, 11)
	require.NoError(t, err)
	baseW := append([]float32(nil), base.W...)
	var data []TokenDatum
	for i := 0; i < 4; i++ {
		s := []int{TokImStart}
		for j := 0; j < 10; j++ {
			s = append(s, 'a'+(i+j)%5)
		}
		d := seqDatum(s)
		for range d.Targets {
			d.Weights = append(d.Weights, 1/float32(4*10))
		}
		data = append(data, d)
	}
	for _, lora := range []LoRAConfig{{}, {Rank: 8}, {Rank: 8, Attn: true, MLP: true, Unembed: true}} {
		const lr = 1e-2 // α/r = 4 already scales the adapters' steps
		l, err := NewLearner(base, lora)
		require.NoError(t, err)
		var first, last float64
		const steps = 12
		for i := 0; i < steps; i++ {
			fb, err := l.ForwardBackward(ctx, data, Loss{Fn: LossFnCrossEntropy})
			require.NoError(t, err)
			if i == 0 {
				first = fb.LossSum
			}
			last = fb.LossSum
			step, err := l.OptimStep(AdamStep{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12})
			require.NoError(t, err)
			require.Equal(t, i+1, step.Step)
		}
		t.Logf("rank %d (unembed %v, %d trainable), lr %g: loss %.3f → %.3f in %d steps", lora.Rank, lora.Unembed, l.NumTrainable(), lr, first, last, steps)
		if !lora.Unembed && lora.Rank > 0 {
			// The frozen head (weights of about 0.02) and final norm
			// bound what the adapters below them can do to the logits.
			require.Less(t, last, first)
			continue
		}
		require.Less(t, last, first*0.7)
	}
	require.Equal(t, baseW, base.W, "the base is never written")
}

// A LoRA state saved before the base was named by XXH64 names it by
// FNV-1a: it still loads on its base, and only there.
func TestLearnerStateOfTheOlderBaseName(t *testing.T) {
	base := tinyModel(t, 5)
	l, err := NewLearner(base, LoRAConfig{Rank: 2})
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "state.safetensors")
	require.NoError(t, l.SaveState(path))
	buf, err := os.ReadFile(path)
	require.NoError(t, err)
	tensors, meta, err := ReadSafetensors(buf)
	require.NoError(t, err)
	require.Equal(t, baseXXH64(base.W), meta[metaBaseXXH])
	delete(meta, metaBaseXXH)
	meta[metaBaseFNV] = baseFNV(base.W)
	var old bytes.Buffer
	require.NoError(t, WriteSafetensors(&old, tensors, meta))
	require.NoError(t, os.WriteFile(path, old.Bytes(), 0o644))

	back, err := LoadLearner(path, base, true)
	require.NoError(t, err)
	require.Equal(t, l.Merged().W, back.Merged().W)
	_, err = LoadLearner(path, tinyModel(t, 6), true)
	require.ErrorContains(t, err, "another base model")

	delete(meta, metaBaseFNV)
	old.Reset()
	require.NoError(t, WriteSafetensors(&old, tensors, meta))
	require.NoError(t, os.WriteFile(path, old.Bytes(), 0o644))
	_, err = LoadLearner(path, base, true)
	require.ErrorContains(t, err, "another base model", "a LoRA state that names no base is refused")
}

func TestLearnerStateRoundTrip(t *testing.T) {
	ctx := context.Background()
	base := tinyModel(t, 5)
	data := learnerData(rand.New(rand.NewPCG(3, 3)))
	dir := t.TempDir()
	for _, lora := range []LoRAConfig{{}, {Rank: 3, Unembed: true}} {
		l, err := NewLearner(base, lora)
		require.NoError(t, err)
		for i := 0; i < 2; i++ {
			_, err := l.ForwardBackward(ctx, data, Loss{Fn: LossFnPPO})
			require.NoError(t, err)
			_, err = l.OptimStep(localSettings)
			require.NoError(t, err)
		}
		path := filepath.Join(dir, "state.safetensors")
		require.NoError(t, l.SaveState(path))
		back, err := LoadLearner(path, base, true)
		require.NoError(t, err)
		require.Equal(t, 2, back.Step())
		require.Equal(t, l.LoRA(), back.LoRA())
		require.Equal(t, l.Merged().W, back.Merged().W)
		// The next step is the same on both: the moments came back.
		for _, x := range []*Learner{l, back} {
			_, err := x.ForwardBackward(ctx, data, Loss{Fn: LossFnCrossEntropy})
			require.NoError(t, err)
			_, err = x.OptimStep(localSettings)
			require.NoError(t, err)
		}
		require.Equal(t, l.Merged().W, back.Merged().W)
		fresh, err := LoadLearner(path, base, false)
		require.NoError(t, err)
		require.Zero(t, fresh.Step())

		other := tinyModel(t, 6)
		_, err = LoadLearner(path, other, true)
		if lora.Rank > 0 {
			require.ErrorContains(t, err, "another base model")
		} else {
			require.NoError(t, err, "full weights do not depend on the base's values")
		}
	}
}
