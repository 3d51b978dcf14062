package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
)

// The serving artefacts applied to a Messages body that is relayed, not
// rebuilt: only the fields they change are touched, every other byte is
// the client's (images, cache_control, betas' fields).

// InjectSystem puts system in front of the body's system prompt, as
// artefact.InjectSystem does to a neutral request: a string prompt becomes
// system + "\n\n" + prompt, an array of blocks gains a first text block,
// an absent one is system.
func InjectSystem(body []byte, system string) ([]byte, error) {
	if system == "" {
		return body, nil
	}
	raw, err := protocol.Field(body, "system")
	if err != nil {
		return nil, err
	}
	raw = bytes.TrimSpace(raw)
	var injected []byte
	switch {
	case len(raw) == 0 || string(raw) == "null":
		injected, _ = json.Marshal(system)
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("system: %w", err)
		}
		injected, _ = json.Marshal(system + "\n\n" + s)
	case raw[0] == '[':
		block, _ := json.Marshal(Block{Type: "text", Text: system})
		rest := raw[1:]
		sep := ","
		if t := bytes.TrimSpace(rest); len(t) > 0 && t[0] == ']' {
			sep = ""
		}
		injected = append(append(append([]byte{'['}, block...), sep...), rest...)
	default:
		return nil, errors.New("system: want a string or an array of content blocks")
	}
	return protocol.SetField(body, "system", injected)
}

// OverrideTools gives the body's tools named in changed the description
// and input schema they have in tools (a tool-schema artefact's overrides,
// as artefact.Set.Tools returned them), every other byte as sent.
func OverrideTools(body []byte, tools []inference.Tool, changed []string) ([]byte, error) {
	return protocol.OverrideTools(body, tools, changed, "input_schema", "")
}
