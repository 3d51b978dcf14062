// Package anthropic is Anthropic's Messages wire format, as far as the
// gateway speaks it: the request and its content blocks, tools and
// options, the message response, with converters to and from the
// protocol-neutral inference types. Decode's errors name the field and are
// the client's fault (400).
package anthropic

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
)

// Limits on what one request may carry.
const (
	maxMessages = 10000
	maxTools    = 512
	maxStops    = 16
)

// Anthropic Messages wire types: only the fields the gateway reads or
// writes.

type Request struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	System        json.RawMessage `json:"system,omitempty"`
	Messages      []Message       `json:"messages"`
	Tools         []Tool          `json:"tools,omitempty"`
	ToolChoice    *ToolChoice     `json:"tool_choice,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	Temperature   *float64        `json:"temperature,omitempty"`
	TopP          *float64        `json:"top_p,omitempty"`
	StopSequences []string        `json:"stop_sequences,omitempty"`
	Metadata      *struct {
		UserID string `json:"user_id"`
	} `json:"metadata,omitempty"`
}

type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type Block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
	Thinking  string          `json:"thinking,omitempty"`
	Signature string          `json:"signature,omitempty"`
}

type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type ToolChoice struct {
	Type                   string `json:"type"`
	Name                   string `json:"name,omitempty"`
	DisableParallelToolUse bool   `json:"disable_parallel_tool_use,omitempty"`
}

// Decode parses and validates a Messages body into the neutral
// request. The system prompt becomes the first message.
func Decode(body []byte) (*Request, *inference.Request, error) {
	return DecodeBody(body, true)
}

// DecodeBody is Decode; count_tokens has no max_tokens.
func DecodeBody(body []byte, generate bool) (*Request, *inference.Request, error) {
	return decode(body, generate, false)
}

// DecodeRelayed is DecodeBody for a body the gateway relays unchanged to
// a server of Anthropic's own dialect, which is the judge of what it
// takes: a content block the neutral request cannot hold (an image, a
// document, a server tool's result, …) is recorded as the placeholder
// text "[type]" instead of refused.
func DecodeRelayed(body []byte, generate bool) (*Request, *inference.Request, error) {
	return decode(body, generate, true)
}

func decode(body []byte, generate, relayed bool) (*Request, *inference.Request, error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, nil, fmt.Errorf("invalid JSON body: %v", err)
	}
	if r.Model == "" {
		return nil, nil, fmt.Errorf("model: Field required")
	}
	if generate && r.MaxTokens == nil {
		return nil, nil, fmt.Errorf("max_tokens: Field required")
	}
	if r.MaxTokens == nil {
		r.MaxTokens = new(int)
	} else if *r.MaxTokens < 1 {
		return nil, nil, fmt.Errorf("max_tokens: must be at least 1")
	}
	if len(r.Messages) == 0 {
		return nil, nil, fmt.Errorf("messages: at least one message is required")
	}
	if len(r.Messages) > maxMessages {
		return nil, nil, fmt.Errorf("messages: at most %d", maxMessages)
	}
	if err := inference.CheckSampling(r.Temperature, r.TopP); err != nil {
		return nil, nil, err
	}
	if len(r.StopSequences) > maxStops {
		return nil, nil, fmt.Errorf("stop_sequences: at most %d", maxStops)
	}
	req := &inference.Request{Model: r.Model, MaxTokens: *r.MaxTokens, Temperature: r.Temperature, TopP: r.TopP, Stop: r.StopSequences}
	sys, err := blocksText(r.System, relayed)
	if err != nil {
		return nil, nil, fmt.Errorf("system: %v", err)
	}
	if sys != "" {
		req.Messages = append(req.Messages, inference.Message{Role: inference.RoleSystem, Content: sys})
	}
	for i, m := range r.Messages {
		msgs, err := m.neutral(relayed)
		if err != nil {
			return nil, nil, fmt.Errorf("messages.%d: %v", i, err)
		}
		req.Messages = append(req.Messages, msgs...)
	}
	if len(r.Tools) > maxTools {
		return nil, nil, fmt.Errorf("tools: at most %d", maxTools)
	}
	for i, t := range r.Tools {
		if t.Name == "" {
			return nil, nil, fmt.Errorf("tools.%d.name: Field required", i)
		}
		if len(t.InputSchema) > 0 && !json.Valid(t.InputSchema) {
			return nil, nil, fmt.Errorf("tools.%d.input_schema: invalid JSON", i)
		}
		req.Tools = append(req.Tools, inference.Tool{Name: t.Name, Description: t.Description, Parameters: t.InputSchema})
	}
	if tc := r.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto", "none":
			req.ToolChoice = tc.Type
		case "any":
			req.ToolChoice = "required"
		case "tool":
			if !inference.ToolNamed(req.Tools, tc.Name) {
				return nil, nil, fmt.Errorf("tool_choice.name: no tool named %q", tc.Name)
			}
			req.ToolChoice = tc.Name
		default:
			return nil, nil, fmt.Errorf("tool_choice.type: want auto, any, tool or none")
		}
	}
	return &r, req, nil
}

// blocksText reads a string or an array of text blocks; relayed, other
// blocks read as their placeholder.
func blocksText(raw json.RawMessage, relayed bool) (string, error) {
	return protocol.Text(raw, "want a string or an array of content blocks", func(i int, bl Block) (string, error) {
		switch {
		case bl.Type == "text":
			return bl.Text, nil
		case relayed:
			return Placeholder(bl.Type), nil
		}
		return "", fmt.Errorf("content.%d: want a text block here, got %q", i, bl.Type)
	})
}

// Placeholder is the text that stands for a content block of type kind
// that the neutral types cannot hold, in a relayed request or answer.
func Placeholder(kind string) string { return "[" + kind + "]" }

// neutral converts one Anthropic message; a user message's tool_result
// blocks become tool messages (OpenAI's shape), in order. relayed, a block
// of another type is its placeholder text.
func (m Message) neutral(relayed bool) ([]inference.Message, error) {
	if m.Role != inference.RoleUser && m.Role != inference.RoleAssistant {
		return nil, fmt.Errorf("role: want user or assistant, got %q", m.Role)
	}
	raw := bytes.TrimSpace(m.Content)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []inference.Message{{Role: m.Role, Content: s}}, nil
	}
	var blocks []Block
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, fmt.Errorf("content: want a string or an array of content blocks")
	}
	var out []inference.Message
	cur := inference.Message{Role: m.Role}
	var texts []string
	flush := func() {
		cur.Content = strings.Join(texts, "\n") // as protocol.Text joins parts
		if cur.Content != "" || len(cur.ToolCalls) > 0 || cur.Reasoning != "" {
			out = append(out, cur)
		}
		cur = inference.Message{Role: m.Role}
		texts = nil
	}
	for i, b := range blocks {
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "thinking":
			if m.Role != inference.RoleAssistant {
				return nil, fmt.Errorf("content.%d: thinking only in assistant messages", i)
			}
			cur.Reasoning += b.Thinking
		case "redacted_thinking":
		case "tool_use":
			if m.Role != inference.RoleAssistant {
				return nil, fmt.Errorf("content.%d: tool_use only in assistant messages", i)
			}
			if b.ID == "" || b.Name == "" {
				return nil, fmt.Errorf("content.%d: tool_use needs id and name", i)
			}
			input := bytes.TrimSpace(b.Input)
			if len(input) == 0 {
				input = []byte("{}")
			}
			// An object, as Anthropic requires: Content renders anything
			// else wrapped, so the client's echo of this turn would no
			// longer hash like the turn itself.
			if !json.Valid(input) || input[0] != '{' {
				return nil, fmt.Errorf("content.%d.input: want a JSON object", i)
			}
			cur.ToolCalls = append(cur.ToolCalls, inference.ToolCall{ID: b.ID, Name: b.Name, Arguments: string(input)})
		case "tool_result":
			if m.Role != inference.RoleUser {
				return nil, fmt.Errorf("content.%d: tool_result only in user messages", i)
			}
			if b.ToolUseID == "" {
				return nil, fmt.Errorf("content.%d.tool_use_id: Field required", i)
			}
			flush()
			res, err := blocksText(b.Content, relayed)
			if err != nil {
				return nil, fmt.Errorf("content.%d.content: %v", i, err)
			}
			if b.IsError {
				res = "error: " + res
			}
			out = append(out, inference.Message{Role: inference.RoleTool, ToolCallID: b.ToolUseID, Content: res})
		case "":
			return nil, fmt.Errorf("content.%d.type: Field required", i)
		default:
			if relayed {
				texts = append(texts, Placeholder(b.Type))
				continue
			}
			return nil, fmt.Errorf("content.%d: unsupported block type %q", i, b.Type)
		}
	}
	flush()
	if len(out) == 0 {
		// An empty turn still counts as a turn (the API allows "" content).
		out = append(out, inference.Message{Role: m.Role})
	}
	return out, nil
}

// Anthropic responses.

type Response struct {
	ID           string  `json:"id"`
	Type         string  `json:"type"`
	Role         string  `json:"role"`
	Model        string  `json:"model"`
	Content      []Block `json:"content"`
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
	Usage        Usage   `json:"usage"`
}

type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// Stop is a finished generation's stop_reason and stop_sequence: a
// generation that stopped at one of the request's stop sequences, where
// the backend says which, ends with "stop_sequence" and names it.
func Stop(resp *inference.Response) (string, *string) {
	if resp.StopSequence != "" && resp.FinishReason == inference.FinishStop {
		seq := resp.StopSequence
		return "stop_sequence", &seq
	}
	return StopReason(resp.FinishReason), nil
}

func StopReason(finish string) string {
	switch finish {
	case inference.FinishLength:
		return "max_tokens"
	case inference.FinishToolCalls:
		return "tool_use"
	default:
		return "end_turn"
	}
}

// Content renders the assistant message as content blocks.
func Content(m inference.Message) []Block {
	blocks := []Block{}
	if m.Reasoning != "" {
		blocks = append(blocks, Block{Type: "thinking", Thinking: m.Reasoning, Signature: ""})
	}
	if m.Content != "" || len(m.ToolCalls) == 0 {
		blocks = append(blocks, Block{Type: "text", Text: m.Content})
	}
	for _, tc := range m.ToolCalls {
		blocks = append(blocks, Block{Type: "tool_use", ID: tc.ID, Name: tc.Name, Input: ToolInput(tc.Arguments)})
	}
	return blocks
}

// ToolInput is the call's arguments as a JSON object; a model that
// produced invalid JSON has its text wrapped so the client still parses.
func ToolInput(args string) json.RawMessage {
	raw := bytes.TrimSpace([]byte(args))
	if len(raw) == 0 {
		return json.RawMessage("{}")
	}
	var obj map[string]any
	if json.Unmarshal(raw, &obj) == nil {
		return raw
	}
	wrapped, _ := json.Marshal(map[string]string{"_raw_arguments": args})
	return wrapped
}
