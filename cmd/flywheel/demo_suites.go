package main

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flywheel-ai/flywheel/demo"
	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

// installDemoSuites gives the demo deployment its own suites: its held-out
// prompts (greedy) for the regression gate and the watchdog, and its
// refusal prompts for the safety gate (the built-in suite asks for
// refusals in words, which the demo policy never learnt to give, so both
// sides would score 0). Registering the same suites again keeps their
// results, and so the anchor.
func installDemoSuites(ctx context.Context, pool *pgxpool.Pool, deployment string, task demotask.Task) error {
	heldOut, err := demotask.GateHeldOut(task)
	if err != nil {
		return err
	}
	reg, safety := letterSuite(heldOut, store.MatchExact), letterSuite(demotask.GateSafetyPrompts(), store.MatchExact)
	if task.Kind == demotask.KindTools {
		if reg, safety, err = toolSuites(heldOut, demotask.GateSafetyPrompts()); err != nil {
			return err
		}
	}
	for name, prompts := range map[string][]store.EvalPrompt{flow.GateRegression: reg, flow.GateSafety: safety} {
		if _, err := store.SetEvalSuite(ctx, pool, deployment, name, prompts); err != nil {
			return err
		}
	}
	return nil
}

// letterSuite asks each prompt alone, judged by match.
func letterSuite(ps []demotask.Prompt, match string) []store.EvalPrompt {
	out := make([]store.EvalPrompt, len(ps))
	for i, p := range ps {
		out[i] = store.EvalPrompt{Messages: oaMessages(oaUser(p.Text)), Expect: p.Want, Match: match, MaxTokens: demotask.AnswerTokens(p)}
	}
	return out
}

// The tools task's suites judge the two steps of a session apart, with
// the tools offered as the agents offer them: held-out requests must call
// the right tool with the request's item (what RL learns), conversations
// that end on that call's result must answer with it (what the warm-up
// taught), and the safety prompts must be refused with the tools on offer.
// The calls are asked twice over, on different requests: greedily, as the
// reported success answers, and at the agents' temperature (seeded, as
// every gate samples). A greedy suite alone passed versions whose sampled
// calls misspelt a name or the arguments, which serve the agents broken
// sessions; a sampled suite alone promoted a version whose greedy sessions
// fell from 0.650 to 0.505 on prompts the gates never saw. The greedy calls
// weigh most, because the reported success is greedy. Fewer than the
// letters' 800: a call is about 45 tokens to generate, not 5, and with 400
// calls and 100 answers the regression gate took 20 s of a 35 s release,
// so samples trained about six versions behind the one they trained.
const (
	toolGreedyCalls  = 200
	toolSampledCalls = 100
	toolAnswerSteps  = 50
)

func toolSuites(heldOut, safety []demotask.Prompt) (reg, safe []store.EvalPrompt, err error) {
	tools, err := json.Marshal(oaTools())
	if err != nil {
		return nil, nil, err
	}
	for i, p := range heldOut[:toolGreedyCalls+toolSampledCalls+toolAnswerSteps] {
		args := demotask.ToolCallArgs(p)
		if i < toolGreedyCalls+toolSampledCalls {
			temperature := 0.0
			if i >= toolGreedyCalls {
				temperature = demo.DefaultTemperature
			}
			want, _ := json.Marshal(map[string]any{"name": p.Tool, "arguments": json.RawMessage(args)})
			reg = append(reg, store.EvalPrompt{Messages: oaMessages(oaUser(p.Text)), Tools: tools, Expect: string(want),
				Match: store.MatchToolCall, MaxTokens: demotask.ToolTurnTokens, Temperature: temperature})
			continue
		}
		call := map[string]any{"id": "call_0", "type": "function", "function": map[string]string{"name": p.Tool, "arguments": args}}
		msgs := oaMessages(oaUser(p.Text), map[string]any{"role": "assistant", "content": "", "tool_calls": []any{call}},
			map[string]any{"role": "tool", "tool_call_id": "call_0", "content": demotask.RunTool(p, p.Tool, args)})
		reg = append(reg, store.EvalPrompt{Messages: msgs, Tools: tools, Expect: p.Want, Match: store.MatchExact, MaxTokens: demotask.ToolTurnTokens,
			Temperature: demo.DefaultTemperature})
	}
	for _, p := range safety {
		safe = append(safe, store.EvalPrompt{Messages: oaMessages(oaUser(p.Text)), Tools: tools, Expect: p.Want,
			Match: store.MatchExact, MaxTokens: demotask.ToolTurnTokens})
	}
	return reg, safe, nil
}

func oaUser(text string) map[string]any { return map[string]any{"role": "user", "content": text} }

// oaMessages is messages in OpenAI's chat form, as a suite holds them.
func oaMessages(msgs ...map[string]any) []byte {
	b, _ := json.Marshal(msgs) // maps of strings and slices always marshal
	return b
}

// oaTools are the tools task's tools in OpenAI's form.
func oaTools() []any {
	var out []any
	for _, t := range demotask.Tools() {
		out = append(out, map[string]any{"type": "function", "function": map[string]any{"name": t.Name, "parameters": t.Parameters}})
	}
	return out
}
