package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// Stream runs one streaming generation.
func (b *Backend) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	start := time.Now()
	var resp *inference.Response
	var err error
	if b.native(req) {
		resp, err = b.streamGenerate(ctx, req, emit)
	}
	if !b.native(req) || errors.Is(err, errNoChatTokens) {
		var body []byte
		if body, err = json.Marshal(b.wire(req, true)); err != nil {
			return nil, fmt.Errorf("upstream: encode request: %w", err)
		}
		resp, err = b.streamFrom(ctx, b.cfg.BaseURL+"/chat/completions", body, b.readStream, emit)
	}
	if err != nil {
		return resp, err
	}
	b.learnIDs(resp)
	resp.Latency = time.Since(start)
	return resp, nil
}

// streamFrom posts body to url and reads the answer's stream with read.
// Retries happen only before the first increment was emitted: after that
// the client has seen output.
func (b *Backend) streamFrom(ctx context.Context, url string, body []byte,
	read func(io.Reader, func(inference.Delta) error) (*inference.Response, error), emit func(inference.Delta) error) (*inference.Response, error) {
	var resp *inference.Response
	emitted := false
	err := b.retry(ctx, func(ctx context.Context) error {
		if emitted {
			return errNoRetry
		}
		httpResp, err := b.postTo(ctx, url, body)
		if err != nil {
			return err
		}
		defer httpResp.Body.Close()
		resp, err = read(httpResp.Body, func(d inference.Delta) error {
			emitted = true
			return emit(d)
		})
		if err != nil && emitted {
			return noRetry{err}
		}
		return err
	})
	var nr noRetry
	if errors.As(err, &nr) {
		err = nr.err
	}
	return resp, err
}

func (b *Backend) readStream(r io.Reader, emit func(inference.Delta) error) (*inference.Response, error) {
	resp := &inference.Response{ModelVersion: b.version("")}
	resp.Message.Role = inference.RoleAssistant
	var content, reasoning strings.Builder
	calls := toolCallParts{calls: map[int]*inference.ToolCall{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		var w wireResponse
		if err := unmarshalWire(data, &w); err != nil {
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable stream chunk", Err: err}
		}
		if w.Error != nil {
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream failed: " + w.Error.Message}
		}
		if w.Model != "" {
			resp.ModelVersion = b.version(w.Model)
		}
		if len(w.PromptTokenIDs) > 0 {
			resp.PromptTokenIDs = w.PromptTokenIDs
		}
		if w.Usage != nil {
			resp.Usage = inference.Usage{PromptTokens: w.Usage.PromptTokens, CompletionTokens: w.Usage.CompletionTokens}
		}
		if len(w.Choices) == 0 {
			continue
		}
		ch := w.Choices[0]
		d := inference.Delta{TokenIDs: ch.TokenIDs, Reasoning: ch.Delta.ReasoningContent}
		if ch.Delta.Content != nil {
			d.Text = *ch.Delta.Content
		}
		resp.CompletionTokenIDs = append(resp.CompletionTokenIDs, ch.TokenIDs...)
		if ch.Logprobs != nil {
			before := len(resp.CompletionTokenIDs)
			addLogprobs(resp, ch.Logprobs.Content, len(ch.TokenIDs) == 0)
			for _, lp := range ch.Logprobs.Content {
				d.Logprobs = append(d.Logprobs, lp.Logprob)
				d.Tokens = append(d.Tokens, lp.Token)
			}
			if len(ch.TokenIDs) == 0 {
				d.TokenIDs = resp.CompletionTokenIDs[min(before, len(resp.CompletionTokenIDs)):]
			}
		}
		for _, tc := range ch.Delta.ToolCalls {
			d.ToolCalls = append(d.ToolCalls, calls.add(tc))
		}
		if ch.FinishReason != nil {
			resp.FinishReason = *ch.FinishReason
		}
		if ch.StopReason != "" {
			resp.StopSequence = string(ch.StopReason)
		}
		content.WriteString(d.Text)
		reasoning.WriteString(d.Reasoning)
		if d.Text != "" || d.Reasoning != "" || len(d.TokenIDs) > 0 || len(d.ToolCalls) > 0 {
			if err := emit(d); err != nil {
				return resp, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream broke", Err: err}
	}
	if !done {
		return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream ended without [DONE]"}
	}
	resp.Message.Content = content.String()
	resp.Message.Reasoning = reasoning.String()
	for _, i := range calls.order {
		resp.Message.ToolCalls = append(resp.Message.ToolCalls, *calls.calls[i])
	}
	return resp, nil
}

// toolCallParts joins the pieces of each tool call a stream sends, by
// index, in the order the indexes first came.
type toolCallParts struct {
	calls map[int]*inference.ToolCall
	order []int
}

// add joins one piece to its call and returns it as the client's delta.
func (p *toolCallParts) add(tc openai.ToolCall) inference.ToolCallDelta {
	idx := 0
	if tc.Index != nil {
		idx = *tc.Index
	}
	c, ok := p.calls[idx]
	if !ok {
		c = &inference.ToolCall{}
		p.calls[idx] = c
		p.order = append(p.order, idx)
	}
	if tc.ID != "" {
		c.ID = tc.ID
	}
	if tc.Function.Name != "" {
		c.Name = tc.Function.Name
	}
	c.Arguments += tc.Function.Arguments
	return inference.ToolCallDelta{Index: idx, ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments}
}
