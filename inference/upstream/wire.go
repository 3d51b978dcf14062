package upstream

import (
	"encoding/json"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
)

type wireMessage struct {
	Role       string         `json:"role"`
	Content    *string        `json:"content"`
	Name       string         `json:"name,omitempty"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type wireToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

type wireRequest struct {
	Model       string        `json:"model"`
	Messages    []wireMessage `json:"messages"`
	Tools       []wireTool    `json:"tools,omitempty"`
	ToolChoice  any           `json:"tool_choice,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	Temperature *float64      `json:"temperature,omitempty"`
	TopP        *float64      `json:"top_p,omitempty"`
	Stop        []string      `json:"stop,omitempty"`
	Seed        *int64        `json:"seed,omitempty"`
	// The client's own parameters, forwarded as they came.
	ResponseFormat    json.RawMessage    `json:"response_format,omitempty"`
	ParallelToolCalls *bool              `json:"parallel_tool_calls,omitempty"`
	FrequencyPenalty  *float64           `json:"frequency_penalty,omitempty"`
	PresencePenalty   *float64           `json:"presence_penalty,omitempty"`
	LogitBias         map[string]float64 `json:"logit_bias,omitempty"`
	Logprobs          bool               `json:"logprobs"`
	TopLogprobs       int                `json:"top_logprobs,omitempty"`
	Stream            bool               `json:"stream,omitempty"`
	StreamOptions     *streamOptions     `json:"stream_options,omitempty"`
	ReturnTokenID     *bool              `json:"return_token_ids,omitempty"`
	TokensAsIDs       *bool              `json:"return_tokens_as_token_ids,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

func (b *Backend) wire(req *inference.Request, stream bool) wireRequest {
	w := wireRequest{Model: b.cfg.Model, MaxTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP,
		Stop: req.Stop, Seed: req.Seed, Logprobs: true, TopLogprobs: req.TopLogprobs, Stream: stream,
		ResponseFormat: req.ResponseFormat, ParallelToolCalls: req.ParallelToolCalls, FrequencyPenalty: req.FrequencyPenalty,
		PresencePenalty: req.PresencePenalty, LogitBias: req.LogitBias}
	if b.cfg.VersionsByName && req.Version != "" {
		w.Model = req.Version
	}
	if stream {
		w.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if b.cfg.Dialect == deployment.DialectVLLM {
		t := true
		w.ReturnTokenID = &t
		if b.idsInTokens.Load() {
			w.TokensAsIDs = &t
		}
	}
	for _, m := range req.Messages {
		content := m.Content
		wm := wireMessage{Role: m.Role, Content: &content, Name: m.Name, ToolCallID: m.ToolCallID}
		if m.Role == inference.RoleAssistant && content == "" && len(m.ToolCalls) > 0 {
			wm.Content = nil
		}
		for _, tc := range m.ToolCalls {
			var wt wireToolCall
			wt.ID, wt.Type = tc.ID, "function"
			wt.Function.Name, wt.Function.Arguments = tc.Name, tc.Arguments
			wm.ToolCalls = append(wm.ToolCalls, wt)
		}
		w.Messages = append(w.Messages, wm)
	}
	for _, t := range req.Tools {
		var wt wireTool
		wt.Type = "function"
		wt.Function.Name, wt.Function.Description, wt.Function.Parameters = t.Name, t.Description, t.Parameters
		w.Tools = append(w.Tools, wt)
	}
	switch req.ToolChoice {
	case "":
	case "auto", "none", "required":
		w.ToolChoice = req.ToolChoice
	default:
		w.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": req.ToolChoice}}
	}
	return w
}

type wireLogprob struct {
	Token       string  `json:"token"`
	Logprob     float32 `json:"logprob"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float32 `json:"logprob"`
	} `json:"top_logprobs"`
}

type wireChoice struct {
	Message struct {
		Content          *string        `json:"content"`
		ReasoningContent string         `json:"reasoning_content"`
		ToolCalls        []wireToolCall `json:"tool_calls"`
	} `json:"message"`
	Delta struct {
		Content          *string        `json:"content"`
		ReasoningContent string         `json:"reasoning_content"`
		ToolCalls        []wireToolCall `json:"tool_calls"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
	// StopReason is vLLM's: the stop string that ended the answer.
	StopReason stopReason `json:"stop_reason"`
	Logprobs   *struct {
		Content []wireLogprob `json:"content"`
	} `json:"logprobs"`
	TokenIDs []int `json:"token_ids"`
}

type wireResponse struct {
	// Error is set on a chunk that reports a failure after the stream
	// started (vLLM sends it, then [DONE]).
	Error          *wireError   `json:"error"`
	Model          string       `json:"model"`
	Choices        []wireChoice `json:"choices"`
	PromptTokenIDs []int        `json:"prompt_token_ids"`
	Usage          *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

type wireError struct {
	Message string `json:"message"`
}

// stopReason is vLLM's choice.stop_reason: the stop string that ended the
// answer; a stop token's id (a number) or null leave it "".
type stopReason string

func (r *stopReason) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '"' {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*r = stopReason(s)
	return nil
}
