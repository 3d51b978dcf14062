package trainer

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdamWStepHandComputed(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 4, Layers: 1, Heads: 1, DModel: 2, FFN: 2}, 1)
	require.NoError(t, err)
	cfg := OptimConfig{LR: 0.1, WeightDecay: 0.5}.withDefaults()
	opt := newAdamW(cfg, m.lay)
	w := append([]float32{}, m.W...)
	g := make([]float32, len(w))
	for i := range g {
		g[i] = 0.2
	}
	lr := opt.update(w, g, 1)
	require.InDelta(t, 0.1, lr, 1e-12)
	// Step 1: m̂ = g, v̂ = g², so the move is lr·g/(|g|+eps) = lr; matrices
	// also decay by lr·wd·w first, norms do not.
	for _, s := range m.lay.Specs {
		i := s.Offset
		want := m.W[i] - 0.1
		if len(s.Shape) > 1 {
			want = m.W[i]*(1-0.05) - 0.1
		}
		require.InDelta(t, want, w[i], 1e-6, s.Name)
	}
}

func TestLRScheduleAndClip(t *testing.T) {
	c := OptimConfig{LR: 1, MinLR: 0.1, WarmupSteps: 4, DecaySteps: 10}.withDefaults()
	require.InDelta(t, 0.25, c.LRAt(0), 1e-12)
	require.InDelta(t, 1, c.LRAt(3), 1e-12)
	require.InDelta(t, 1, c.LRAt(4), 1e-12)
	require.InDelta(t, 0.55, c.LRAt(9), 1e-12) // half way down the cosine
	require.InDelta(t, 0.1, c.LRAt(14), 1e-12)
	require.InDelta(t, 0.1, c.LRAt(100), 1e-12)

	g := []float32{3, 4}
	require.InDelta(t, 5, clipGrad(g, 1), 1e-9)
	require.InDelta(t, 0.6, g[0], 1e-6)
	require.InDelta(t, 0.8, g[1], 1e-6)
	require.Error(t, OptimConfig{LR: -1}.withDefaults().validate())
}

func validSample(n int, version int64) Sample {
	s := Sample{TokenIDs: make([]int, n), LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n), Reward: 1}
	for i := range s.TokenIDs {
		s.TokenIDs[i] = 'a' + i%26
	}
	for i := n / 2; i < n; i++ {
		s.LossMask[i], s.Logprobs[i], s.Versions[i] = 1, -3, version
	}
	return s
}

func TestTrainStepRejectsBadBatches(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	l, err := NewLocal(m, 0, Config{}, nil)
	require.NoError(t, err)
	ctx := context.Background()
	mut := func(f func(*Sample)) *Batch {
		s := validSample(8, 0)
		f(&s)
		return &Batch{Samples: []Sample{s}}
	}
	for name, tc := range map[string]struct {
		b    *Batch
		want string
	}{
		"nil":          {nil, "nil batch"},
		"empty":        {&Batch{}, "no samples"},
		"objective":    {&Batch{Objective: "dpo", Samples: []Sample{validSample(8, 0)}}, "objective"},
		"short":        {mut(func(s *Sample) { s.TokenIDs = s.TokenIDs[:1] }), "at least 2"},
		"too long":     {&Batch{Samples: []Sample{validSample(17, 0)}}, "context"},
		"mask length":  {mut(func(s *Sample) { s.LossMask = s.LossMask[:3] }), "loss_mask"},
		"logprobs len": {mut(func(s *Sample) { s.Logprobs = nil }), "logprobs"},
		"token 0":      {mut(func(s *Sample) { s.LossMask[0] = 1 }), "token 0"},
		"vocab":        {mut(func(s *Sample) { s.TokenIDs[2] = 1000 }), "vocabulary"},
		"positive lp":  {mut(func(s *Sample) { s.Logprobs[7] = 0.5 }), "≤ 0"},
		"nan lp":       {mut(func(s *Sample) { s.Logprobs[7] = float32(math.NaN()) }), "finite"},
		"mask value":   {mut(func(s *Sample) { s.LossMask[5] = 2 }), "0 or 1"},
		"no trained":   {mut(func(s *Sample) { s.LossMask = make([]uint8, 8) }), "no token"},
		"reward":       {mut(func(s *Sample) { s.Reward = math.Inf(1) }), "not finite"},
		"base version": {&Batch{Version: -1, Samples: []Sample{validSample(8, 0)}}, "cannot be the new weights' id"},
	} {
		_, err := l.TrainStep(ctx, tc.b)
		require.ErrorContains(t, err, tc.want, name)
	}
	require.Equal(t, int64(0), l.Version(), "a rejected batch must not create a version")
}

// TestTrainStepTakesTheReservedVersion: the control plane names the new
// weights' id (the trainer protocol reserves it per run); without one the
// trainer counts on from the highest id it handed out.
func TestTrainStepTakesTheReservedVersion(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	l, err := NewLocal(m, 3, Config{}, nil)
	require.NoError(t, err)
	ctx := context.Background()
	res, err := l.TrainStep(ctx, &Batch{Version: 9, Samples: []Sample{validSample(8, 3)}})
	require.NoError(t, err)
	require.Equal(t, int64(9), res.Version)
	require.Equal(t, int64(3), res.Parent)
	_, err = l.TrainStep(ctx, &Batch{Version: 9, Samples: []Sample{validSample(8, 9)}})
	require.ErrorContains(t, err, "cannot be the new weights' id", "the weights it starts from")
	res, err = l.TrainStep(ctx, &Batch{Samples: []Sample{validSample(8, 9)}})
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Version)
}

func TestStalenessBound(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	l, err := NewLocal(m, 10, Config{MaxStaleness: 2}, nil)
	require.NoError(t, err)
	fresh, stale := validSample(8, 9), validSample(8, 7)
	fresh.GroupID, stale.GroupID = "g", "g"
	res, err := l.TrainStep(context.Background(), &Batch{Samples: []Sample{fresh, stale, validSample(8, 8)}})
	require.NoError(t, err)
	require.Equal(t, 1, res.DroppedStale)
	require.Equal(t, 2, res.Samples)
	require.Equal(t, int64(11), res.Version)
	_, err = l.TrainStep(context.Background(), &Batch{Samples: []Sample{validSample(8, 1)}})
	require.ErrorContains(t, err, "staler")
}

func TestResetTrainsOnFromAnOlderVersionWithNewIDs(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	l, err := NewLocal(m, 0, Config{MaxStaleness: 1}, nil)
	require.NoError(t, err)
	ctx := context.Background()
	for v := int64(0); v < 3; v++ {
		res, err := l.TrainStep(ctx, &Batch{Samples: []Sample{validSample(8, v)}})
		require.NoError(t, err)
		require.Equal(t, v+1, res.Version)
	}
	// Version 1 is what serves: training goes back to it.
	require.NoError(t, l.Reset(m, 1))
	require.Equal(t, int64(1), l.Version())
	require.Equal(t, m.W, l.Snapshot().W)
	// Samples of version 1 are fresh again although ids 2 and 3 exist.
	res, err := l.TrainStep(ctx, &Batch{Samples: []Sample{validSample(8, 1)}})
	require.NoError(t, err)
	require.Equal(t, int64(4), res.Version, "a new id, never a reused one")
	require.Equal(t, 0, res.DroppedStale)
	// Version 4 is one step from 1; version 0's samples are now 2 steps old.
	_, err = l.TrainStep(ctx, &Batch{Samples: []Sample{validSample(8, 0)}})
	require.ErrorContains(t, err, "staler")

	other, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 16, FFN: 8}, 1)
	require.NoError(t, err)
	require.ErrorContains(t, l.Reset(other, 2), "model config")

	l.ReserveIDs(40)
	res, err = l.TrainStep(ctx, &Batch{Samples: []Sample{validSample(8, 4)}})
	require.NoError(t, err)
	require.Equal(t, int64(41), res.Version)
}

func TestSFTReducesLossAndPublishes(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 32, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
	require.NoError(t, err)
	eng, err := NewEngine(m, 1, EngineConfig{})
	require.NoError(t, err)
	l, err := NewLocal(m, 1, Config{Optim: OptimConfig{LR: 1e-2}}, eng)
	require.NoError(t, err)
	s := validSample(12, 0)
	b := &Batch{Objective: ObjectiveSFT, Samples: []Sample{s}}
	first, err := l.TrainStep(context.Background(), b)
	require.NoError(t, err)
	var last StepResult
	for i := 0; i < 20; i++ {
		last, err = l.TrainStep(context.Background(), b)
		require.NoError(t, err)
	}
	require.Less(t, last.Loss, first.Loss/2)
	_, v := eng.Current()
	require.Equal(t, last.Version, v)
}

func TestBatchJSONLRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	b := groupBatch(rng, 2, 3, 5, 4)
	a := 0.5
	b.Samples[0].Advantage = &a
	b.Temperature = 0.7
	var buf bytes.Buffer
	require.NoError(t, b.WriteJSONL(&buf))
	require.Equal(t, 7, strings.Count(buf.String(), "\n"))
	got, err := ReadBatchJSONL(&buf)
	require.NoError(t, err)
	require.Equal(t, ObjectiveGRPO, got.Objective)
	require.Equal(t, b.Temperature, got.Temperature)
	require.Equal(t, b.Samples, got.Samples)

	for name, in := range map[string]string{
		"empty":       "",
		"header":      "nope\n",
		"count":       `{"objective":"grpo","samples":2}` + "\n" + `{"token_ids":[1,2]}` + "\n",
		"sample json": `{"objective":"grpo","samples":1}` + "\n" + `{"token_ids":"x"}` + "\n",
		"negative":    `{"samples":-1}` + "\n",
	} {
		_, err := ReadBatchJSONL(strings.NewReader(in))
		require.Error(t, err, name)
	}
}

func FuzzReadBatchJSONL(f *testing.F) {
	f.Add(`{"objective":"grpo","samples":1}` + "\n" + `{"token_ids":[1,2],"loss_mask":[0,1],"logprobs":[0,-1],"versions":[0,0]}` + "\n")
	f.Fuzz(func(t *testing.T, in string) {
		b, err := ReadBatchJSONL(strings.NewReader(in))
		if err != nil {
			return
		}
		// Whatever parses must be validated, not trusted.
		_ = b.validate(VocabSize, 64)
	})
}

// With one update per batch the ratio π/π_prox is exactly 1 and nothing is
// clipped; with several minibatches the later ones are measured against the
// weights the step started from, so a big step makes the clip bite.
func TestMiniBatchesUseProximalPolicy(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 32, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(5, 5))
	b := groupBatch(rng, 4, 4, 8, 6)
	for _, mb := range []int{1, 4} {
		l, err := NewLocal(m, 0, Config{MiniBatches: mb, Optim: OptimConfig{LR: 0.05}}, nil)
		require.NoError(t, err)
		var res StepResult
		for i := 0; i < 3; i++ {
			res, err = l.TrainStep(context.Background(), b)
			require.NoError(t, err)
		}
		require.Equal(t, 16, res.Samples)
		if mb == 1 {
			require.Zero(t, res.Clipped)
		} else {
			require.Positive(t, res.Clipped)
		}
	}
	require.Len(t, SplitGroups(b.Samples, 3), 3)
	require.Len(t, SplitGroups(b.Samples, 10), 4, "groups stay whole")
	_, err = NewLocal(m, 0, Config{MiniBatches: -1}, nil)
	require.ErrorContains(t, err, "mini_batches")
}

func TestStepReportsEntropy(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	l, err := NewLocal(m, 0, Config{}, nil)
	require.NoError(t, err)
	res, err := l.TrainStep(context.Background(), &Batch{Samples: []Sample{validSample(8, 0)}})
	require.NoError(t, err)
	// A fresh model is close to uniform over the vocabulary.
	require.InDelta(t, math.Log(VocabSize), res.MeanEntropy, 0.05)
}

func TestNominalBatchScalesTheStepOfAShortBatch(t *testing.T) {
	step := func(nominal int) (before, after []float32, lr float64) {
		m, err := NewModel(ModelConfig{Context: 32, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
		require.NoError(t, err)
		l, err := NewLocal(m, 1, Config{Optim: OptimConfig{LR: 1e-2}, NominalBatch: nominal, Logger: slog.New(slog.DiscardHandler)}, nil)
		require.NoError(t, err)
		before = append([]float32{}, l.Snapshot().W...)
		res, err := l.TrainStep(context.Background(), &Batch{Objective: ObjectiveSFT, Samples: []Sample{validSample(12, 0)}})
		require.NoError(t, err)
		return before, l.Snapshot().W, res.LR
	}
	w0, full, lrFull := step(0)
	_, quarter, lrQuarter := step(4) // 1 sample of a nominal 4
	require.InDelta(t, 1e-2, lrFull, 1e-12)
	require.InDelta(t, 0.25e-2, lrQuarter, 1e-12)
	moved := 0
	for i := range w0 {
		d, q := float64(full[i]-w0[i]), float64(quarter[i]-w0[i])
		require.InDelta(t, d/4, q, 1e-6, "weight %d", i)
		if d != 0 {
			moved++
		}
	}
	require.Positive(t, moved)
	_, err := NewLocal(nil, 0, Config{NominalBatch: -1}, nil)
	require.Error(t, err)
}

// A batch's masks replace the trainer's: behaviour logprobs of -3 where
// the tiny model gives about -5.6 put every token's ratio far outside
// IcePop's [0.5, 2], so it masks them all; without masks none is.
func TestBatchMasksOverrideTheTrainer(t *testing.T) {
	m, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	l, err := NewLocal(m, 1, Config{}, nil)
	require.NoError(t, err)
	batch := func(masks *Masks) *Batch {
		a, b := validSample(8, 1), validSample(8, 1)
		a.GroupID, b.GroupID, b.Reward = "g", "g", 0
		return &Batch{Samples: []Sample{a, b}, Masks: masks}
	}
	res, err := l.TrainStep(context.Background(), batch(nil))
	require.NoError(t, err)
	require.Zero(t, res.IcePopMasked+res.KPopMasked)
	require.Equal(t, int64(1), res.Parent)
	res, err = l.TrainStep(context.Background(), batch(&Masks{IcePop: true, KPop: true}))
	require.NoError(t, err)
	require.Equal(t, res.TrainedTokens, res.IcePopMasked)
	require.Positive(t, res.KPopMasked)
	require.Equal(t, int64(2), res.Parent)
	_, err = l.TrainStep(context.Background(), batch(&Masks{IcePop: true, IcePopLow: 2}))
	require.ErrorContains(t, err, "icepop")
}
