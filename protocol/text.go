// Package protocol holds what the protocols' wire packages (openai,
// anthropic, responses) share.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// Text reads content that each protocol sends as a JSON string or as an
// array of typed parts: null or nothing is "", a string is itself, and an
// array's parts, decoded as P, are what partText returns for each (or the
// protocol's reason to refuse it), joined by newlines, as vLLM joins text
// parts for a chat template that takes a string: a request through the
// gateway reaches the engine as it would have directly. notParts is the
// error for anything else.
func Text[P any](raw json.RawMessage, notParts string, partText func(i int, p P) (string, error)) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []P
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New(notParts)
	}
	var b strings.Builder
	for i, p := range parts {
		t, err := partText(i, p)
		if err != nil {
			return "", err
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(t)
	}
	return b.String(), nil
}
