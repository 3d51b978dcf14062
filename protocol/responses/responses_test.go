package responses

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

func newID(prefix string) string { return prefix + "test" }

// TestOutputItemsAreInput: a response's output items, sent back as input
// (or rebuilt from a stored chain), are the assistant message they came
// from, so a chained conversation is the one the model saw.
func TestOutputItemsAreInput(t *testing.T) {
	for _, m := range []inference.Message{
		{Role: inference.RoleAssistant, Content: "hello"},
		{Role: inference.RoleAssistant, Content: ""},
		{Role: inference.RoleAssistant, Reasoning: "think", Content: "then say"},
		{Role: inference.RoleAssistant, Reasoning: "think", ToolCalls: []inference.ToolCall{{ID: "call_1", Name: "f", Arguments: `{"a":1}`}}},
		{Role: inference.RoleAssistant, Content: "two calls", ToolCalls: []inference.ToolCall{
			{ID: "call_1", Name: "f", Arguments: `{}`}, {ID: "call_2", Name: "g", Arguments: `{"x":"y"}`}}},
	} {
		items := OutputItems(m, nil, &IDs{New: newID})
		b, err := json.Marshal(items)
		require.NoError(t, err)
		var in []InputItem
		require.NoError(t, json.Unmarshal(b, &in))
		got, err := Messages(in)
		require.NoError(t, err)
		require.Equal(t, []inference.Message{m}, got, string(b))
	}
}

func TestMessagesGatherAssistantTurns(t *testing.T) {
	raw := `[
	 {"role":"developer","content":"rules"},
	 {"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
	 {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"plan"}]},
	 {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
	 {"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
	 {"type":"function_call_output","call_id":"c1","output":"one"},
	 {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"two"}]},
	 {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done","annotations":[]}]},
	 {"type":"message","role":"assistant","content":[{"type":"output_text","text":"more"}]}
	]`
	var items []InputItem
	require.NoError(t, json.Unmarshal([]byte(raw), &items))
	got, err := Messages(items)
	require.NoError(t, err)
	require.Equal(t, []inference.Message{
		{Role: inference.RoleSystem, Content: "rules"},
		{Role: inference.RoleUser, Content: "a\nb"}, // parts joined by newlines, as vLLM joins them
		{Role: inference.RoleAssistant, Reasoning: "plan", ToolCalls: []inference.ToolCall{{ID: "c1", Name: "f", Arguments: "{}"}, {ID: "c2", Name: "g", Arguments: "{}"}}},
		{Role: inference.RoleTool, ToolCallID: "c1", Content: "one"},
		{Role: inference.RoleTool, ToolCallID: "c2", Content: "two"},
		{Role: inference.RoleAssistant, Content: "done"},
		{Role: inference.RoleAssistant, Content: "more"},
	}, got)
}

func TestNeutralMapsOptions(t *testing.T) {
	r, err := Decode([]byte(`{"model":"m","instructions":"be brief","input":"hi","max_output_tokens":5,"temperature":0.5,
		"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},
		"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"},"strict":true}},"parallel_tool_calls":false}`))
	require.NoError(t, err)
	req := r.Neutral([]inference.Message{{Role: inference.RoleUser, Content: "before"}, {Role: inference.RoleAssistant, Content: "ok"}})
	require.Equal(t, []inference.Message{{Role: inference.RoleSystem, Content: "be brief"},
		{Role: inference.RoleUser, Content: "before"}, {Role: inference.RoleAssistant, Content: "ok"}, {Role: inference.RoleUser, Content: "hi"}}, req.Messages)
	require.Equal(t, 5, req.MaxTokens)
	require.Equal(t, "f", req.ToolChoice)
	require.False(t, *req.ParallelToolCalls)
	require.JSONEq(t, `{"type":"json_schema","json_schema":{"name":"s","description":"","schema":{"type":"object"},"strict":true}}`, string(req.ResponseFormat))
	env := r.Envelope("resp_1", 7)
	require.Equal(t, "in_progress", env.Status)
	require.Equal(t, 0.5, env.Temperature)
	require.False(t, env.ParallelToolCalls)
	require.JSONEq(t, `{"type":"function","name":"f"}`, string(env.ToolChoice))
}

// TestStreamerMatchesFinal: events add each item once, in order, and the
// final response lists the streamed items with their ids, then the ones a
// backend held back.
func TestStreamerMatchesFinal(t *testing.T) {
	var events []map[string]any
	s := &Streamer{IDs: IDs{New: func(p string) string { return fmt.Sprintf("%s%d", p, len(events)) }},
		Emit: func(name string, ev map[string]any) error { events = append(events, ev); return nil }}
	r, err := Decode([]byte(`{"model":"m","input":"x"}`))
	require.NoError(t, err)
	env := r.Envelope("resp_1", 1)
	require.NoError(t, s.Start(env))
	require.NoError(t, s.Delta(inference.Delta{Reasoning: "hm"}, nil))
	require.NoError(t, s.Delta(inference.Delta{Text: "he"}, nil))
	require.NoError(t, s.Delta(inference.Delta{Text: "llo"}, nil))
	g := &inference.Response{Message: inference.Message{Role: inference.RoleAssistant, Reasoning: "hm", Content: "hello",
		ToolCalls: []inference.ToolCall{{ID: "call_x", Name: "f", Arguments: "{}"}}}, FinishReason: inference.FinishToolCalls}
	env.Finish(g, nil, &s.IDs, 2)
	require.NoError(t, s.Finish(&env))
	var added, done []string
	for i, ev := range events {
		require.Equal(t, i, ev["sequence_number"])
		switch ev["type"] {
		case EventItemAdded:
			added = append(added, ev["item"].(Item).ID)
		case EventItemDone:
			done = append(done, ev["item"].(Item).ID)
		}
	}
	require.Equal(t, added, done)
	require.Len(t, env.Output, 3)
	for i, it := range env.Output {
		require.Equal(t, added[i], it.ID)
	}
	require.Equal(t, []string{"reasoning", "message", "function_call"}, []string{env.Output[0].Type, env.Output[1].Type, env.Output[2].Type})
	require.Equal(t, EventCompleted, events[len(events)-1]["type"])
}

// FuzzDecode: no body makes Decode or Neutral panic, and what Decode
// accepts is stored and read back (a chained conversation) as the same
// messages.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi"}`,
		`{"model":"m","input":[{"role":"user","content":"a"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
		`{"model":"m","input":[{"type":"reasoning","content":[{"type":"reasoning_text","text":"t"}]}],"tools":[{"type":"function","name":"f"}],"tool_choice":"required"}`,
		`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{}}},"include":["message.output_text.logprobs"]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := Decode(body)
		if err != nil {
			return
		}
		req := r.Neutral(nil)
		if len(req.Messages) == 0 {
			t.Fatalf("decoded input %s converted to no message", r.Input)
		}
		stored, err := json.Marshal(r.Items())
		if err != nil {
			t.Fatalf("store items: %v", err)
		}
		var back []InputItem
		if err := json.Unmarshal(stored, &back); err != nil {
			t.Fatalf("read stored items %s: %v", stored, err)
		}
		again, err := Messages(back)
		if err != nil {
			t.Fatalf("stored items %s no longer convert: %v", stored, err)
		}
		if !reflect.DeepEqual(again, r.input) {
			t.Fatalf("stored items read back as %+v, not %+v", again, r.input)
		}
	})
}
