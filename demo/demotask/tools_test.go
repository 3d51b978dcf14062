package demotask

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/trainer"
)

// TestToolsTaskIsAChoice checks the tools task is a real test: calling the
// same tool whatever the request (with the right item) succeeds at most
// one time in five, and so does answering without a tool; only the tool
// that answers the request returns the answer.
func TestToolsTaskIsAChoice(t *testing.T) {
	gen, err := NewGenerator(ToolsTask, 3, nil)
	require.NoError(t, err)
	prompts := make([]Prompt, 6000)
	for i := range prompts {
		prompts[i] = gen.Next()
	}
	for _, tool := range ToolSet {
		success := 0.0
		for _, p := range prompts {
			if Verify(p.Want, RunTool(p, tool.Name, ToolCallArgs(p))).Success {
				success++
			}
		}
		require.LessOrEqual(t, success/float64(len(prompts)), 0.2, "always calling %s", tool.Name)
	}
	// Without a tool the best an answer can do is guess letters: the
	// commonest answer of this many sessions.
	count := map[string]int{}
	best := 0
	for _, p := range prompts {
		count[p.Want]++
		best = max(best, count[p.Want])
	}
	require.LessOrEqual(t, float64(best)/float64(len(prompts)), 0.01, "a constant answer")
	p := prompts[0]
	require.Equal(t, p.Want, RunTool(p, p.Tool, ToolCallArgs(p)))
	require.Contains(t, RunTool(p, p.Tool, `{"item":"zzzzz"}`), "error")
	require.Contains(t, RunTool(p, "nope", ToolCallArgs(p)), "error")
	require.Contains(t, RunTool(p, p.Tool, `[1]`), "error")
	for _, q := range prompts {
		seen := map[string]bool{}
		for _, f := range q.Facts {
			require.False(t, seen[f], "a wrong tool's answer is never the right one")
			seen[f] = true
		}
	}
}

// TestToolsWarmUpTeachesTheFormatOnly: the warm-up's two steps of a
// session train the call and the answer, and nothing the model did not
// write; the tool it calls is drawn uniformly, whatever was asked.
func TestToolsWarmUpTeachesTheFormatOnly(t *testing.T) {
	gen, err := NewGenerator(ToolsTask, 1, nil)
	require.NoError(t, err)
	p := gen.Next()
	ss, err := toolsSamples(p, "locate")
	require.NoError(t, err)
	require.Len(t, ss, 2)
	var tok trainer.Tokenizer
	trained := func(s trainer.Sample) string {
		var ids []int
		for i, m := range s.LossMask {
			if m == 1 {
				ids = append(ids, s.TokenIDs[i])
			}
		}
		return tok.Decode(ids)
	}
	require.Equal(t, `<tool_call>{"name":"locate","arguments":{"item":"`+p.Item+`"}}</tool_call><|im_end|>`, trained(ss[0]))
	require.Equal(t, RunTool(p, "locate", ToolCallArgs(p))+"<|im_end|>", trained(ss[1]))
	require.Equal(t, ss[0].TokenIDs, ss[1].TokenIDs[:len(ss[0].TokenIDs)], "the answer's step continues the call's")
	picks := map[string]int{}
	for range 6000 {
		picks[gen.RandomTool()]++
	}
	for _, tool := range ToolSet {
		require.InDelta(t, 1000, picks[tool.Name], 150, tool.Name)
	}
	safety, err := toolsSamples(gen.NextSafety(), "locate")
	require.NoError(t, err)
	require.Len(t, safety, 1)
	require.Equal(t, Refusal+"<|im_end|>", trained(safety[0]))
}
