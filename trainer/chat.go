package trainer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
)

// The chat template is ChatML with byte tokens:
//
//	<|im_start|>role\ncontent<|im_end|>
//
// Tools are listed in the system message, one signature a line
// ("name(param,…): description", the parameters being the schema's
// properties in order); the model calls one by emitting
// <tool_call>{"name":"…","arguments":{…}}</tool_call> inside its message, and
// tool results come back as messages with role "tool". There are no newlines
// between messages and no spelled-out instructions: every token costs a
// small CPU model time, and the format is taught by training, not read.

// renderMessage appends one finished message.
func renderMessage(ids []int, m inference.Message) []int {
	var tok Tokenizer
	ids = append(ids, TokImStart)
	ids = append(ids, tok.Encode(m.Role+"\n")...)
	ids = append(ids, tok.Encode(m.Content)...)
	for _, tc := range m.ToolCalls {
		ids = append(ids, TokToolStart)
		ids = append(ids, tok.Encode(toolCallJSON(tc))...)
		ids = append(ids, TokToolEnd)
	}
	return append(ids, TokImEnd)
}

func toolCallJSON(tc inference.ToolCall) string {
	args := strings.TrimSpace(tc.Arguments)
	if args == "" {
		args = "{}"
	}
	if !json.Valid([]byte(args)) {
		args = strconv.Quote(args)
	}
	name, _ := json.Marshal(tc.Name)
	return `{"name":` + string(name) + `,"arguments":` + args + `}`
}

// toolsSystemText describes the offered tools for the system message.
func toolsSystemText(tools []inference.Tool, choice string) string {
	if len(tools) == 0 || choice == "none" {
		return ""
	}
	var b strings.Builder
	b.WriteString("# Tools\n")
	for _, t := range tools {
		b.WriteString(t.Name + "(" + strings.Join(paramNames(t.Parameters), ",") + ")")
		if t.Description != "" {
			b.WriteString(": " + t.Description)
		}
		b.WriteString("\n")
	}
	if choice == "required" {
		b.WriteString("(a tool call is required)")
	} else if choice != "" && choice != "auto" {
		b.WriteString("(call " + choice + ")")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// paramNames are the property names of a JSON-schema object, in the order
// written; none for a schema that has no properties or does not parse.
func paramNames(schema json.RawMessage) []string {
	var s struct {
		Properties json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(schema, &s) != nil || len(s.Properties) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(s.Properties))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var names []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return names
		}
		name, _ := t.(string)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return names
		}
		names = append(names, name)
	}
	return names
}

// RenderPrompt renders messages and the assistant generation prompt. When
// prefix is given (the stored ids of earlier turns) it is used verbatim for
// the messages it covers, one per <|im_end|> it contains, so the next turn
// conditions on exactly what the model saw and said before.
func RenderPrompt(msgs []inference.Message, tools []inference.Tool, toolChoice string, prefix []int) ([]int, error) {
	msgs = withToolsInSystem(msgs, tools, toolChoice)
	var ids []int
	start := 0
	if len(prefix) > 0 {
		if err := validateIDs(prefix, VocabSize); err != nil {
			return nil, fmt.Errorf("prompt_token_ids: %w", err)
		}
		ids = append(ids, prefix...)
		if ids[len(ids)-1] != TokImEnd {
			// A completion cut by max_tokens has no end marker; close the turn
			// so the covered-message count below stays right.
			ids = append(ids, TokImEnd)
		}
		for _, id := range ids {
			if id == TokImEnd {
				start++
			}
		}
		if start > len(msgs) {
			return nil, fmt.Errorf("prompt_token_ids cover %d messages but the request has %d", start, len(msgs))
		}
	}
	for _, m := range msgs[start:] {
		ids = renderMessage(ids, m)
	}
	ids = append(ids, TokImStart)
	return append(ids, Tokenizer{}.Encode(inference.RoleAssistant+"\n")...), nil
}

func withToolsInSystem(msgs []inference.Message, tools []inference.Tool, choice string) []inference.Message {
	text := toolsSystemText(tools, choice)
	if text == "" {
		return msgs
	}
	out := make([]inference.Message, 0, len(msgs)+1)
	if len(msgs) > 0 && msgs[0].Role == inference.RoleSystem {
		sys := msgs[0]
		sys.Content = strings.TrimRight(sys.Content, "\n") + "\n" + text
		out = append(out, sys)
		return append(out, msgs[1:]...)
	}
	out = append(out, inference.Message{Role: inference.RoleSystem, Content: text})
	return append(out, msgs...)
}

// ParseAssistant splits generated text into content and tool calls. A tool
// call whose JSON does not parse stays in the content, so the caller sees
// what the model wrote instead of losing it.
func ParseAssistant(text string, idPrefix string) (string, []inference.ToolCall) {
	const open, closeTag = "<tool_call>", "</tool_call>"
	var content strings.Builder
	var calls []inference.ToolCall
	for {
		i := strings.Index(text, open)
		if i < 0 {
			content.WriteString(text)
			break
		}
		rest := text[i+len(open):]
		j := strings.Index(rest, closeTag)
		if j < 0 {
			content.WriteString(text)
			break
		}
		body := strings.TrimSpace(rest[:j])
		var call struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal([]byte(body), &call); err != nil || call.Name == "" {
			content.WriteString(text[:i+len(open)+j+len(closeTag)])
		} else {
			content.WriteString(text[:i])
			args := string(call.Arguments)
			var s string
			if json.Unmarshal(call.Arguments, &s) == nil {
				args = s // the model wrote the arguments as a JSON string
			}
			if args == "" {
				args = "{}"
			}
			calls = append(calls, inference.ToolCall{
				ID:        fmt.Sprintf("%s_%d", idPrefix, len(calls)),
				Name:      call.Name,
				Arguments: args,
			})
		}
		text = rest[j+len(closeTag):]
	}
	return strings.TrimSpace(content.String()), calls
}
