// Package inference defines the contract between the gateway and whatever
// produces model output: the in-process policy (trainer) or an upstream
// OpenAI-compatible server (vLLM, SGLang, OpenAI). It owns only types; it must
// not know about HTTP handlers, Postgres or Temporal.
package inference

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Roles of a chat message.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// Finish reasons, in OpenAI's vocabulary; the Anthropic surface maps them.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishToolCalls = "tool_calls"
	FinishError     = "error"
)

// Message is one chat message in protocol-neutral form.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content,omitempty"`
	Name       string     `json:"name,omitempty"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// Reasoning is the model's exposed internal state (thinking), if any.
	Reasoning string `json:"reasoning,omitempty"`
}

// ToolCall is a function call requested by the model. Arguments is the raw
// JSON text the model produced (it may be invalid JSON; callers decide).
type ToolCall struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolCallDelta is an increment of the Index-th tool call of an answer.
type ToolCallDelta struct {
	Index     int    `json:"index"`
	ID        string `json:"id,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// Tool is a function offered to the model.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Request is a normalised generation request.
type Request struct {
	// Model is the deployment name the client asked for.
	Model    string    `json:"model"`
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
	// ToolChoice is "", "auto", "none", "required" or a tool name.
	ToolChoice  string   `json:"tool_choice,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	Stop        []string `json:"stop,omitempty"`
	Seed        *int64   `json:"seed,omitempty"`
	// ResponseFormat is OpenAI's response_format object as the client sent
	// it ({"type": "text" | "json_object" | "json_schema", …}; nil: text).
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
	// ParallelToolCalls false asks for at most one tool call (nil: the
	// backend's default, which allows several).
	ParallelToolCalls *bool `json:"parallel_tool_calls,omitempty"`
	// FrequencyPenalty and PresencePenalty are OpenAI's, in [-2, 2].
	FrequencyPenalty *float64 `json:"frequency_penalty,omitempty"`
	PresencePenalty  *float64 `json:"presence_penalty,omitempty"`
	// LogitBias maps token ids (as decimal strings) to a bias in
	// [-100, 100] added to their logits.
	LogitBias map[string]float64 `json:"logit_bias,omitempty"`
	// TopLogprobs asks for that many alternatives per token (0: none).
	// Sampled-token logprobs are always requested: capture needs them.
	TopLogprobs int `json:"top_logprobs,omitempty"`
	// PromptTokenIDs, when set, are the token ids of a prefix of the prompt
	// stored from the previous turn; backends that tokenise must reuse them
	// for that prefix instead of re-tokenising (no drift between turns).
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
	// Version pins a model version (canary / shadow routing); "" = serving.
	Version string `json:"version,omitempty"`
}

// ToolNamed reports whether tools offers one called name.
func ToolNamed(tools []Tool, name string) bool {
	for _, t := range tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

// CheckSampling checks the sampling settings every protocol shares.
func CheckSampling(temperature, topP *float64) error {
	if t := temperature; t != nil && (*t < 0 || *t > 2 || *t != *t) {
		return fmt.Errorf("temperature: want 0..2")
	}
	if p := topP; p != nil && (*p <= 0 || *p > 1 || *p != *p) {
		return fmt.Errorf("top_p: want (0, 1]")
	}
	return nil
}

// Usage counts tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// TopLogprob is one alternative token at a position.
type TopLogprob struct {
	TokenID int     `json:"token_id"`
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
}

// Response is a finished generation with everything capture needs.
type Response struct {
	Message      Message `json:"message"`
	FinishReason string  `json:"finish_reason"`
	// PromptTokenIDs are the ids the backend actually conditioned on.
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
	// CompletionTokenIDs and Logprobs are aligned: one logprob per id,
	// under the behaviour policy that sampled it.
	CompletionTokenIDs []int          `json:"completion_token_ids,omitempty"`
	Logprobs           []float32      `json:"logprobs,omitempty"`
	CompletionTokens   []string       `json:"completion_tokens,omitempty"`
	TopLogprobs        [][]TopLogprob `json:"top_logprobs,omitempty"`
	// StopSequence is the stop sequence that ended the answer, where the
	// backend says which (vLLM's stop_reason, SGLang's matched): "" when
	// it ended otherwise, or the backend does not say.
	StopSequence string `json:"stop_sequence,omitempty"`
	// ModelVersion is the exact weights version that produced every token.
	ModelVersion string        `json:"model_version"`
	Usage        Usage         `json:"usage"`
	Latency      time.Duration `json:"latency"`
}

// Delta is one streamed increment.
type Delta struct {
	Text     string    `json:"text,omitempty"`
	TokenIDs []int     `json:"token_ids,omitempty"`
	Logprobs []float32 `json:"logprobs,omitempty"`
	// Tokens are the sampled tokens' text, aligned with Logprobs, where the
	// backend knows it.
	Tokens []string `json:"tokens,omitempty"`
	// ToolCalls are increments of tool calls, as they arrive: the first
	// increment of a call has its ID and Name, later ones more Arguments.
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
	// Reasoning is an increment of exposed thinking, if any.
	Reasoning string `json:"reasoning,omitempty"`
}

// Backend produces completions.
type Backend interface {
	// Complete runs one generation to the end.
	Complete(ctx context.Context, req *Request) (*Response, error)
	// Stream runs one generation, calling emit for each increment in order,
	// and returns the assembled response (tool calls are only in the final
	// response, though a backend may also stream their increments in
	// Delta.ToolCalls). An error from emit aborts generation and is returned.
	Stream(ctx context.Context, req *Request, emit func(Delta) error) (*Response, error)
}

// Counter is a Backend that can count a request's prompt tokens without
// generating (Anthropic's count_tokens): the in-process policy through
// its own tokenizer, a vLLM upstream through its /tokenize.
type Counter interface {
	CountTokens(ctx context.Context, req *Request) (int, error)
}

// Error is a backend failure with the HTTP status the gateway should answer.
type Error struct {
	// Status is an HTTP status: 400 for a bad request the backend rejected,
	// 429 for rate limits, 502 for a broken upstream, 503 when unavailable.
	Status     int
	Message    string
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("inference: %s (%d): %v", e.Message, e.Status, e.Err)
	}
	return fmt.Sprintf("inference: %s (%d)", e.Message, e.Status)
}

func (e *Error) Unwrap() error { return e.Err }
