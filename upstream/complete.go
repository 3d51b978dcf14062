package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
)

// maxResponseBytes bounds a non-streaming answer; a longer one is cut
// and fails to decode.
const maxResponseBytes = 256 << 20

// bodyBuffers recycles response buffers: decoding copies every string out,
// so nothing keeps a reference into a buffer once it is put back.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putBodyBuffer returns buf to the pool unless one huge answer grew it.
func putBodyBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= 1<<20 {
		bodyBuffers.Put(buf)
	}
}

// Complete runs one non-streaming generation.
func (b *Backend) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	start := time.Now()
	if b.native(req) {
		resp, err := b.generate(ctx, req)
		if err == nil {
			resp.Latency = time.Since(start)
			return resp, nil
		}
		if !errors.Is(err, errNoChatTokens) {
			return nil, err
		}
	}
	body, err := json.Marshal(b.wire(req, false))
	if err != nil {
		return nil, fmt.Errorf("upstream: encode request: %w", err)
	}
	var resp *inference.Response
	err = b.retry(ctx, func(ctx context.Context) error {
		httpResp, err := b.post(ctx, body)
		if err != nil {
			return err
		}
		defer httpResp.Body.Close()
		buf := bodyBuffers.Get().(*bytes.Buffer)
		defer putBodyBuffer(buf)
		buf.Reset()
		var w wireResponse
		_, err = buf.ReadFrom(io.LimitReader(httpResp.Body, maxResponseBytes))
		if err == nil {
			err = decodeWire(buf.Bytes(), &w)
		}
		if err != nil {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable response", Err: err}
		}
		if w.Error != nil {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream failed: " + w.Error.Message}
		}
		if len(w.Choices) == 0 {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent no choices"}
		}
		resp = b.assemble(&w)
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.learnIDs(resp)
	resp.Latency = time.Since(start)
	return resp, nil
}

// learnIDs notes a server that answered logprobs but no token ids: it
// does not know return_token_ids, so later requests ask for the ids in
// the token strings instead. Asking for both always would cost every
// modern server its token text (vLLM computes bytes from that string).
func (b *Backend) learnIDs(resp *inference.Response) {
	if b.cfg.Dialect == deployment.DialectVLLM && resp != nil && len(resp.Logprobs) > 0 && len(resp.CompletionTokenIDs) == 0 {
		b.idsInTokens.Store(true)
	}
}

func (b *Backend) assemble(w *wireResponse) *inference.Response {
	ch := w.Choices[0]
	resp := &inference.Response{PromptTokenIDs: w.PromptTokenIDs, CompletionTokenIDs: ch.TokenIDs, ModelVersion: b.version(w.Model)}
	resp.Message.Role = inference.RoleAssistant
	if ch.Message.Content != nil {
		resp.Message.Content = *ch.Message.Content
	}
	resp.Message.Reasoning = ch.Message.ReasoningContent
	for _, tc := range ch.Message.ToolCalls {
		resp.Message.ToolCalls = append(resp.Message.ToolCalls, inference.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if ch.FinishReason != nil {
		resp.FinishReason = *ch.FinishReason
	}
	resp.StopSequence = string(ch.StopReason)
	if ch.Logprobs != nil {
		addLogprobs(resp, ch.Logprobs.Content, len(ch.TokenIDs) == 0)
	}
	if w.Usage != nil {
		resp.Usage = inference.Usage{PromptTokens: w.Usage.PromptTokens, CompletionTokens: w.Usage.CompletionTokens}
	}
	return resp
}

// addLogprobs appends per-token logprobs; with vLLM's
// return_tokens_as_token_ids the token text is "token_id:N", which also
// gives the id when the server did not return token_ids.
func addLogprobs(resp *inference.Response, lps []wireLogprob, idsFromTokens bool) {
	for _, lp := range lps {
		resp.Logprobs = append(resp.Logprobs, lp.Logprob)
		resp.CompletionTokens = append(resp.CompletionTokens, lp.Token)
		if idsFromTokens {
			if id, ok := tokenID(lp.Token); ok {
				resp.CompletionTokenIDs = append(resp.CompletionTokenIDs, id)
			}
		}
		if len(lp.TopLogprobs) > 0 {
			top := make([]inference.TopLogprob, len(lp.TopLogprobs))
			for i, t := range lp.TopLogprobs {
				id, _ := tokenID(t.Token)
				top[i] = inference.TopLogprob{TokenID: id, Token: t.Token, Logprob: t.Logprob}
			}
			resp.TopLogprobs = append(resp.TopLogprobs, top)
		}
	}
	if len(resp.CompletionTokenIDs) != len(resp.Logprobs) && idsFromTokens {
		resp.CompletionTokenIDs = nil // partial ids are worse than none
	}
}

func tokenID(tok string) (int, bool) {
	s, ok := strings.CutPrefix(tok, "token_id:")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}
