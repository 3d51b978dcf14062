package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/flywheel-ai/flywheel/inference"
)

// Registering a suite: the prompts as users write them, checked before
// they are stored, and what a tool_call prompt expects.

// SuiteItem is one prompt as users write it (a JSONL line of a suite file,
// or an element of the admin API's "prompts"): the messages, or a single
// user prompt, with what the answer must be.
type SuiteItem struct {
	Messages json.RawMessage `json:"messages,omitempty"`
	Prompt   string          `json:"prompt,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
	// Expect is text, or for match tool_call a ToolCallExpect, which JSON
	// may give as an object.
	Expect    string `json:"expect"`
	Match     string `json:"match,omitempty"`
	MaxTokens int    `json:"max_tokens,omitempty"`
	// Temperature answers the prompt sampled, as agents ask (0: greedy).
	Temperature float64 `json:"temperature,omitempty"`
}

// UnmarshalJSON reads an item strictly (an unknown field is an error, so
// a misspelt one is not silently dropped), with expect a string or, for
// match tool_call, an object kept as its compact JSON text.
func (it *SuiteItem) UnmarshalJSON(b []byte) error {
	type plain SuiteItem
	var w struct {
		plain
		Expect json.RawMessage `json:"expect"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return err
	}
	*it = SuiteItem(w.plain)
	switch raw := bytes.TrimSpace(w.Expect); {
	case len(raw) == 0 || string(raw) == "null":
	case raw[0] == '{':
		var c bytes.Buffer
		if err := json.Compact(&c, raw); err != nil {
			return fmt.Errorf("expect: %w", err)
		}
		it.Expect = c.String()
	default:
		if err := json.Unmarshal(raw, &it.Expect); err != nil {
			return errors.New("expect: want a string, or an object {name, arguments} for match tool_call")
		}
	}
	return nil
}

// ToolCallExpect is what a tool_call prompt expects: a call of the tool
// Name, with Arguments JSON-equal to the call's (any arguments when
// Arguments is absent).
type ToolCallExpect struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// ParseToolCallExpect reads a tool_call prompt's expect.
func ParseToolCallExpect(expect string) (ToolCallExpect, error) {
	var e ToolCallExpect
	dec := json.NewDecoder(strings.NewReader(expect))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("want {\"name\": …, \"arguments\": {…}}: %v", err)
	}
	if e.Name == "" {
		return e, errors.New("name: required")
	}
	if args := bytes.TrimSpace(e.Arguments); len(args) > 0 && args[0] != '{' {
		return e, errors.New("arguments: want a JSON object")
	}
	return e, nil
}

// Matches reports whether calls hold one of the expected tool with
// arguments JSON-equal to the expected ones (key order and spacing do not
// count).
func (e ToolCallExpect) Matches(calls []inference.ToolCall) bool {
	for _, c := range calls {
		args := c.Arguments
		if strings.TrimSpace(args) == "" {
			args = "{}" // some backends send a call without arguments so
		}
		if c.Name == e.Name && (len(e.Arguments) == 0 || jsonEqual([]byte(args), e.Arguments)) {
			return true
		}
	}
	return false
}

// Limits on a registered suite.
const (
	MaxSuitePrompts     = 10_000
	maxSuiteMaxTokens   = 4096
	maxSuiteTemperature = 2
)

// SuitePrompts validates items for suite and turns them into prompts; the
// error names every bad item.
func SuitePrompts(suite string, items []SuiteItem) ([]EvalPrompt, error) {
	if err := CheckSuite(suite); err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, errors.New("a suite needs at least one prompt")
	}
	if len(items) > MaxSuitePrompts {
		return nil, fmt.Errorf("a suite holds at most %d prompts, got %d", MaxSuitePrompts, len(items))
	}
	var errs []error
	out := make([]EvalPrompt, 0, len(items))
	for i, it := range items {
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("prompt %d: %s", i+1, fmt.Sprintf(format, args...)))
		}
		msgs := it.Messages
		switch {
		case len(msgs) > 0 && it.Prompt != "":
			bad("give messages or prompt, not both")
			continue
		case it.Prompt != "":
			msgs, _ = json.Marshal([]map[string]string{{"role": "user", "content": it.Prompt}})
		case len(msgs) == 0:
			bad("messages or prompt is required")
			continue
		}
		var tools []byte
		if t := bytes.TrimSpace(it.Tools); len(t) > 0 && string(t) != "null" {
			tools = t
		}
		p := EvalPrompt{Messages: msgs, Tools: tools, Expect: it.Expect, Match: it.Match, MaxTokens: it.MaxTokens, Temperature: it.Temperature}
		_, offered, err := p.Conversation()
		if err != nil {
			bad("%v", err)
			continue
		}
		if err := checkSuiteTools(offered); err != nil {
			bad("%v", err)
			continue
		}
		if len(offered) == 0 {
			p.Tools = nil // "tools": [] offers none, as no tools does
		}
		if !utf8.ValidString(it.Expect) || strings.ContainsRune(it.Expect, 0) || bytes.Contains(msgs, []byte(`\u0000`)) || bytes.Contains(tools, []byte(`\u0000`)) {
			bad("expect, messages and tools must be valid UTF-8 without NUL characters")
			continue
		}
		switch p.Rule(suite) {
		case MatchExact, MatchContains:
			if strings.TrimSpace(p.Expect) == "" {
				bad("match %q needs the expected answer in expect", p.Rule(suite))
			}
		case MatchRefusal:
		case MatchToolCall:
			e, err := ParseToolCallExpect(p.Expect)
			switch {
			case err != nil:
				bad("expect of match %q: %v", MatchToolCall, err)
			case len(offered) > 0 && !inference.ToolNamed(offered, e.Name):
				bad("expect of match %q names the tool %q, which tools does not offer", MatchToolCall, e.Name)
			}
		default:
			bad("match %q: want %s, %s, %s or %s", p.Match, MatchExact, MatchContains, MatchRefusal, MatchToolCall)
		}
		if p.MaxTokens < 0 || p.MaxTokens > maxSuiteMaxTokens {
			bad("max_tokens %d: want 0..%d", p.MaxTokens, maxSuiteMaxTokens)
		}
		if !(p.Temperature >= 0 && p.Temperature <= maxSuiteTemperature) {
			bad("temperature %v: want 0..%d (0: greedy)", p.Temperature, maxSuiteTemperature)
		}
		out = append(out, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// checkSuiteTools holds a suite's tools to more than a request's: a
// gate's verdict should not hang on which of two same-named tools a
// backend keeps, nor on a schema that is not one.
func checkSuiteTools(tools []inference.Tool) error {
	seen := map[string]bool{}
	for i, t := range tools {
		if seen[t.Name] {
			return fmt.Errorf("tools[%d].function.name: %q is offered twice", i, t.Name)
		}
		seen[t.Name] = true
		if p := bytes.TrimSpace(t.Parameters); len(p) > 0 && string(p) != "null" && p[0] != '{' {
			return fmt.Errorf("tools[%d].function.parameters: want a JSON object", i)
		}
	}
	return nil
}
