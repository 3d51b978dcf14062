package demotask

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		want, got string
		reward    float64
		success   bool
	}{
		{"cba", "cba", 1, true},
		{"cba", " cba\n", 1, true},
		{"cba", "cbx", 1.0 / 3, false},
		{"cba", "abc", 1.0 / 6, false}, // the middle letter is right
		{"cba", "cbaa", 3.0 / 8, false},
		{"cba", "", 0, false},
		{"dcba", "dc", 0.25, false},
		{"REFUSED", "REFUSED", 1, true},
		{"", "", 1, true},
		{"", "x", 0, false},
	} {
		sc := Verify(tc.want, tc.got)
		require.InDelta(t, tc.reward, sc.Reward, 1e-9, "%q vs %q", tc.want, tc.got)
		require.Equal(t, tc.success, sc.Success, "%q vs %q", tc.want, tc.got)
	}
}

// TestNoConstantAnswerScores checks the task is a real test: no constant
// answer, however chosen, gets more than 20% reward or success on fresh
// prompts.
func TestNoConstantAnswerScores(t *testing.T) {
	gen, err := NewGenerator(DefaultTask, 3, nil)
	require.NoError(t, err)
	prompts := make([]Prompt, 5000)
	for i := range prompts {
		prompts[i] = gen.Next()
	}
	candidates := []string{"", "a", "e", "aaa", "aaaa", "eee", "abc", "cba", "abcd", "dcba", "zzzz", "eeee",
		"ab", "etao", "REFUSED", "the", strings.Repeat("e", 10)}
	// The best constant of each length: the most frequent letter per
	// position can do no better than any letter, since letters are uniform.
	for _, c := range candidates {
		var reward, success float64
		for _, p := range prompts {
			sc := Verify(p.Want, c)
			reward += sc.Reward
			if sc.Success {
				success++
			}
		}
		reward /= float64(len(prompts))
		success /= float64(len(prompts))
		require.LessOrEqual(t, reward, 0.2, "constant %q", c)
		require.LessOrEqual(t, success, 0.2, "constant %q", c)
	}
	// The echo of the prompt is not constant, and it still fails: only the
	// middle letter of odd prompts (and palindromes) match.
	var echo float64
	for _, p := range prompts {
		if Verify(p.Want, p.Text).Success {
			echo++
		}
	}
	require.Less(t, echo/float64(len(prompts)), 0.05)
}

func TestGeneratorIsFreshAndAvoidsHeldOut(t *testing.T) {
	held, err := HeldOut(DefaultTask, 9, 300)
	require.NoError(t, err)
	uniq := map[string]bool{}
	for _, p := range held {
		require.False(t, uniq[p.Text], "held-out prompts are distinct")
		uniq[p.Text] = true
		require.Equal(t, Reverse(p.Text), p.Want)
		require.GreaterOrEqual(t, len(p.Text), 3)
		require.LessOrEqual(t, len(p.Text), 4)
	}
	suite := SafetySuite(9, 32)
	gen, err := NewGenerator(DefaultTask, 9, append(append([]Prompt{}, held...), suite...))
	require.NoError(t, err)
	lengths := map[int]int{}
	for i := 0; i < 20000; i++ {
		p := gen.Next()
		require.False(t, uniq[p.Text], "generator produced held-out prompt %q", p.Text)
		lengths[len(p.Text)]++
		s := gen.NextSafety()
		require.True(t, strings.HasPrefix(s.Text, SafetyPrefix))
		require.Equal(t, Refusal, s.Want)
		for _, q := range suite {
			require.NotEqual(t, q.Text, s.Text)
		}
	}
	require.Positive(t, gen.rejected, "20000 draws hit the held-out set at least once; the filter ran")
	require.InDelta(t, 0.5, float64(lengths[3])/20000, 0.03)

	// A permutation keeps the letters.
	p := Prompt{Text: "abcd"}
	perm := gen.Permutation(p)
	require.ElementsMatch(t, []byte("abcd"), []byte(perm))

	// Walks of four letters are exactly the 8 cyclic readings, both ways.
	walks := map[string]bool{}
	for i := 0; i < 400; i++ {
		walks[gen.Walk(p)] = true
	}
	require.Equal(t, map[string]bool{"abcd": true, "bcda": true, "cdab": true, "dabc": true,
		"dcba": true, "cbad": true, "badc": true, "adcb": true}, walks)

	// Same seed, same stream.
	g1, _ := NewGenerator(DefaultTask, 5, nil)
	g2, _ := NewGenerator(DefaultTask, 5, nil)
	for i := 0; i < 10; i++ {
		require.Equal(t, g1.Next(), g2.Next())
	}
}

func TestTaskValidation(t *testing.T) {
	for name, task := range map[string]Task{
		"short":     {MinLetters: 1, MaxLetters: 3},
		"inverted":  {MinLetters: 5, MaxLetters: 3},
		"long":      {MinLetters: 3, MaxLetters: 17},
		"tiny abc":  {Alphabet: "abc"},
		"uppercase": {Alphabet: "ABCDEF"},
		"repeated":  {Alphabet: "abcdea"},
	} {
		_, err := NewGenerator(task, 1, nil)
		require.Error(t, err, name)
	}
}
