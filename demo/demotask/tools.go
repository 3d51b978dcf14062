package demotask

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/trainer"
)

// The tools task (Task.Kind KindTools): a multi-turn, tool-using session
// rewarded only at its end. The user asks for one attribute of an item
// ("cost of kqz?"); the agent offers six lookup tools, one per attribute,
// whose names are not the words the user asks with (cost is answered by
// "price", color by "hue"). Every item's attributes are fresh random
// letters, so the answer cannot be known, only looked up: the model must
// call the right tool with the item from the request (its first call),
// read the tool's result and answer with it (its second call). The reward
// judges only that final answer, so which tool the first call chose is
// credited through the session's end reward alone: a credit-assignment
// problem across a step the model did not write (the tool result).
//
// The warm-up teaches the format (call some tool with the item, then
// answer with what it returned) choosing the tool at random, so the base
// succeeds about one time in six; no constant tool does better, and an
// answer that calls no tool practically never succeeds.

// KindTools is the tools task's Task.Kind.
const KindTools = "tools"

// ToolSpec is one of the tools task's tools.
type ToolSpec struct {
	// Name is what the model calls.
	Name string
	// Asks is the word a user asks for this tool's attribute with.
	Asks string
}

// ToolSet is the tools task's tools, in the order the agents offer them.
var ToolSet = []ToolSpec{
	{Name: "hue", Asks: "color"},
	{Name: "scale", Asks: "weight"},
	{Name: "price", Asks: "cost"},
	{Name: "date", Asks: "year"},
	{Name: "locate", Asks: "place"},
	{Name: "maker", Asks: "brand"},
}

// ToolArg is the one argument every tool takes: the item.
const ToolArg = "item"

// ToolsTask is the tools demo's task: items of three letters.
var ToolsTask = Task{Kind: KindTools, MinLetters: 3, MaxLetters: 3, Alphabet: DefaultTask.Alphabet}

// factLetters is the length of a tool's answer.
const factLetters = 3

// Tools are the tools as an agent offers them: one string parameter, the
// item, and no description (the model learns what each does from the
// reward; at this scale descriptions only cost tokens).
func Tools() []inference.Tool {
	params := json.RawMessage(`{"type":"object","properties":{"` + ToolArg + `":{"type":"string"}},"required":["` + ToolArg + `"]}`)
	out := make([]inference.Tool, len(ToolSet))
	for i, t := range ToolSet {
		out[i] = inference.Tool{Name: t.Name, Parameters: params}
	}
	return out
}

// nextTools draws a tools-task prompt: an attribute, an item and a fresh
// answer of every tool for it (all different, so a wrong tool's answer is
// never the right one).
func (g *Generator) nextTools() Prompt {
	for {
		attr := g.rng.IntN(len(ToolSet))
		item := g.letters(g.task.MinLetters + g.rng.IntN(g.task.MaxLetters-g.task.MinLetters+1))
		text := ToolSet[attr].Asks + " of " + item + "?"
		if g.heldOut[text] {
			g.rejected++
			continue
		}
		facts := make([]string, len(ToolSet))
		for i := range facts {
			for facts[i] == "" || slices.Contains(facts[:i], facts[i]) {
				facts[i] = g.letters(factLetters)
			}
		}
		return Prompt{Text: text, Want: facts[attr], Tool: ToolSet[attr].Name, Item: item, Facts: facts}
	}
}

func (g *Generator) letters(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = g.task.Alphabet[g.rng.IntN(len(g.task.Alphabet))]
	}
	return string(b)
}

// RandomTool is a tool drawn uniformly: the warm-up's choice.
func (g *Generator) RandomTool() string { return ToolSet[g.rng.IntN(len(ToolSet))].Name }

// RunTool executes a call of tool name with JSON arguments args for the
// session of p, as the agent's tool runtime does: the attribute of p's
// item, or an error text (the model gets it as the tool's result).
func RunTool(p Prompt, name, args string) string {
	i := -1
	for j, t := range ToolSet {
		if t.Name == name {
			i = j
		}
	}
	if i < 0 || i >= len(p.Facts) {
		return fmt.Sprintf("error: no tool %q", name)
	}
	var a map[string]any
	if err := json.Unmarshal([]byte(args), &a); err != nil {
		return "error: arguments are not a JSON object"
	}
	item, _ := a[ToolArg].(string)
	if item != p.Item {
		return fmt.Sprintf("error: no item %q", item)
	}
	return p.Facts[i]
}

// ToolCallArgs are the arguments of a call for p's item.
func ToolCallArgs(p Prompt) string {
	b, _ := json.Marshal(map[string]string{ToolArg: p.Item})
	return string(b)
}

// MaxToolTurns bounds the model calls of one tools session: the tool call,
// the answer, and one more call the model may spend on another tool.
const MaxToolTurns = 3

// ToolTurnTokens is every tools-session call's max_tokens: room for a tool
// call (about 45 tokens) and for any answer.
const ToolTurnTokens = 64

// toolsSamples are the warm-up's two supervised steps of one session of p
// that calls tool: the call (the user's request with the tools offered)
// and the answer (the whole conversation, the tool's result last). Safety
// prompts get one step, the refusal.
func toolsSamples(p Prompt, tool string) ([]trainer.Sample, error) {
	tools := Tools()
	msgs := []inference.Message{{Role: inference.RoleUser, Content: p.Text}}
	if p.Want == Refusal {
		s, err := sftStep(msgs, tools, AnswerIDs(Refusal))
		return []trainer.Sample{s}, err
	}
	call := inference.ToolCall{ID: "call_0", Name: tool, Arguments: ToolCallArgs(p)}
	first, err := sftStep(msgs, tools, CallIDs(call))
	if err != nil {
		return nil, err
	}
	msgs = append(msgs,
		inference.Message{Role: inference.RoleAssistant, ToolCalls: []inference.ToolCall{call}},
		inference.Message{Role: inference.RoleTool, ToolCallID: call.ID, Content: RunTool(p, call.Name, call.Arguments)})
	second, err := sftStep(msgs, tools, AnswerIDs(RunTool(p, call.Name, call.Arguments)))
	if err != nil {
		return nil, err
	}
	return []trainer.Sample{first, second}, nil
}

// CallIDs are the completion tokens of a message that only makes call.
func CallIDs(call inference.ToolCall) []int {
	var tok trainer.Tokenizer
	text := `{"name":` + quote(call.Name) + `,"arguments":` + call.Arguments + `}`
	return append(append(append([]int{trainer.TokToolStart}, tok.Encode(text)...), trainer.TokToolEnd), trainer.TokImEnd)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func sftStep(msgs []inference.Message, tools []inference.Tool, completion []int) (trainer.Sample, error) {
	p, err := trainer.RenderPrompt(msgs, tools, "", nil)
	if err != nil {
		return trainer.Sample{}, fmt.Errorf("render prompt: %w", err)
	}
	ids := append(append([]int{}, p...), completion...)
	mask := make([]uint8, len(ids))
	for i := len(p); i < len(ids); i++ {
		mask[i] = 1
	}
	return trainer.Sample{TokenIDs: ids, LossMask: mask}, nil
}

// Session is one session run in process: the generation of each of its
// model calls, in order (one for a single-call task), and its final
// answer ("" when it never answered).
type Session struct {
	Calls  []trainer.Generation
	Answer string
}

// ToolsSessions runs a tools session of every prompt in process and
// returns each session's final answer: RunToolsSessions' answers.
func ToolsSessions(ctx context.Context, m *trainer.Model, prompts []Prompt, temperature float64, rng *rand.Rand) ([]string, error) {
	sessions, err := RunToolsSessions(ctx, m, prompts, temperature, rng)
	if err != nil {
		return nil, err
	}
	answers := make([]string, len(sessions))
	for i, s := range sessions {
		answers[i] = s.Answer
	}
	return answers, nil
}

// RunToolsSessions runs a tools session of every prompt in process, the
// calls of all sessions batched turn by turn (greedy at temperature 0),
// executing each tool call as the agents do.
func RunToolsSessions(ctx context.Context, m *trainer.Model, prompts []Prompt, temperature float64, rng *rand.Rand) ([]Session, error) {
	tools := Tools()
	sessions := make([]Session, len(prompts))
	live := make([]int, len(prompts))
	msgs := make([][]inference.Message, len(prompts))
	for i, p := range prompts {
		live[i] = i
		msgs[i] = []inference.Message{{Role: inference.RoleUser, Content: p.Text}}
	}
	for turn := 0; turn < MaxToolTurns && len(live) > 0; turn++ {
		ids := make([][]int, len(live))
		for j, i := range live {
			var err error
			if ids[j], err = trainer.RenderPrompt(msgs[i], tools, "", nil); err != nil {
				return nil, err
			}
		}
		gens, err := m.Generate(ctx, ids, trainer.SampleOptions{Temperature: &temperature, MaxTokens: ToolTurnTokens}, rng, nil)
		if err != nil {
			return nil, err
		}
		var next []int
		for j, i := range live {
			sessions[i].Calls = append(sessions[i].Calls, gens[j])
			content, calls := trainer.ParseAssistant(AnswerText(gens[j].IDs), fmt.Sprintf("call_%d", turn))
			if len(calls) == 0 {
				sessions[i].Answer = content
				continue
			}
			msgs[i] = append(msgs[i], inference.Message{Role: inference.RoleAssistant, Content: content, ToolCalls: calls})
			for _, c := range calls {
				msgs[i] = append(msgs[i], inference.Message{Role: inference.RoleTool, ToolCallID: c.ID, Content: RunTool(prompts[i], c.Name, c.Arguments)})
			}
			next = append(next, i)
		}
		live = next
	}
	return sessions, nil
}

// The demo's tasks by the name `flywheel demo --task` takes.
const (
	TaskLetters = "letters"
	TaskTools   = "tools"
)

// Named is the demo task called name.
func Named(name string) (Task, error) {
	switch name {
	case "", TaskLetters:
		return DefaultTask, nil
	case TaskTools:
		return ToolsTask, nil
	}
	return Task{}, fmt.Errorf("demo task %q: want %q or %q", name, TaskLetters, TaskTools)
}

// ID labels the task's sessions (task_id): running baselines key on it.
func (t Task) ID() string {
	if t.Kind == KindTools {
		return "demo-tools-lookup"
	}
	return "demo-reverse-letters"
}
