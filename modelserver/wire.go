package modelserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// chatRequest is vLLM's ChatCompletionRequest, the fields the policy
// reads. Unknown fields are ignored, as vLLM ignores them (with a warning).
// Its parts are protocol/openai's where vLLM reads them as the gateway
// does; messages are read by vLLM's rules (messageContent, chatToolCall),
// and so is the whole (request). It is not openai.Request with those
// fields shadowed: encoding/json names the Go struct in its decode errors
// ("chatRequest.temperature"), which a client reads in the 400, and an
// embedded struct would add its name to that path.
type chatRequest struct {
	Model               string                `json:"model"`
	Messages            []chatMessage         `json:"messages"`
	Tools               []openai.Tool         `json:"tools"`
	ToolChoice          json.RawMessage       `json:"tool_choice"`
	MaxTokens           *int                  `json:"max_tokens"`
	MaxCompletionTokens *int                  `json:"max_completion_tokens"`
	Temperature         *float64              `json:"temperature"`
	TopP                *float64              `json:"top_p"`
	Stop                stopList              `json:"stop"`
	Seed                *int64                `json:"seed"`
	N                   *int                  `json:"n"`
	Logprobs            bool                  `json:"logprobs"`
	TopLogprobs         *int                  `json:"top_logprobs"`
	Stream              bool                  `json:"stream"`
	StreamOptions       *openai.StreamOptions `json:"stream_options"`
	ReturnTokenIDs      bool                  `json:"return_token_ids"`
	TokensAsIDs         bool                  `json:"return_tokens_as_token_ids"`
	ResponseFormat      json.RawMessage       `json:"response_format"`
	FrequencyPenalty    *float64              `json:"frequency_penalty"`
	PresencePenalty     *float64              `json:"presence_penalty"`
	LogitBias           map[string]float64    `json:"logit_bias"`
	ParallelToolCalls   *bool                 `json:"parallel_tool_calls"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    messageContent `json:"content"`
	Name       string         `json:"name"`
	ToolCalls  []chatToolCall `json:"tool_calls"`
	ToolCallID string         `json:"tool_call_id"`
}

// chatToolCall is openai.ToolCall as vLLM reads it: the arguments may be
// the object itself, not only its JSON text.
type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// messageContent is a message's text: a string, null, or an array of
// content parts of which the policy reads the text ones. It is read as the
// request is decoded, so its refusal is the decoder's.
type messageContent string

func (c *messageContent) UnmarshalJSON(raw []byte) error {
	text, err := protocol.Text(raw, "content must be a string, null or an array of content parts", func(i int, p struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}) (string, error) {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q: the policy reads text only", p.Type)
		}
		return p.Text, nil
	})
	*c = messageContent(text)
	return err
}

// stopList is stop, read as the request is decoded. vLLM sets no limit
// on how many sequences.
type stopList []string

func (s *stopList) UnmarshalJSON(raw []byte) (err error) {
	*s, err = openai.Stops(raw)
	return err
}

func isNull(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// toolChoice reads tool_choice (openai.DecodeToolChoice) and words its
// refusal as the model server always has; unlike the gateway it holds the
// named form to OpenAI's "type": "function", as vLLM does.
func toolChoice(raw json.RawMessage) (string, error) {
	tc, err := openai.DecodeToolChoice(raw)
	var modeErr *openai.ToolChoiceModeError
	switch {
	case errors.As(err, &modeErr):
		return "", fmt.Errorf("tool_choice %q: want auto, none, required or a named function", modeErr.Mode)
	case err != nil || (tc.Name != "" && tc.Type != "function"):
		return "", errors.New(`tool_choice: want auto, none, required or {"type": "function", "function": {"name": …}}`)
	}
	return tc.Choice(), nil
}

// arguments is a tool call's arguments as text: OpenAI sends a JSON
// string; an object sent as it is stays as its JSON text.
func arguments(raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(bytes.TrimSpace(raw))
}

// messages converts the chat messages.
func messages(in []chatMessage) ([]inference.Message, error) {
	out := make([]inference.Message, 0, len(in))
	for i, m := range in {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role is required", i)
		}
		msg := inference.Message{Role: m.Role, Content: string(m.Content), Name: m.Name, ToolCallID: m.ToolCallID}
		for _, tc := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, inference.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: arguments(tc.Function.Arguments)})
		}
		out = append(out, msg)
	}
	return out, nil
}

// tools converts the offered functions.
func tools(in []openai.Tool) ([]inference.Tool, error) {
	out := make([]inference.Tool, 0, len(in))
	for i, t := range in {
		if t.Type != "function" {
			return nil, fmt.Errorf("tools[%d].type %q: only function tools are supported", i, t.Type)
		}
		if t.Function.Name == "" {
			return nil, fmt.Errorf("tools[%d].function.name is required", i)
		}
		out = append(out, inference.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: t.Function.Parameters})
	}
	return out, nil
}

// request validates what vLLM validates before generating and converts
// the rest; the engine refuses what the policy's sampler cannot honour.
// Messages that vLLM also sends are in its words, capitals included.
func (c *chatRequest) request() (*inference.Request, error) {
	if c.N != nil && *c.N != 1 {
		return nil, fmt.Errorf("n %d: the policy answers one choice per request; send n 1 or leave it out", *c.N)
	}
	if c.StreamOptions != nil && !c.Stream {
		return nil, errors.New("Stream options can only be defined when `stream=True`.")
	}
	topLogprobs := 0
	if c.TopLogprobs != nil {
		topLogprobs = *c.TopLogprobs
		if topLogprobs > 0 && !c.Logprobs {
			return nil, errors.New("when using `top_logprobs`, `logprobs` must be set to true.")
		}
	}
	maxTokens := c.MaxTokens
	if c.MaxCompletionTokens != nil {
		maxTokens = c.MaxCompletionTokens // the newer name wins, as in vLLM
	}
	req := &inference.Request{Model: c.Model, Temperature: c.Temperature, TopP: c.TopP, Stop: c.Stop, Seed: c.Seed,
		TopLogprobs: topLogprobs, ResponseFormat: c.ResponseFormat, FrequencyPenalty: c.FrequencyPenalty,
		PresencePenalty: c.PresencePenalty, LogitBias: c.LogitBias, ParallelToolCalls: c.ParallelToolCalls}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return nil, fmt.Errorf("max_tokens must be at least 1, got %d.", *maxTokens)
		}
		req.MaxTokens = *maxTokens
	}
	var err error
	if req.Messages, err = messages(c.Messages); err != nil {
		return nil, err
	}
	if req.Tools, err = tools(c.Tools); err != nil {
		return nil, err
	}
	if req.ToolChoice, err = toolChoice(c.ToolChoice); err != nil {
		return nil, err
	}
	if req.ToolChoice != "" && req.ToolChoice != "auto" && req.ToolChoice != "none" && len(req.Tools) == 0 {
		return nil, errors.New("When using `tool_choice`, `tools` must be set.")
	}
	return req, nil
}

// The answer's wire types, in vLLM's shape. Its envelopes are not
// openai.Completion and openai.Choice: vLLM writes a message's tool_calls
// even when empty and leaves what is unset out of a stream chunk (no
// "logprobs": null, an empty delta as {}), and its logprobs are float32.

type chatCompletion struct {
	ID             string             `json:"id"`
	Object         string             `json:"object"`
	Created        int64              `json:"created"`
	Model          string             `json:"model"`
	Choices        []completionChoice `json:"choices"`
	Usage          openai.Usage       `json:"usage"`
	PromptTokenIDs []int              `json:"prompt_token_ids,omitempty"`
}

type completionChoice struct {
	Index        int           `json:"index"`
	Message      wireMessage   `json:"message"`
	Logprobs     *wireLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
	StopReason   *string       `json:"stop_reason,omitempty"`
	TokenIDs     []int         `json:"token_ids,omitempty"`
}

type wireMessage struct {
	Role    string  `json:"role"`
	Content *string `json:"content"`
	// ReasoningContent is exposed thinking, as vLLM's reasoning parser
	// returns it, where the engine has any.
	ReasoningContent string            `json:"reasoning_content,omitempty"`
	ToolCalls        []openai.ToolCall `json:"tool_calls"`
}

type wireLogprobs struct {
	Content []wireLogprob `json:"content"`
}

type wireLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	// Bytes are the token's bytes as numbers ([]byte would encode as
	// base64).
	Bytes       []int            `json:"bytes"`
	TopLogprobs []wireTopLogprob `json:"top_logprobs"`
}

type wireTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatChunk struct {
	ID             string        `json:"id"`
	Object         string        `json:"object"`
	Created        int64         `json:"created"`
	Model          string        `json:"model"`
	Choices        []chunkChoice `json:"choices"`
	Usage          *openai.Usage `json:"usage,omitempty"`
	PromptTokenIDs []int         `json:"prompt_token_ids,omitempty"`
}

type chunkChoice struct {
	Index        int           `json:"index"`
	Delta        chunkDelta    `json:"delta"`
	Logprobs     *wireLogprobs `json:"logprobs,omitempty"`
	FinishReason *string       `json:"finish_reason"`
	StopReason   *string       `json:"stop_reason,omitempty"`
	TokenIDs     []int         `json:"token_ids,omitempty"`
}

type chunkDelta struct {
	Role             string            `json:"role,omitempty"`
	Content          *string           `json:"content,omitempty"`
	ReasoningContent string            `json:"reasoning_content,omitempty"`
	ToolCalls        []openai.ToolCall `json:"tool_calls,omitempty"`
}

// errorBody is vLLM's ErrorResponse.
type errorBody struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}
