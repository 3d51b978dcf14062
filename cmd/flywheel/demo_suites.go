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
// weigh most, because the reported success is greedy.
//
// All of the deployment's 800 gate prompts, three in four asked
// greedily. A version that learns one more tool often loses another (its
// greedy choice on one question flips to the right tool while another's
// flips away), so two versions of about the same score disagree on 20-57%
// of the greedy calls (their sampled calls, drawn with the same numbers,
// on 3-16%). With 200 greedy calls the paired standard error was
// 0.020-0.034 and the gate held back even swaps that gained (run 19's
// v88-v90, 0.731-0.743 against the anchor's 0.723); with 600 it is
// 0.002-0.016, a lost tool is shown to regress and a swap passes. The
// regression gate then takes about 6.7 s of a release instead of 2.1
// (docs/demo.md).
const (
	toolGreedyCalls  = 600
	toolSampledCalls = 150
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
