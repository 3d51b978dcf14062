package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// CountTokens implements inference.Counter with the server's tokenizer
// endpoint, which applies the model's own chat template (tokenize); a
// plain OpenAI server has none (501).
func (b *Backend) CountTokens(ctx context.Context, req *inference.Request) (int, error) {
	ids, err := b.tokenize(ctx, req)
	if err != nil {
		return 0, err
	}
	return len(ids), nil
}

// tokenize returns the prompt's token ids as the server's chat template
// and tokenizer make them: vLLM's POST /tokenize at the server's root
// (beside /v1), or SGLang's POST /v1/tokenize, whose TokenizeRequest
// takes "messages" and "tools" and renders them as its chat endpoint does
// (entrypoints/openai/protocol.py). Both answer {"tokens", "count",
// "max_model_len"}. A server without the route answers 501.
func (b *Backend) tokenize(ctx context.Context, req *inference.Request) ([]int, error) {
	var url string
	switch b.cfg.Dialect {
	case deployment.DialectVLLM:
		url = strings.TrimSuffix(b.cfg.BaseURL, "/v1") + "/tokenize"
	case deployment.DialectSGLang:
		url = b.cfg.BaseURL + "/tokenize"
	default:
		return nil, &inference.Error{Status: http.StatusNotImplemented, Message: "this upstream has no tokenizer endpoint (its dialect is plain OpenAI)"}
	}
	w := b.wire(req, false)
	in := tokenizeRequest{Model: w.Model, Messages: w.Messages, Tools: w.Tools}
	if b.cfg.Dialect == deployment.DialectVLLM {
		t := true
		in.AddGenerationPrompt = &t
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("upstream: encode request: %w", err)
	}
	var out struct {
		Tokens []int `json:"tokens"`
		Count  *int  `json:"count"`
	}
	err = b.retry(ctx, func(ctx context.Context) error {
		resp, err := b.postTo(ctx, url, body)
		if err != nil {
			var ie *inference.Error
			var st statusError
			if errors.As(err, &ie) && errors.As(err, &st) && st == http.StatusNotFound {
				ie.Status, ie.Message = http.StatusNotImplemented, "the upstream has no tokenize endpoint"
			}
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil || out.Count == nil || *out.Count != len(out.Tokens) {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable tokenize answer", Err: err}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// tokenizeRequest is the chat form of vLLM's and SGLang's tokenize
// request. add_generation_prompt is vLLM's (default true there too);
// SGLang always adds the generation prompt, as its chat endpoint does.
type tokenizeRequest struct {
	Model               string           `json:"model"`
	Messages            []openai.Message `json:"messages"`
	Tools               []openai.Tool    `json:"tools,omitempty"`
	AddGenerationPrompt *bool            `json:"add_generation_prompt,omitempty"`
}
