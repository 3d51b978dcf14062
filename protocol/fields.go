package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flywheel-ai/flywheel/inference"
)

// SetField returns the JSON object obj with the value of its top-level
// key replaced by value, every other byte as it was: a body relayed to
// another server keeps its fields, their order and their spelling. A key
// that obj lacks is added at its end.
func SetField(obj []byte, key string, value json.RawMessage) ([]byte, error) {
	start, end, closing, err := fieldSpan(obj, key)
	if err != nil {
		return nil, err
	}
	if start < 0 {
		k, _ := json.Marshal(key)
		sep := ","
		if len(bytes.TrimSpace(obj[bytes.IndexByte(obj, '{')+1:closing])) == 0 {
			sep = ""
		}
		out := make([]byte, 0, len(obj)+len(k)+len(value)+2)
		out = append(append(append(append(append(out, obj[:closing]...), sep...), k...), ':'), value...)
		return append(out, obj[closing:]...), nil
	}
	out := make([]byte, 0, len(obj)-(end-start)+len(value))
	return append(append(append(out, obj[:start]...), value...), obj[end:]...), nil
}

// Field is the raw value of obj's top-level key (nil when obj lacks it).
func Field(obj []byte, key string) (json.RawMessage, error) {
	start, end, _, err := fieldSpan(obj, key)
	if err != nil || start < 0 {
		return nil, err
	}
	return obj[start:end], nil
}

// fieldSpan finds the bytes of the value of obj's top-level key (start
// is -1 when there is none) and the object's closing brace. A key given
// twice is refused: which one a server reads is its own choice.
func fieldSpan(obj []byte, key string) (start, end, closing int, err error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return 0, 0, 0, errors.New("want a JSON object")
	}
	start = -1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return 0, 0, 0, fmt.Errorf("want a JSON object: %w", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return 0, 0, 0, fmt.Errorf("want a JSON object: %w", err)
		}
		if tok == key {
			if start >= 0 {
				return 0, 0, 0, fmt.Errorf("%s: given twice", key)
			}
			end = int(dec.InputOffset())
			start = end - len(v)
		}
	}
	if _, err := dec.Token(); err != nil {
		return 0, 0, 0, fmt.Errorf("want a JSON object: %w", err)
	}
	closing = int(dec.InputOffset()) - 1
	if len(bytes.TrimSpace(obj[closing+1:])) > 0 {
		return 0, 0, 0, errors.New("want one JSON object")
	}
	return start, end, closing, nil
}

// OverrideTools gives the relayed body's tools named in changed the
// description and schema they have in tools (a tool-schema artefact's
// overrides, as artefact.Set.Tools returned them), every other byte as
// sent. schemaField is where the dialect keeps a tool's schema
// ("input_schema", "parameters"); onlyType, when set, is the "type" a
// tool must have to change.
func OverrideTools(body []byte, tools []inference.Tool, changed []string, schemaField, onlyType string) ([]byte, error) {
	if len(changed) == 0 {
		return body, nil
	}
	raw, err := Field(body, "tools")
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
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(item, &head); err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		if t, ok := byName[head.Name]; ok && isChanged[head.Name] && (onlyType == "" || head.Type == onlyType) {
			desc, _ := json.Marshal(t.Description)
			if item, err = SetField(item, "description", desc); err != nil {
				return nil, fmt.Errorf("tools[%d]: %w", i, err)
			}
			if len(t.Parameters) > 0 {
				if item, err = SetField(item, schemaField, t.Parameters); err != nil {
					return nil, fmt.Errorf("tools[%d]: %w", i, err)
				}
			}
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, item...)
	}
	return SetField(body, "tools", append(out, ']'))
}
