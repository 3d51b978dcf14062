package ggraph

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/trainer"
)

// toySFT is a fixed set of short strings whose continuation is learnable.
func toySFT() *trainer.Batch {
	b := &trainer.Batch{Objective: trainer.ObjectiveSFT}
	for _, s := range []string{"abcabcabcabc", "xyzxyzxyzxyz", "abcabcxyzxyz", "hello hello "} {
		ids := make([]int, len(s))
		mask := make([]uint8, len(s))
		for i := range s {
			ids[i] = int(s[i])
			if i > 0 {
				mask[i] = 1
			}
		}
		b.Samples = append(b.Samples, trainer.Sample{TokenIDs: ids, LossMask: mask})
	}
	return b
}

func TestTrainingThroughGorgoniaReducesSFTLoss(t *testing.T) {
	m, err := trainer.NewModel(trainer.ModelConfig{Context: 16, Layers: 2, Heads: 2, DModel: 32, FFN: 64}, 3)
	require.NoError(t, err)
	tr, err := NewTrainer(m, 0, trainer.Config{Optim: trainer.OptimConfig{LR: 1e-2}}, nil)
	require.NoError(t, err)
	defer tr.Close()
	b := toySFT()
	var first, last trainer.StepResult
	for i := 0; i < 40; i++ {
		res, err := tr.TrainStep(context.Background(), b)
		require.NoError(t, err)
		if i == 0 {
			first = res
		}
		last = res
	}
	t.Logf("SFT loss %.3f → %.3f", first.Loss, last.Loss)
	require.Less(t, last.Loss, 0.5*first.Loss)
	require.Equal(t, int64(40), tr.Version())
	require.Equal(t, 1, tr.eng.Built, "one batch shape, one graph")
}

// TestTrainerMatchesLocal runs the same GRPO steps through trainer.Local and
// through the gorgonia Trainer and compares the weights they end with.
func TestTrainerMatchesLocal(t *testing.T) {
	m := randomModel(t, 9, smallCfg)
	rng := rand.New(rand.NewPCG(9, 9))
	samples := grpoSamples(t, m, rng)
	for i := range samples {
		samples[i].Advantage = nil
		samples[i].Reward = float64(i % 3)
	}
	cfg := trainer.Config{Loss: trainer.LossConfig{IcePop: true, KLCoef: 0.1}, MaxStaleness: -1}
	local, err := trainer.NewLocal(m, 0, cfg, nil)
	require.NoError(t, err)
	gg, err := NewTrainer(m, 0, cfg, nil)
	require.NoError(t, err)
	defer gg.Close()
	for step := 0; step < 3; step++ {
		b := &trainer.Batch{Samples: append([]trainer.Sample(nil), samples...), Temperature: 0.8}
		want, err := local.TrainStep(context.Background(), b)
		require.NoError(t, err)
		b = &trainer.Batch{Samples: append([]trainer.Sample(nil), samples...), Temperature: 0.8}
		got, err := gg.TrainStep(context.Background(), b)
		require.NoError(t, err)
		require.InDelta(t, want.Loss, got.Loss, 1e-5+1e-4*math.Abs(want.Loss), "step %d loss", step)
		require.InDelta(t, want.GradNorm, got.GradNorm, 1e-3*want.GradNorm, "step %d grad norm", step)
		require.Equal(t, want.IcePopMasked, got.IcePopMasked)
		require.Equal(t, want.Clipped, got.Clipped)
		require.InDelta(t, want.MeanKL, got.MeanKL, 1e-5+1e-3*math.Abs(want.MeanKL))
		require.Equal(t, want.UniqueTokens, got.UniqueTokens)
	}
	wl, wg := local.Snapshot().W, gg.Snapshot().W
	for i := range wl {
		require.InDelta(t, wl[i], wg[i], 1e-4, "weight %d", i)
	}
}

func TestBadInputIsAnError(t *testing.T) {
	m := randomModel(t, 4, smallCfg)
	e, err := New(m, trainer.LossConfig{})
	require.NoError(t, err)
	defer e.Close()
	pk, err := trainer.BuildPack([][]int{{1, 2, 3}}, true)
	require.NoError(t, err)
	_, err = e.TargetLogp(pk, []int{0}, 1)
	require.ErrorContains(t, err, "no parent")
	_, err = e.TargetLogp(pk, []int{1}, 0)
	require.ErrorContains(t, err, "temperature")
	_, err = e.TargetLogp(pk, nil, 1)
	require.ErrorContains(t, err, "no targets")

	smp := trainer.Sample{TokenIDs: []int{1, 2, 3}, LossMask: []uint8{0, 1, 1}, Logprobs: []float32{0, -1, -1}, Versions: make([]int64, 3)}
	adv := 1.0
	smp.Advantage = &adv
	plan, err := trainer.PlanLoss([]trainer.Sample{smp}, 1, false, true)
	require.NoError(t, err)
	_, _, err = e.LossAndGrad(plan, []float32{-1}, nil)
	require.ErrorContains(t, err, "proximal")
	_, _, err = e.LossAndGrad(nil, nil, nil)
	require.Error(t, err)

	ek, err := New(m, trainer.LossConfig{KLCoef: 0.1})
	require.NoError(t, err)
	defer ek.Close()
	_, _, err = ek.LossAndGrad(plan, nil, nil)
	require.ErrorContains(t, err, "reference")

	_, err = New(m, trainer.LossConfig{ClipLow: 2})
	require.Error(t, err)
	tr, err := NewTrainer(m, 0, trainer.Config{}, nil)
	require.NoError(t, err)
	defer tr.Close()
	_, err = tr.TrainStep(context.Background(), nil)
	require.Error(t, err)
	_, err = tr.TrainStep(context.Background(), &trainer.Batch{Samples: []trainer.Sample{{TokenIDs: []int{1, 999}, LossMask: []uint8{0, 1}}}, Objective: trainer.ObjectiveSFT})
	require.Error(t, err)
}
