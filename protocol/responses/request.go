// Package responses is the OpenAI Responses API's wire format (POST
// /v1/responses), as far as the gateway speaks it: the request, its input
// items, the response object and its stream events, with converters to and
// from the protocol-neutral inference types. It knows nothing of HTTP
// handlers, Postgres or Temporal.
//
// What it speaks: text input items in any role, function tools and their
// calls and outputs, reasoning items (as the neutral message's Reasoning),
// instructions, structured output through text.format, and logprobs. What it
// refuses with an error naming the field: hosted tools (web search, file
// search, computer use, MCP, …), images and files, item references,
// background mode and server-side conversations. previous_response_id is
// resolved by the caller, who holds the stored responses.
package responses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
)

// Limits on what one request may carry.
const (
	MaxItems         = 10000
	MaxTools         = 512
	MaxTopLogprobs   = 20
	maxMetadataKeys  = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
	// MaxResponseID bounds a response id, the client's or a server's.
	MaxResponseID = 128
)

// IncludeLogprobs is the include value that asks for output text logprobs.
const IncludeLogprobs = "message.output_text.logprobs"

// Request is a POST /v1/responses body: the fields the gateway reads.
// Unknown fields are ignored, as OpenAI's SDKs send many.
type Request struct {
	Model string `json:"model"`
	// Input is a string (one user message) or an array of items.
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions,omitempty"`
	Tools              []Tool            `json:"tools,omitempty"`
	ToolChoice         json.RawMessage   `json:"tool_choice,omitempty"`
	MaxOutputTokens    *int              `json:"max_output_tokens,omitempty"`
	Temperature        *float64          `json:"temperature,omitempty"`
	TopP               *float64          `json:"top_p,omitempty"`
	TopLogprobs        *int              `json:"top_logprobs,omitempty"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls,omitempty"`
	PreviousResponseID string            `json:"previous_response_id,omitempty"`
	Store              *bool             `json:"store,omitempty"`
	Stream             bool              `json:"stream,omitempty"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	User               string            `json:"user,omitempty"`
	SafetyIdentifier   string            `json:"safety_identifier,omitempty"`
	Text               *TextConfig       `json:"text,omitempty"`
	Include            []string          `json:"include,omitempty"`
	Truncation         string            `json:"truncation,omitempty"`
	// Refused when set: the gateway runs every call to its end in the
	// request, and keeps conversations as response chains.
	Background   *bool           `json:"background,omitempty"`
	Conversation json.RawMessage `json:"conversation,omitempty"`
	Prompt       json.RawMessage `json:"prompt,omitempty"`

	// Decoded: Input as items and as messages, ToolChoice and Text.
	items          []InputItem
	input          []inference.Message
	toolChoice     string
	responseFormat json.RawMessage
}

// TextConfig is the request's text options: its output format.
type TextConfig struct {
	Format json.RawMessage `json:"format,omitempty"`
}

// Tool is a tool offered to the model; only function tools are spoken.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name,omitempty"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Strict      *bool           `json:"strict,omitempty"`
}

// Stored reports whether the response is kept for GET and chaining
// (OpenAI's default: yes).
func (r *Request) Stored() bool { return r.Store == nil || *r.Store }

// EndUser is who the call is for, as the client named them.
func (r *Request) EndUser() string {
	if r.SafetyIdentifier != "" {
		return r.SafetyIdentifier
	}
	return r.User
}

// WantLogprobs reports whether output text carries logprobs.
func (r *Request) WantLogprobs() bool {
	for _, inc := range r.Include {
		if inc == IncludeLogprobs {
			return true
		}
	}
	return false
}

// Decode parses and checks a request body. Its errors name the field and
// are the client's fault (400).
func Decode(body []byte) (*Request, error) { return decode(body, false) }

// DecodeRelayed parses a body the gateway relays to a server of the
// Responses API itself, which judges what it takes: hosted tools, images,
// files, item references and any include are let through, and the request
// reads what the neutral request can hold (an image or file part as its
// placeholder, "[input_image]"; an item of a kind it does not speak, such
// as a hosted tool's call, left out). What the gateway itself refuses
// (background mode, conversations, stored prompts) stays refused: it
// could not capture the answer, or the state lives outside the tenant's
// reach.
func DecodeRelayed(body []byte) (*Request, error) { return decode(body, true) }

func decode(body []byte, relayed bool) (*Request, error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("invalid JSON body: %v", err)
	}
	if r.Model == "" {
		return nil, fmt.Errorf("model: required")
	}
	if r.Background != nil && *r.Background {
		return nil, fmt.Errorf("background: not supported; the gateway answers in the request")
	}
	if isSet(r.Conversation) {
		return nil, fmt.Errorf("conversation: not supported; chain responses with previous_response_id")
	}
	if isSet(r.Prompt) {
		return nil, fmt.Errorf("prompt: stored prompt templates are not supported; send instructions and input")
	}
	if r.PreviousResponseID != "" && (len(r.PreviousResponseID) > MaxResponseID || !utf8.ValidString(r.PreviousResponseID)) {
		return nil, fmt.Errorf("previous_response_id: not a response id")
	}
	if err := inference.CheckSampling(r.Temperature, r.TopP); err != nil {
		return nil, err
	}
	if r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1 {
		return nil, fmt.Errorf("max_output_tokens: must be at least 1")
	}
	if r.TopLogprobs != nil && (*r.TopLogprobs < 0 || *r.TopLogprobs > MaxTopLogprobs) {
		return nil, fmt.Errorf("top_logprobs: want 0..%d", MaxTopLogprobs)
	}
	switch r.Truncation {
	case "", "disabled", "auto":
	default:
		return nil, fmt.Errorf("truncation: want auto or disabled, got %q", r.Truncation)
	}
	for _, inc := range r.Include {
		switch {
		case relayed, inc == IncludeLogprobs, inc == "reasoning.encrypted_content":
		default:
			return nil, fmt.Errorf("include: %q is not supported (only %q)", inc, IncludeLogprobs)
		}
	}
	if len(r.Metadata) > maxMetadataKeys {
		return nil, fmt.Errorf("metadata: at most %d keys", maxMetadataKeys)
	}
	for k, v := range r.Metadata {
		if len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return nil, fmt.Errorf("metadata: keys up to %d characters, values up to %d", maxMetadataKey, maxMetadataValue)
		}
	}
	if len(r.Tools) > MaxTools {
		return nil, fmt.Errorf("tools: at most %d", MaxTools)
	}
	if relayed {
		return relayedRequest(&r)
	}
	for i, t := range r.Tools {
		if t.Type != "function" {
			return nil, fmt.Errorf("tools[%d].type: only function tools are supported, got %q", i, t.Type)
		}
		if t.Name == "" {
			return nil, fmt.Errorf("tools[%d].name: required", i)
		}
		if isSet(t.Parameters) && !json.Valid(t.Parameters) {
			return nil, fmt.Errorf("tools[%d].parameters: invalid JSON", i)
		}
	}
	items, err := parseItems(r.Input)
	if err != nil {
		return nil, err
	}
	if r.input, err = Messages(items); err != nil {
		return nil, fmt.Errorf("input%v", err)
	}
	r.items = items
	if r.toolChoice, err = toolChoice(r.ToolChoice, r.Tools); err != nil {
		return nil, err
	}
	if r.responseFormat, err = responseFormat(r.Text); err != nil {
		return nil, err
	}
	return &r, nil
}

func isSet(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}

// InputItem is one item of a request's input, or of a stored response's
// output (output items are valid input: that is how a client continues a
// conversation by hand).
type InputItem struct {
	Type string `json:"type,omitempty"`
	ID   string `json:"id,omitempty"`
	// Role and Content: a message. Content is a string or an array of
	// parts; a reasoning item's Content is its reasoning_text parts.
	Role    string          `json:"role,omitempty"`
	Content json.RawMessage `json:"content,omitempty"`
	// CallID, Name and Arguments: a function call; CallID and Output: its
	// output.
	CallID    string          `json:"call_id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments string          `json:"arguments,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
	// Summary: a reasoning item's summary parts.
	Summary []Part `json:"summary,omitempty"`
}

// Items are the request's input items (a string input is one user
// message): what a stored response keeps of its request.
func (r *Request) Items() []InputItem { return r.items }

func parseItems(input json.RawMessage) ([]InputItem, error) {
	raw := bytes.TrimSpace(input)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("input: required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		c, _ := json.Marshal(s)
		return []InputItem{{Type: "message", Role: inference.RoleUser, Content: c}}, nil
	}
	var items []InputItem
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("input: want a string or an array of items")
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("input: at least one item is required")
	}
	if len(items) > MaxItems {
		return nil, fmt.Errorf("input: at most %d items", MaxItems)
	}
	return items, nil
}

// Messages turns items into chat messages. An assistant turn is one
// message: the reasoning, text and function calls that follow each other
// in the items are gathered into it, as a model produced them together.
// Errors start with the offending item's index ("[3].call_id: required").
func Messages(items []InputItem) ([]inference.Message, error) {
	var out []inference.Message
	// open is the index in out of the assistant message being gathered.
	open := -1
	assistant := func() *inference.Message {
		if open < 0 {
			out = append(out, inference.Message{Role: inference.RoleAssistant})
			open = len(out) - 1
		}
		return &out[open]
	}
	for i, it := range items {
		kind := it.Type
		if kind == "" && it.Role != "" {
			kind = "message" // EasyInputMessage omits its type
		}
		switch kind {
		case "message":
			text, err := contentText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("[%d].%v", i, err)
			}
			switch it.Role {
			case inference.RoleAssistant:
				m := assistant()
				if m.Content != "" || len(m.ToolCalls) > 0 {
					// A second text after the first, or text after a call:
					// a new turn.
					open = -1
					m = assistant()
				}
				m.Content = text
			case inference.RoleUser:
				open = -1
				out = append(out, inference.Message{Role: inference.RoleUser, Content: text})
			case "system", "developer":
				open = -1
				out = append(out, inference.Message{Role: inference.RoleSystem, Content: text})
			default:
				return nil, fmt.Errorf("[%d].role: want user, assistant, system or developer, got %q", i, it.Role)
			}
		case "function_call":
			if it.CallID == "" {
				return nil, fmt.Errorf("[%d].call_id: required", i)
			}
			if it.Name == "" {
				return nil, fmt.Errorf("[%d].name: required", i)
			}
			m := assistant()
			m.ToolCalls = append(m.ToolCalls, inference.ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments})
		case "function_call_output":
			if it.CallID == "" {
				return nil, fmt.Errorf("[%d].call_id: required", i)
			}
			text, err := outputText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("[%d].%v", i, err)
			}
			open = -1
			out = append(out, inference.Message{Role: inference.RoleTool, ToolCallID: it.CallID, Content: text})
		case "reasoning":
			text, err := reasoningText(it)
			if err != nil {
				return nil, fmt.Errorf("[%d].%v", i, err)
			}
			m := assistant()
			if m.Content != "" || len(m.ToolCalls) > 0 {
				open = -1
				m = assistant()
			}
			m.Reasoning += text
		case "":
			return nil, fmt.Errorf("[%d].type: required", i)
		default:
			return nil, fmt.Errorf("[%d].type: %q items are not supported (message, function_call, function_call_output and reasoning are)", i, kind)
		}
	}
	return out, nil
}

// Part is a piece of content: input_text, output_text or refusal in a
// message, reasoning_text or summary_text in a reasoning item.
type Part struct {
	Type string `json:"type"`
	Text string `json:"text"`
	// Refusal is a refusal part's text.
	Refusal string `json:"refusal,omitempty"`
	// Annotations and Logprobs belong to output_text parts; OpenAI always
	// sends both arrays, so they are pointers that encode [] when set.
	Annotations *[]json.RawMessage `json:"annotations,omitempty"`
	Logprobs    *[]Logprob         `json:"logprobs,omitempty"`
}

func contentText(raw json.RawMessage) (string, error) {
	return protocol.Text(raw, "content: want a string or an array of parts", func(i int, p Part) (string, error) {
		switch p.Type {
		case "input_text", "output_text", "text":
			return p.Text, nil
		case "refusal":
			return p.Refusal, nil
		}
		return "", fmt.Errorf("content[%d].type: only text parts are supported, got %q", i, p.Type)
	})
}

// outputText is a function call output: a string, or text parts.
func outputText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", fmt.Errorf("output: required")
	}
	text, err := contentText(raw)
	if err != nil {
		return "", fmt.Errorf("output: want a string or text parts")
	}
	return text, nil
}

// reasoningText is a reasoning item's text: its reasoning_text content
// (what open-weight models expose) or else its summary.
func reasoningText(it InputItem) (string, error) {
	if isSet(it.Content) {
		var parts []Part
		if err := json.Unmarshal(it.Content, &parts); err != nil {
			return "", fmt.Errorf("content: want an array of reasoning_text parts")
		}
		var b strings.Builder
		for i, p := range parts {
			if p.Type != "reasoning_text" {
				return "", fmt.Errorf("content[%d].type: want reasoning_text, got %q", i, p.Type)
			}
			b.WriteString(p.Text)
		}
		if b.Len() > 0 {
			return b.String(), nil
		}
	}
	var b strings.Builder
	for i, p := range it.Summary {
		if p.Type != "summary_text" {
			return "", fmt.Errorf("summary[%d].type: want summary_text, got %q", i, p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// Neutral builds the inference request of a decoded request: the
// instructions as the system message, then history (the conversation of
// the previous responses, if any), then this request's input.
func (r *Request) Neutral(history []inference.Message) *inference.Request {
	req := &inference.Request{Model: r.Model, Temperature: r.Temperature, TopP: r.TopP, ParallelToolCalls: r.ParallelToolCalls,
		ToolChoice: r.toolChoice, ResponseFormat: r.responseFormat}
	if r.MaxOutputTokens != nil {
		req.MaxTokens = *r.MaxOutputTokens
	}
	if r.TopLogprobs != nil {
		req.TopLogprobs = *r.TopLogprobs
	}
	if r.Instructions != nil && *r.Instructions != "" {
		req.Messages = append(req.Messages, inference.Message{Role: inference.RoleSystem, Content: *r.Instructions})
	}
	req.Messages = append(append(req.Messages, history...), r.input...)
	for _, t := range r.Tools {
		req.Tools = append(req.Tools, inference.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	return req
}

// toolChoice maps the Responses tool_choice to the neutral one.
func toolChoice(raw json.RawMessage, tools []Tool) (string, error) {
	if !isSet(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return s, nil
		}
		return "", fmt.Errorf("tool_choice: want auto, none, required or a function, got %q", s)
	}
	var f struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &f); err != nil || f.Type != "function" || f.Name == "" {
		return "", fmt.Errorf(`tool_choice: want auto, none, required or {"type": "function", "name": …}`)
	}
	for _, t := range tools {
		if t.Name == f.Name {
			return f.Name, nil
		}
	}
	return "", fmt.Errorf("tool_choice: no tool named %q", f.Name)
}

// responseFormat maps text.format to Chat Completions' response_format,
// which the neutral request carries.
func responseFormat(t *TextConfig) (json.RawMessage, error) {
	if t == nil || !isSet(t.Format) {
		return nil, nil
	}
	var f struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict,omitempty"`
	}
	if err := json.Unmarshal(t.Format, &f); err != nil {
		return nil, fmt.Errorf("text.format: want an object")
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return json.RawMessage(`{"type":"json_object"}`), nil
	case "json_schema":
		if f.Name == "" || !isSet(f.Schema) {
			return nil, fmt.Errorf("text.format: a json_schema format needs name and schema")
		}
		b, err := json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{
			"name": f.Name, "description": f.Description, "schema": f.Schema, "strict": f.Strict}})
		if err != nil {
			return nil, fmt.Errorf("text.format: %v", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("text.format.type: want text, json_object or json_schema, got %q", f.Type)
}
