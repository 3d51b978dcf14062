package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/demo"
	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TestToolSuitesAskWhatTheAgentsAsk: the tools deployment's suites pass
// the validation a user's suite passes, expect the held-out request's own
// tool and item, and render, as the gates send them, exactly the tokens
// the agents' sessions condition on at each step, the calls greedy and
// sampled as the agents sample, the answers sampled (the refusals stay
// greedy).
func TestToolSuitesAskWhatTheAgentsAsk(t *testing.T) {
	heldOut, err := demotask.GateHeldOut(demotask.ToolsTask)
	require.NoError(t, err)
	reg, safety, err := toolSuites(heldOut, demotask.GateSafetyPrompts())
	require.NoError(t, err)
	require.Len(t, reg, toolGreedyCalls+toolSampledCalls+toolAnswerSteps)
	for name, prompts := range map[string][]store.EvalPrompt{flow.GateRegression: reg, flow.GateSafety: safety} {
		items := make([]store.SuiteItem, len(prompts))
		for i, p := range prompts {
			items[i] = store.SuiteItem{Messages: p.Messages, Tools: p.Tools, Expect: p.Expect, Match: p.Match, MaxTokens: p.MaxTokens,
				Temperature: p.Temperature}
		}
		_, err := store.SuitePrompts(name, items)
		require.NoError(t, err, name)
	}

	call, sampled, answer := reg[0], reg[toolGreedyCalls], reg[toolGreedyCalls+toolSampledCalls]
	require.Zero(t, call.Temperature)
	require.Equal(t, demo.DefaultTemperature, sampled.Temperature)
	require.Equal(t, sampled.Match, call.Match)
	require.Equal(t, demo.DefaultTemperature, answer.Temperature)
	require.Zero(t, safety[0].Temperature)
	p := heldOut[0]
	want, err := store.ParseToolCallExpect(call.Expect)
	require.NoError(t, err)
	require.True(t, want.Matches([]inference.ToolCall{{Name: p.Tool, Arguments: demotask.ToolCallArgs(p)}}))
	require.False(t, want.Matches([]inference.ToolCall{{Name: "hue", Arguments: `{"item":"zzz"}`}}))

	msgs, tools, err := call.Conversation()
	require.NoError(t, err)
	got, err := trainer.RenderPrompt(msgs, tools, "", nil)
	require.NoError(t, err)
	agents, err := trainer.RenderPrompt([]inference.Message{{Role: inference.RoleUser, Content: p.Text}}, demotask.Tools(), "", nil)
	require.NoError(t, err)
	require.Equal(t, agents, got, "the call step is the agents' first call")

	q := heldOut[toolGreedyCalls+toolSampledCalls]
	msgs, tools, err = answer.Conversation()
	require.NoError(t, err)
	got, err = trainer.RenderPrompt(msgs, tools, "", nil)
	require.NoError(t, err)
	// The agents' second call continues the first's tokens (the gateway
	// passes them as the prefix) with the tool's result.
	conv := []inference.Message{{Role: inference.RoleUser, Content: q.Text}}
	first, err := trainer.RenderPrompt(conv, demotask.Tools(), "", nil)
	require.NoError(t, err)
	c := inference.ToolCall{ID: "call_0", Name: q.Tool, Arguments: demotask.ToolCallArgs(q)}
	conv = append(conv, inference.Message{Role: inference.RoleAssistant, ToolCalls: []inference.ToolCall{c}},
		inference.Message{Role: inference.RoleTool, ToolCallID: c.ID, Content: demotask.RunTool(q, q.Tool, c.Arguments)})
	second, err := trainer.RenderPrompt(conv, demotask.Tools(), "", append(first, demotask.CallIDs(c)...))
	require.NoError(t, err)
	require.Equal(t, trainer.Tokenizer{}.Decode(second), trainer.Tokenizer{}.Decode(got), "the answer step is the agents' second call")
	require.Equal(t, q.Want, answer.Expect)
}
