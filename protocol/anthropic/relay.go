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
// as artefact.Set.Tools returned them).
func OverrideTools(body []byte, tools []inference.Tool, changed []string) ([]byte, error) {
	if len(changed) == 0 {
		return body, nil
	}
	raw, err := protocol.Field(body, "tools")
	if err != nil || raw == nil {
		return body, err
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("tools: %w", err)
	}
	byName := map[string]inference.Tool{}
	for _, t := range tools {
		byName[t.Name] = t
	}
	isChanged := map[string]bool{}
	for _, name := range changed {
		isChanged[name] = true
	}
	out := []byte{'['}
	for i, item := range items {
		var head struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(item, &head); err != nil {
			return nil, fmt.Errorf("tools.%d: %w", i, err)
		}
		if t, ok := byName[head.Name]; ok && isChanged[head.Name] {
			desc, _ := json.Marshal(t.Description)
			if item, err = protocol.SetField(item, "description", desc); err != nil {
				return nil, fmt.Errorf("tools.%d: %w", i, err)
			}
			if len(t.Parameters) > 0 {
				if item, err = protocol.SetField(item, "input_schema", t.Parameters); err != nil {
					return nil, fmt.Errorf("tools.%d: %w", i, err)
				}
			}
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, item...)
	}
	return protocol.SetField(body, "tools", append(out, ']'))
}
