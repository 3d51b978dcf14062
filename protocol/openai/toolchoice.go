package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ToolChoice is a request's tool_choice: one of the modes ("none",
// "auto", "required") or the object {"type": "function", "function":
// {"name": …}} that names the one function to call. The zero value is a
// request that sent none.
type ToolChoice struct {
	// Mode is the string form, always one of the three modes.
	Mode string
	// Name is the object form's function name, never empty there. Type is
	// the object's type as sent: OpenAI says "function"; the gateway takes
	// the object without looking at it, vLLM refuses any other.
	Name, Type string
}

// Choice is the tool choice in inference.Request's form: "", a mode, or
// the name of the function to call.
func (c ToolChoice) Choice() string {
	if c.Name != "" {
		return c.Name
	}
	return c.Mode
}

// ToolChoiceModeError is a tool_choice string that is not a mode.
type ToolChoiceModeError struct{ Mode string }

func (e *ToolChoiceModeError) Error() string {
	return fmt.Sprintf("tool_choice %q: want none, auto, required or a function", e.Mode)
}

// ErrToolChoiceShape is a tool_choice that is neither a string nor an
// object naming a function.
var ErrToolChoiceShape = errors.New(`tool_choice: want none, auto, required or {"type": "function", "function": {"name": …}}`)

// DecodeToolChoice reads tool_choice; absent or null is the zero
// ToolChoice. It fails with a *ToolChoiceModeError or ErrToolChoiceShape,
// which each reader words in its own dialect: the gateway's 400s and
// vLLM's say it differently, and clients match on them.
func DecodeToolChoice(raw json.RawMessage) (ToolChoice, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ToolChoice{}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "none", "auto", "required":
			return ToolChoice{Mode: s}, nil
		}
		return ToolChoice{}, &ToolChoiceModeError{Mode: s}
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Function.Name == "" {
		return ToolChoice{}, ErrToolChoiceShape
	}
	return ToolChoice{Name: named.Function.Name, Type: named.Type}, nil
}

// EncodeToolChoice writes inference.Request's tool choice as tool_choice:
// nil (left out) for "", a mode as its string, any other as the named
// function.
func EncodeToolChoice(choice string) json.RawMessage {
	switch choice {
	case "":
		return nil
	case "none", "auto", "required":
		return mustMarshal(choice)
	}
	return mustMarshal(map[string]any{"type": "function", "function": map[string]string{"name": choice}})
}
