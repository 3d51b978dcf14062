// Package openai is OpenAI's Chat Completions wire format, the one
// definition of it in Flywheel: the request and its messages, tools,
// tool_choice and options, with vLLM's extensions to them; the completion
// and its stream chunks; converters to and from the protocol-neutral
// inference types. The gateway reads requests and writes answers with it,
// the engine client (upstream) writes requests and reads
// messages, tool calls and usage with it, and the model server reads its
// requests' parts with it. Decode's errors name the field and are the
// client's fault (400). It does no I/O.
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
)

// OpenAI Chat Completions wire types: only the fields the gateway, the
// engine client (upstream) and the model server read or write.
// Unknown request fields are ignored, as OpenAI's SDKs send many. The
// fields are in the order the engine client has always written them.

// Request is a chat completion request, as the gateway and the model
// server read it and the engine client writes it.
type Request struct {
	Model               string             `json:"model"`
	Messages            []Message          `json:"messages"`
	Tools               []Tool             `json:"tools,omitempty"`
	ToolChoice          json.RawMessage    `json:"tool_choice,omitempty"`
	MaxTokens           *int               `json:"max_tokens,omitempty"`
	MaxCompletionTokens *int               `json:"max_completion_tokens,omitempty"`
	Temperature         *float64           `json:"temperature,omitempty"`
	TopP                *float64           `json:"top_p,omitempty"`
	Stop                json.RawMessage    `json:"stop,omitempty"`
	Seed                *int64             `json:"seed,omitempty"`
	N                   *int               `json:"n,omitempty"`
	ResponseFormat      json.RawMessage    `json:"response_format,omitempty"`
	ParallelToolCalls   *bool              `json:"parallel_tool_calls,omitempty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty,omitempty"`
	PresencePenalty     *float64           `json:"presence_penalty,omitempty"`
	LogitBias           map[string]float64 `json:"logit_bias,omitempty"`
	Logprobs            bool               `json:"logprobs,omitempty"`
	TopLogprobs         *int               `json:"top_logprobs,omitempty"`
	Stream              bool               `json:"stream,omitempty"`
	StreamOptions       *StreamOptions     `json:"stream_options,omitempty"`
	User                string             `json:"user,omitempty"`
	// ReturnTokenIDs is vLLM's: the answer carries prompt_token_ids and
	// each choice's token_ids.
	ReturnTokenIDs bool `json:"return_token_ids,omitempty"`
	// TokensAsIDs is vLLM's return_tokens_as_token_ids: logprob tokens
	// are written "token_id:N".
	TokensAsIDs bool `json:"return_tokens_as_token_ids,omitempty"`
}

// Choices is how many samples the request asks for (n).
func (r *Request) Choices() int {
	if r.N == nil {
		return 1
	}
	return *r.N
}

type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	Name       string          `json:"name,omitempty"`
	ToolCalls  []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	// ReasoningContent is the vLLM / DeepSeek name for exposed thinking.
	ReasoningContent string `json:"reasoning_content,omitempty"`
}

type ToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type Tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

// Limits on what one request may ask for.
const (
	maxChoices     = 16
	maxMessages    = 10000
	maxTools       = 512
	maxTopLogprobs = 20
	maxStops       = 16
)

// Decode parses and validates a Chat Completions body into the
// neutral request. Every error is a 400 with a message naming the field.
func Decode(body []byte) (*Request, *inference.Request, error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, nil, fmt.Errorf("invalid JSON body: %v", err)
	}
	if r.Model == "" {
		return nil, nil, fmt.Errorf("model: required")
	}
	if len(r.Messages) == 0 {
		return nil, nil, fmt.Errorf("messages: at least one message is required")
	}
	if len(r.Messages) > maxMessages {
		return nil, nil, fmt.Errorf("messages: at most %d", maxMessages)
	}
	if r.N != nil && (*r.N < 1 || *r.N > maxChoices) {
		return nil, nil, fmt.Errorf("n: want 1..%d", maxChoices)
	}
	if r.Choices() > 1 && r.Stream {
		return nil, nil, fmt.Errorf("n: a stream carries one choice here; ask for n > 1 without stream, or open n streams")
	}
	req := &inference.Request{Model: r.Model, Temperature: r.Temperature, TopP: r.TopP, Seed: r.Seed}
	if err := inference.CheckSampling(r.Temperature, r.TopP); err != nil {
		return nil, nil, err
	}
	switch {
	case r.MaxCompletionTokens != nil:
		req.MaxTokens = *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		req.MaxTokens = *r.MaxTokens
	}
	if req.MaxTokens < 0 {
		return nil, nil, fmt.Errorf("max_tokens: must not be negative")
	}
	if r.TopLogprobs != nil {
		if *r.TopLogprobs < 0 || *r.TopLogprobs > maxTopLogprobs {
			return nil, nil, fmt.Errorf("top_logprobs: want 0..%d", maxTopLogprobs)
		}
		if !r.Logprobs && *r.TopLogprobs > 0 {
			return nil, nil, fmt.Errorf("top_logprobs: requires logprobs: true")
		}
		req.TopLogprobs = *r.TopLogprobs
	}
	stops, err := Stops(r.Stop)
	if err != nil {
		return nil, nil, err
	}
	if len(stops) > maxStops {
		return nil, nil, fmt.Errorf("stop: at most %d sequences", maxStops)
	}
	req.Stop = stops
	if req.Messages, err = neutralMessages(r.Messages); err != nil {
		return nil, nil, err
	}
	if req.Tools, err = neutralTools(r.Tools); err != nil {
		return nil, nil, err
	}
	tc, err := DecodeToolChoice(r.ToolChoice)
	var modeErr *ToolChoiceModeError
	switch {
	case errors.As(err, &modeErr):
		return nil, nil, fmt.Errorf("tool_choice: want none, auto, required or a function")
	case err != nil:
		return nil, nil, fmt.Errorf("tool_choice: want none, auto, required or {type: function, function: {name}}")
	}
	choice := tc.Choice()
	req.ToolChoice = choice
	if choice != "" && choice != "none" && choice != "auto" && choice != "required" && !inference.ToolNamed(req.Tools, choice) {
		return nil, nil, fmt.Errorf("tool_choice: no tool named %q", choice)
	}
	if err := r.decodeParams(req); err != nil {
		return nil, nil, err
	}
	return &r, req, nil
}

// Limits of the forwarded sampling parameters.
const (
	maxLogitBias = 1024
	maxPenalty   = 2.0
)

// decodeParams checks the parameters the gateway forwards to the backend
// as they are (an upstream honours them; the in-process policy refuses
// what it cannot).
func (r *Request) decodeParams(req *inference.Request) error {
	if f := bytes.TrimSpace(r.ResponseFormat); len(f) > 0 && string(f) != "null" {
		var rf struct {
			Type       string          `json:"type"`
			JSONSchema json.RawMessage `json:"json_schema"`
		}
		if err := json.Unmarshal(f, &rf); err != nil {
			return fmt.Errorf("response_format: want an object such as {\"type\": \"json_object\"}")
		}
		switch rf.Type {
		case "text", "json_object":
		case "json_schema":
			var js struct {
				Name   string          `json:"name"`
				Schema json.RawMessage `json:"schema"`
			}
			if json.Unmarshal(rf.JSONSchema, &js) != nil || js.Name == "" {
				return fmt.Errorf("response_format.json_schema: want {\"name\": …, \"schema\": {…}}")
			}
		default:
			return fmt.Errorf("response_format.type: want text, json_object or json_schema, got %q", rf.Type)
		}
		req.ResponseFormat = f
	}
	for name, p := range map[string]*float64{"frequency_penalty": r.FrequencyPenalty, "presence_penalty": r.PresencePenalty} {
		if p != nil && (*p < -maxPenalty || *p > maxPenalty || *p != *p) {
			return fmt.Errorf("%s: want -2..2", name)
		}
	}
	req.FrequencyPenalty, req.PresencePenalty = r.FrequencyPenalty, r.PresencePenalty
	if len(r.LogitBias) > maxLogitBias {
		return fmt.Errorf("logit_bias: at most %d tokens", maxLogitBias)
	}
	for tok, b := range r.LogitBias {
		if id, err := strconv.Atoi(tok); err != nil || id < 0 {
			return fmt.Errorf("logit_bias: keys are token ids, got %q", tok)
		}
		if b < -100 || b > 100 || b != b {
			return fmt.Errorf("logit_bias[%s]: want -100..100", tok)
		}
	}
	if len(r.LogitBias) > 0 {
		req.LogitBias = r.LogitBias
	}
	req.ParallelToolCalls = r.ParallelToolCalls
	return nil
}

// Stops reads stop: a string, an array of strings, or null. How many
// sequences are too many is the reader's policy, not the format's.
func Stops(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("stop: want a string or an array of strings")
	}
	return many, nil
}

// DecodeMessages reads a messages array as Decode reads a request's (a
// stored conversation, such as a suite prompt's); errors name the
// message and field.
func DecodeMessages(raw json.RawMessage) ([]inference.Message, error) {
	var msgs []Message
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fmt.Errorf("messages: want an array of messages: %v", err)
	}
	return neutralMessages(msgs)
}

// DecodeTools reads a tools array as Decode reads a request's; nil for
// none (absent or null).
func DecodeTools(raw json.RawMessage) ([]inference.Tool, error) {
	if raw = bytes.TrimSpace(raw); len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var tools []Tool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, fmt.Errorf("tools: want an array of {type: function, function: {name, description, parameters}}: %v", err)
	}
	return neutralTools(tools)
}

func neutralMessages(msgs []Message) ([]inference.Message, error) {
	out := make([]inference.Message, 0, len(msgs))
	for i, m := range msgs {
		msg, err := m.neutral()
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %v", i, err)
		}
		out = append(out, msg)
	}
	return out, nil
}

func neutralTools(tools []Tool) ([]inference.Tool, error) {
	if len(tools) > maxTools {
		return nil, fmt.Errorf("tools: at most %d", maxTools)
	}
	var out []inference.Tool
	for i, t := range tools {
		if t.Type != "" && t.Type != "function" {
			return nil, fmt.Errorf("tools[%d].type: only function tools are supported", i)
		}
		if t.Function.Name == "" {
			return nil, fmt.Errorf("tools[%d].function.name: required", i)
		}
		if len(t.Function.Parameters) > 0 && !json.Valid(t.Function.Parameters) {
			return nil, fmt.Errorf("tools[%d].function.parameters: invalid JSON", i)
		}
		out = append(out, inference.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}
	return out, nil
}

// neutral converts one wire message; content may be a string, null or an
// array of parts of which only text is supported.
func (m Message) neutral() (inference.Message, error) {
	switch m.Role {
	case "system", "developer":
		m.Role = inference.RoleSystem
	case inference.RoleUser, inference.RoleAssistant, inference.RoleTool:
	default:
		return inference.Message{}, fmt.Errorf("role: want system, developer, user, assistant or tool, got %q", m.Role)
	}
	text, err := contentText(m.Content)
	if err != nil {
		return inference.Message{}, err
	}
	out := inference.Message{Role: m.Role, Content: text, Name: m.Name, ToolCallID: m.ToolCallID, Reasoning: m.ReasoningContent}
	if m.Role == inference.RoleTool && m.ToolCallID == "" {
		return inference.Message{}, fmt.Errorf("tool_call_id: required on a tool message")
	}
	for j, tc := range m.ToolCalls {
		if m.Role != inference.RoleAssistant {
			return inference.Message{}, fmt.Errorf("tool_calls: only on assistant messages")
		}
		if tc.Function.Name == "" {
			return inference.Message{}, fmt.Errorf("tool_calls[%d].function.name: required", j)
		}
		out.ToolCalls = append(out.ToolCalls, inference.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	return out, nil
}

func contentText(raw json.RawMessage) (string, error) {
	return protocol.Text(raw, "content: want a string or an array of parts", func(i int, p struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}) (string, error) {
		if p.Type != "text" {
			return "", fmt.Errorf("content[%d]: only text parts are supported, got %q", i, p.Type)
		}
		return p.Text, nil
	})
}

// OpenAI responses.

type Completion struct {
	ID                string   `json:"id"`
	Object            string   `json:"object"`
	Created           int64    `json:"created"`
	Model             string   `json:"model"`
	SystemFingerprint string   `json:"system_fingerprint,omitempty"`
	Choices           []Choice `json:"choices"`
	Usage             *Usage   `json:"usage,omitempty"`
}

type Choice struct {
	Index        int          `json:"index"`
	Message      *RespMessage `json:"message,omitempty"`
	Delta        *RespMessage `json:"delta,omitempty"`
	FinishReason *string      `json:"finish_reason"`
	Logprobs     *Logprobs    `json:"logprobs"`
}

type RespMessage struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	Refusal          *string    `json:"refusal,omitempty"`
}

type Logprobs struct {
	Content []TokenLogprob `json:"content"`
}

// TokenLogprob is one sampled token's log probability, with
// alternatives (the Responses API uses the same shape).
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// TopLogprob is one alternative at a position.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func TokenText(resp *inference.Response, i int) string {
	if i < len(resp.CompletionTokens) {
		return resp.CompletionTokens[i]
	}
	if i < len(resp.CompletionTokenIDs) {
		return fmt.Sprintf("token_id:%d", resp.CompletionTokenIDs[i])
	}
	return ""
}

func Bytes(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// DeltaLogprobs renders a streamed increment's logprobs.
func DeltaLogprobs(d inference.Delta) []TokenLogprob {
	out := make([]TokenLogprob, 0, len(d.Logprobs))
	for i, l := range d.Logprobs {
		tok := ""
		if i < len(d.Tokens) {
			tok = d.Tokens[i]
		} else if i < len(d.TokenIDs) {
			tok = TokenText(&inference.Response{CompletionTokenIDs: d.TokenIDs}, i)
		}
		out = append(out, TokenLogprob{Token: tok, Logprob: float64(l), Bytes: Bytes(tok), TopLogprobs: []TopLogprob{}})
	}
	return out
}

// LogprobsFor renders logprobs for tokens [from, to) of resp.
func LogprobsFor(resp *inference.Response, from, to int) *Logprobs {
	lp := &Logprobs{Content: []TokenLogprob{}}
	for i := from; i < to && i < len(resp.Logprobs); i++ {
		tok := TokenText(resp, i)
		e := TokenLogprob{Token: tok, Logprob: float64(resp.Logprobs[i]), Bytes: Bytes(tok), TopLogprobs: []TopLogprob{}}
		if i < len(resp.TopLogprobs) {
			for _, t := range resp.TopLogprobs[i] {
				tt := t.Token
				if tt == "" {
					tt = fmt.Sprintf("token_id:%d", t.TokenID)
				}
				e.TopLogprobs = append(e.TopLogprobs, TopLogprob{Token: tt, Logprob: float64(t.Logprob), Bytes: Bytes(tt)})
			}
		}
		lp.Content = append(lp.Content, e)
	}
	return lp
}

func RenderToolCalls(calls []inference.ToolCall, withIndex bool) []ToolCall {
	out := make([]ToolCall, len(calls))
	for i, tc := range calls {
		out[i].ID, out[i].Type = tc.ID, "function"
		out[i].Function.Name, out[i].Function.Arguments = tc.Name, tc.Arguments
		if withIndex {
			idx := i
			out[i].Index = &idx
		}
	}
	return out
}

func FinishReason(reason string) string {
	switch reason {
	case inference.FinishLength, inference.FinishToolCalls, inference.FinishStop:
		return reason
	case "":
		return inference.FinishStop
	default:
		return reason
	}
}
