package upstream

import (
	"encoding/json"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// wire is the chat request for req in the engine's dialect: always with
// logprobs, and on vLLM with its token-id extensions.
func (b *Backend) wire(req *inference.Request, stream bool) openai.Request {
	w := openai.Request{Model: b.cfg.Model, Messages: openai.EncodeMessages(req.Messages), Tools: openai.EncodeTools(req.Tools),
		ToolChoice: openai.EncodeToolChoice(req.ToolChoice), Temperature: req.Temperature, TopP: req.TopP,
		Stop: openai.EncodeStops(req.Stop), Seed: req.Seed, Logprobs: true, Stream: stream,
		ResponseFormat: req.ResponseFormat, ParallelToolCalls: req.ParallelToolCalls, FrequencyPenalty: req.FrequencyPenalty,
		PresencePenalty: req.PresencePenalty, LogitBias: req.LogitBias}
	if req.MaxTokens != 0 {
		w.MaxTokens = &req.MaxTokens
	}
	if req.TopLogprobs != 0 {
		w.TopLogprobs = &req.TopLogprobs
	}
	if b.cfg.VersionsByName && req.Version != "" {
		w.Model = req.Version
	}
	if stream {
		w.StreamOptions = &openai.StreamOptions{IncludeUsage: true}
	}
	if b.cfg.Dialect == deployment.DialectVLLM {
		w.ReturnTokenIDs = true
		w.TokensAsIDs = b.idsInTokens.Load()
	}
	return w
}

// The answer's envelope is the engine client's own, not openai.Completion:
// it is decoded per token on the gateway's hot path (decode.go), and
// openai's logprob shape would cost an allocation per token for "bytes",
// which the client never reads, and a float64 that the client rounds to
// float32 (twice rounded, where vLLM's float32 is parsed once here). Its
// messages, tool calls and usage are openai's.

// wireLogprob is one token's logprob as the engine sends it, less the
// bytes.
type wireLogprob struct {
	Token       string  `json:"token"`
	Logprob     float32 `json:"logprob"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float32 `json:"logprob"`
	} `json:"top_logprobs"`
}

type wireChoice struct {
	Message      openai.RespMessage `json:"message"`
	Delta        openai.RespMessage `json:"delta"`
	FinishReason *string            `json:"finish_reason"`
	// StopReason is vLLM's: the stop string that ended the answer.
	StopReason stopReason `json:"stop_reason"`
	Logprobs   *struct {
		Content []wireLogprob `json:"content"`
	} `json:"logprobs"`
	// TokenIDs is vLLM's (return_token_ids).
	TokenIDs []int `json:"token_ids"`
}

type wireResponse struct {
	// Error is set on a chunk that reports a failure after the stream
	// started (vLLM sends it, then [DONE]).
	Error   *wireError   `json:"error"`
	Model   string       `json:"model"`
	Choices []wireChoice `json:"choices"`
	// PromptTokenIDs is vLLM's (return_token_ids).
	PromptTokenIDs []int         `json:"prompt_token_ids"`
	Usage          *openai.Usage `json:"usage"`
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
