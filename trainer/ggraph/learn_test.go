package ggraph

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/trainer"
)

// shiftTask: the prompt holds three letters of "abcde" and the right answer
// is each letter moved one place on; the reward is the fraction right. The
// same task as trainer's seeded learning test.
type shiftTask struct{}

const shiftAlphabet = "abcde"

func (shiftTask) prompt(rng *rand.Rand) (string, []int) {
	b := make([]byte, 3)
	for i := range b {
		b[i] = shiftAlphabet[rng.IntN(len(shiftAlphabet))]
	}
	ids, _ := trainer.RenderPrompt([]inference.Message{{Role: "user", Content: string(b)}}, nil, "", nil)
	return string(b), ids
}

func (shiftTask) reward(q string, completion []int) (float64, bool) {
	if n := len(completion); n > 0 && completion[n-1] == trainer.TokImEnd {
		completion = completion[:n-1]
	}
	right := 0
	for i := 0; i < len(q) && i < len(completion); i++ {
		j := (int(q[i]-'a') + 1) % len(shiftAlphabet)
		if completion[i] == int(shiftAlphabet[j]) {
			right++
		}
	}
	return float64(right) / float64(max(len(q), len(completion))), right == len(q) && len(completion) == len(q)
}

func trainedSample(prompt, completion []int, logprobs []float32, version int64) trainer.Sample {
	ids := append(append([]int{}, prompt...), completion...)
	s := trainer.Sample{TokenIDs: ids, LossMask: make([]uint8, len(ids)), Logprobs: make([]float32, len(ids)), Versions: make([]int64, len(ids))}
	for i := range completion {
		s.LossMask[len(prompt)+i], s.Logprobs[len(prompt)+i], s.Versions[len(prompt)+i] = 1, logprobs[i], version
	}
	return s
}

func greedyExact(t *testing.T, m *trainer.Model, rng *rand.Rand, n int) float64 {
	t.Helper()
	var prompts [][]int
	var qs []string
	for i := 0; i < n; i++ {
		q, ids := shiftTask{}.prompt(rng)
		qs, prompts = append(qs, q), append(prompts, ids)
	}
	zero := 0.0
	gens, err := m.Generate(context.Background(), prompts, trainer.SampleOptions{Temperature: &zero, MaxTokens: 5}, rng, nil)
	require.NoError(t, err)
	ok := 0
	for i, g := range gens {
		if _, exact := (shiftTask{}).reward(qs[i], g.IDs); exact {
			ok++
		}
	}
	return float64(ok) / float64(n)
}

// TestGorgoniaPolicyLearnsVerifiableTask is trainer's seeded learning test
// with every gradient computed by the gorgonia graph: an SFT cold start on
// echoing the prompt, then online GRPO (sampling by the Engine the Trainer
// publishes to) must make the greedy policy solve the shifted task.
func TestGorgoniaPolicyLearnsVerifiableTask(t *testing.T) {
	if testing.Short() {
		t.Skip("learning run")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(42, 1))
	m, err := trainer.NewModel(trainer.ModelConfig{Context: 64, Layers: 2, Heads: 4, DModel: 64}, 42)
	require.NoError(t, err)
	eng, err := trainer.NewEngine(m, 0, trainer.EngineConfig{})
	require.NoError(t, err)
	tr, err := NewTrainer(m, 0, trainer.Config{Optim: trainer.OptimConfig{LR: 3e-3}}, eng)
	require.NoError(t, err)
	defer tr.Close()

	start := time.Now()
	for step := 0; step < 60; step++ {
		b := &trainer.Batch{Objective: trainer.ObjectiveSFT}
		for i := 0; i < 32; i++ {
			q, p := shiftTask{}.prompt(rng)
			ans := append(trainer.Tokenizer{}.Encode(q), trainer.TokImEnd)
			b.Samples = append(b.Samples, trainedSample(p, ans, make([]float32, len(ans)), 0))
		}
		_, err := tr.TrainStep(ctx, b)
		require.NoError(t, err)
	}
	cur, _ := eng.Current()
	before := greedyExact(t, cur, rand.New(rand.NewPCG(7, 7)), 200)
	t.Logf("after cold start: greedy exact %.3f (%s)", before, time.Since(start))

	const groups, groupSize = 16, 8
	for step := 0; step < 60; step++ {
		model, version := eng.Current()
		var prompts [][]int
		var qs []string
		for g := 0; g < groups; g++ {
			q, p := shiftTask{}.prompt(rng)
			for j := 0; j < groupSize; j++ {
				prompts, qs = append(prompts, p), append(qs, q)
			}
		}
		gens, err := model.Generate(ctx, prompts, trainer.SampleOptions{MaxTokens: 5}, rng, nil)
		require.NoError(t, err)
		b := &trainer.Batch{}
		for i, g := range gens {
			s := trainedSample(g.PromptIDs, g.IDs, g.Logprobs, version)
			s.GroupID = fmt.Sprint(i / groupSize)
			s.Reward, _ = shiftTask{}.reward(qs[i], g.IDs)
			b.Samples = append(b.Samples, s)
		}
		res, err := tr.TrainStep(ctx, b)
		require.NoError(t, err)
		if step%10 == 0 {
			t.Logf("step %d mean reward %.3f loss %.4f", step, res.MeanReward, res.Loss)
		}
	}
	cur, _ = eng.Current()
	after := greedyExact(t, cur, rand.New(rand.NewPCG(7, 7)), 200)
	t.Logf("after GRPO: greedy exact %.3f (total %s)", after, time.Since(start))
	require.Less(t, before, 0.05, "the base model must not already solve the task")
	require.Greater(t, after-before, 0.6)
}
