package trainer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

// copyTask is a small verifiable task: the prompt holds n letters from a
// small alphabet and the right answer repeats them. A constant answer scores
// 1/len(alphabet)^n, and the reward is the fraction of positions right.
type copyTask struct {
	alphabet string
	n        int
	shift    int // answer letter = prompt letter moved shift places in alphabet
}

func (c copyTask) prompt(rng *rand.Rand) (string, []int) {
	b := make([]byte, c.n)
	for i := range b {
		b[i] = c.alphabet[rng.IntN(len(c.alphabet))]
	}
	ids, _ := RenderPrompt([]inference.Message{{Role: "user", Content: string(b)}}, nil, "", nil)
	return string(b), ids
}

func (c copyTask) answer(q string) string {
	b := []byte(q)
	for i, ch := range b {
		j := strings.IndexByte(c.alphabet, ch)
		b[i] = c.alphabet[(j+c.shift)%len(c.alphabet)]
	}
	return string(b)
}

func (c copyTask) reward(q string, completion []int) (float64, bool) {
	want := c.answer(q)
	got := completion
	if len(got) > 0 && got[len(got)-1] == TokImEnd {
		got = got[:len(got)-1]
	}
	var right int
	for i := 0; i < len(want) && i < len(got); i++ {
		if got[i] == int(want[i]) {
			right++
		}
	}
	exact := right == len(want) && len(got) == len(want)
	return float64(right) / float64(max(len(want), len(got))), exact
}

func sampleFromIDs(prompt, completion []int, logprobs []float32, version int64) Sample {
	ids := append(append([]int{}, prompt...), completion...)
	n := len(ids)
	s := Sample{TokenIDs: ids, LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	for i := range completion {
		s.LossMask[len(prompt)+i] = 1
		s.Logprobs[len(prompt)+i] = logprobs[i]
		s.Versions[len(prompt)+i] = version
	}
	return s
}

func evalGreedy(t *testing.T, m *Model, task copyTask, rng *rand.Rand, n int) float64 {
	t.Helper()
	var prompts [][]int
	var qs []string
	for i := 0; i < n; i++ {
		q, ids := task.prompt(rng)
		qs, prompts = append(qs, q), append(prompts, ids)
	}
	zero := 0.0
	gens, err := m.Generate(context.Background(), prompts, SampleOptions{Temperature: &zero, MaxTokens: task.n + 2}, rng, nil)
	require.NoError(t, err)
	var ok int
	for i, g := range gens {
		if _, exact := task.reward(qs[i], g.IDs); exact {
			ok++
		}
	}
	return float64(ok) / float64(n)
}

// TestPolicyLearnsVerifiableTask is the seeded learning test: a cold start
// teaches only the answer format (random letters), then online GRPO through
// the Engine must make the greedy policy clearly better on fresh prompts.
func TestPolicyLearnsVerifiableTask(t *testing.T) {
	if testing.Short() {
		t.Skip("learning run")
	}
	ctx := context.Background()
	task := copyTask{alphabet: "abcde", n: 3, shift: 1}
	// Other seeds of this setup end between 0.52 and 1.0 (a letter the echo
	// prior is sure of can stay wrong for a while): the bound leaves room.
	const seed = 42
	rng := rand.New(rand.NewPCG(seed, 1))
	m, err := NewModel(ModelConfig{Context: 64, Layers: 2, Heads: 4, DModel: 64}, seed)
	require.NoError(t, err)
	eng, err := NewEngine(m, 0, EngineConfig{})
	require.NoError(t, err)
	tr, err := NewLocal(m, 0, Config{Optim: OptimConfig{LR: 3e-3}}, eng)
	require.NoError(t, err)

	// Cold start (a stand-in for a pretrained base model): supervised
	// echo of the prompt. The RL task then asks for every letter shifted by
	// one, which the base model never does.
	start := time.Now()
	for step := 0; step < 60; step++ {
		b := &Batch{Objective: ObjectiveSFT}
		for i := 0; i < 32; i++ {
			q, p := task.prompt(rng)
			ans := append(Tokenizer{}.Encode(q), TokImEnd)
			b.Samples = append(b.Samples, sampleFromIDs(p, ans, make([]float32, len(ans)), 0))
		}
		_, err := tr.TrainStep(ctx, b)
		require.NoError(t, err)
	}
	cur, base := eng.Current()
	before := evalGreedy(t, cur, task, rand.New(rand.NewPCG(7, 7)), 200)
	t.Logf("after cold start: greedy exact %.3f (%s)", before, time.Since(start))

	// Online RL starts a fresh optimizer on the base model, as a deployment
	// would, publishing into the same engine.
	tr, err = NewLocal(cur, base, Config{Optim: OptimConfig{LR: 1e-3}}, eng)
	require.NoError(t, err)

	// Sampling hotter than the sharp echo prior keeps exploring letters the
	// base model is sure about; the trainer scores at the same temperature.
	temp := 1.5
	const groups, groupSize = 16, 8
	for step := 0; step < 60; step++ {
		model, version := eng.Current()
		var prompts [][]int
		var qs []string
		for g := 0; g < groups; g++ {
			q, p := task.prompt(rng)
			for j := 0; j < groupSize; j++ {
				prompts, qs = append(prompts, p), append(qs, q)
			}
		}
		gens, err := model.Generate(ctx, prompts, SampleOptions{MaxTokens: task.n + 2, Temperature: &temp}, rng, nil)
		require.NoError(t, err)
		b := &Batch{Temperature: temp}
		var mean float64
		for i, g := range gens {
			s := sampleFromIDs(g.PromptIDs, g.IDs, g.Logprobs, version)
			s.GroupID = fmt.Sprint(i / groupSize)
			s.Reward, _ = task.reward(qs[i], g.IDs)
			mean += s.Reward
			b.Samples = append(b.Samples, s)
		}
		res, err := tr.TrainStep(ctx, b)
		require.NoError(t, err)
		if step%10 == 0 {
			t.Logf("step %d reward %.3f loss %.4f unique/total %d/%d", step, mean/float64(len(gens)), res.Loss, res.UniqueTokens, res.TotalTokens)
		}
	}
	cur, _ = eng.Current()
	after := evalGreedy(t, cur, task, rand.New(rand.NewPCG(7, 7)), 200)
	t.Logf("after GRPO: greedy exact %.3f (total %s)", after, time.Since(start))
	require.Less(t, before, 0.05, "the base model must not already solve the task")
	require.Greater(t, after-before, 0.4)
}
