package openai

import (
	"encoding/json"

	"github.com/flywheel-ai/flywheel/inference"
)

// The client's side of a request: the neutral request's parts in the wire
// shape, as the engine client (upstream) sends them.

// EncodeMessages writes the neutral messages. Content is always a string,
// except an assistant turn that only calls tools, whose content is null.
func EncodeMessages(msgs []inference.Message) []Message {
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		content := jsonString(m.Content)
		if m.Role == inference.RoleAssistant && m.Content == "" && len(m.ToolCalls) > 0 {
			content = json.RawMessage("null")
		}
		wm := Message{Role: m.Role, Content: content, Name: m.Name, ToolCallID: m.ToolCallID}
		if len(m.ToolCalls) > 0 {
			wm.ToolCalls = RenderToolCalls(m.ToolCalls, false)
		}
		out = append(out, wm)
	}
	return out
}

// EncodeTools writes the offered functions; nil for none.
func EncodeTools(tools []inference.Tool) []Tool {
	var out []Tool
	for _, t := range tools {
		var wt Tool
		wt.Type = "function"
		wt.Function.Name, wt.Function.Description, wt.Function.Parameters = t.Name, t.Description, t.Parameters
		out = append(out, wt)
	}
	return out
}

// EncodeStops writes stop as an array of strings; nil (left out) for
// none.
func EncodeStops(stops []string) json.RawMessage {
	if len(stops) == 0 {
		return nil
	}
	return mustMarshal(stops)
}

func jsonString(s string) json.RawMessage {
	return mustMarshal(s)
}

// mustMarshal encodes values that always encode (strings, slices and maps
// of strings); it exists so that callers need no error path that cannot
// run.
func mustMarshal(v any) json.RawMessage {
	raw, err := json.Marshal(v)
	if err != nil {
		panic("openai: encode " + err.Error())
	}
	return raw
}
