package gateway

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/anthropic"
)

// anthropicVersion checks the anthropic-version header, which Anthropic's
// API requires of every request, and echoes it.
func anthropicVersion(c *gin.Context) error {
	v := c.GetHeader("anthropic-version")
	if v == "" {
		return errf(http.StatusBadRequest, "anthropic-version: header is required")
	}
	c.Header("anthropic-version", v)
	return nil
}

// countTokens is POST /v1/messages/count_tokens (Anthropic): the prompt's
// tokens as the model would see them, the deployment's serving harness and
// the tenant's playbook lessons included, counted by the backend's own
// tokenizer. Nothing is generated or captured.
func (s *Server) countTokens(c *gin.Context) {
	body, err := readBody(c)
	if err == nil {
		err = anthropicVersion(c)
	}
	if err != nil {
		abort(c, err)
		return
	}
	_, req, err := anthropic.DecodeBody(body, false)
	if err != nil {
		_, req, err = s.decodeRelayed(c, body, false, err)
	}
	if err != nil {
		abort(c, errf(http.StatusBadRequest, "%v", err))
		return
	}
	p := principalOf(c)
	if err := p.mayUse(req.Model); err != nil {
		abort(c, err)
		return
	}
	t, err := s.router.resolve(c.Request.Context(), req.Model, p.TenantID, p.SessionID)
	if err != nil {
		abort(c, err)
		return
	}
	if relay, ok := relayOf(t); ok {
		relayCountTokens(c, t, relay, body, req.Tools)
		return
	}
	counter, ok := t.backend.(inference.Counter)
	if !ok {
		abort(c, errf(http.StatusNotImplemented, "model %q cannot count tokens: its backend has no tokenizer the gateway can reach", req.Model))
		return
	}
	req.Version = t.version
	req.Messages = artefact.InjectSystem(req.Messages, t.system)
	req.Tools, _ = t.artefacts.Tools(p.TenantID, req.Tools)
	n, err := counter.CountTokens(c.Request.Context(), req)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"input_tokens": n})
}

// messages is POST /v1/messages (Anthropic); a deployment of Anthropic's
// own dialect has the body relayed (relay_anthropic.go).
func (s *Server) messages(c *gin.Context) {
	body, err := readBody(c)
	if err == nil {
		err = anthropicVersion(c)
	}
	if err != nil {
		abort(c, err)
		return
	}
	wire, req, err := anthropic.Decode(body)
	if err != nil {
		wire, req, err = s.decodeRelayed(c, body, true, err)
	}
	if err != nil {
		abort(c, errf(http.StatusBadRequest, "%v", err))
		return
	}
	endUser := ""
	if wire.Metadata != nil {
		endUser = wire.Metadata.UserID
	}
	cl, err := s.prepare(c, protoAnthropic, req, wire.Stream, endUser, "")
	if err != nil {
		abort(c, err)
		return
	}
	if relay, ok := relayOf(cl.target); ok {
		s.relayMessages(c, cl, relay, body, wire.Stream)
		return
	}
	if wire.Stream {
		s.streamAnthropic(c, cl, wire)
		return
	}
	resp, err := s.generate(c, cl)
	if err != nil {
		abort(c, err)
		return
	}
	stop, seq := anthropic.Stop(resp)
	c.JSON(http.StatusOK, anthropic.Response{
		ID: cl.completionID, Type: "message", Role: inference.RoleAssistant, Model: wire.Model,
		Content: anthropic.Content(resp.Message), StopReason: &stop, StopSequence: seq,
		Usage: anthropic.Usage{InputTokens: resp.Usage.PromptTokens, OutputTokens: resp.Usage.CompletionTokens},
	})
}

// streamAnthropic serves a Messages stream: message_start, then the
// content blocks as they are generated (thinking with thinking_delta, text
// with text_delta, tool_use with input_json_delta as the backend streams
// the call's input; a backend that holds its calls back sends each whole
// at the end), each opened on its first increment and stopped when the
// next begins, then message_delta and message_stop; an error event if
// generation or capture fails after the stream started.
func (s *Server) streamAnthropic(c *gin.Context, cl *call, wire *anthropic.Request) {
	s.checkReuse(cl)
	w := &sseWriter{c: c}
	b := &anBlocks{w: w}
	clientGone := false
	begin := func() error {
		if w.started {
			return nil
		}
		return w.event("message_start", gin.H{"type": "message_start", "message": anthropic.Response{
			ID: cl.completionID, Type: "message", Role: inference.RoleAssistant, Model: wire.Model, Content: []anthropic.Block{},
		}})
	}
	var textCarry, reasonCarry utf8Carry
	emit := func(d inference.Delta) error {
		err := begin()
		d.Text, d.Reasoning = textCarry.next(d.Text), reasonCarry.next(d.Reasoning)
		if err == nil && d.Reasoning != "" {
			if err = b.open("thinking", gin.H{"type": "thinking", "thinking": "", "signature": ""}); err == nil {
				err = b.delta(gin.H{"type": "thinking_delta", "thinking": d.Reasoning})
			}
		}
		if err == nil && d.Text != "" {
			if err = b.open("text", gin.H{"type": "text", "text": ""}); err == nil {
				err = b.delta(gin.H{"type": "text_delta", "text": d.Text})
			}
		}
		for _, tc := range d.ToolCalls {
			if err != nil {
				break
			}
			if err = b.openCall(tc); err == nil && tc.Arguments != "" {
				err = b.delta(gin.H{"type": "input_json_delta", "partial_json": tc.Arguments})
			}
		}
		if err != nil {
			clientGone = true
		}
		return err
	}
	resp, genErr := s.runStream(c, cl, emit, &clientGone, b.callIDs)
	if genErr != nil {
		if !w.started {
			abort(c, genErr)
			return
		}
		_ = w.event("error", errorBody(protoAnthropic, asAPIError(genErr)))
		return
	}
	if err := emit(inference.Delta{Text: textCarry.flush(), Reasoning: reasonCarry.flush()}); err != nil {
		return
	}
	if b.count == 0 && len(resp.Message.ToolCalls) == 0 {
		// A message has at least one block, if only an empty text.
		if b.open("text", gin.H{"type": "text", "text": ""}) != nil {
			return
		}
	}
	if b.close() != nil {
		return
	}
	if len(b.calls) == 0 {
		for _, tc := range resp.Message.ToolCalls {
			if b.openCall(inference.ToolCallDelta{ID: tc.ID, Name: tc.Name}) != nil ||
				b.delta(gin.H{"type": "input_json_delta", "partial_json": string(anthropic.ToolInput(tc.Arguments))}) != nil ||
				b.close() != nil {
				return
			}
		}
	}
	stop, seq := anthropic.Stop(resp)
	if w.event("message_delta", gin.H{"type": "message_delta",
		"delta": gin.H{"stop_reason": stop, "stop_sequence": seq},
		"usage": gin.H{"input_tokens": resp.Usage.PromptTokens, "output_tokens": resp.Usage.CompletionTokens}}) != nil {
		return
	}
	_ = w.event("message_stop", gin.H{"type": "message_stop"})
}

// anBlocks numbers a Messages stream's content blocks and keeps one open
// at a time.
type anBlocks struct {
	w *sseWriter
	// count is how many blocks were opened; the open one is count-1.
	count int
	kind  string // of the open block, "" when none is
	call  int    // the backend's index of the open tool_use block
	// calls are the tool calls streamed, in order, with the ids the
	// client was shown.
	calls []streamedCall
}

func (b *anBlocks) open(kind string, block gin.H) error {
	if b.kind == kind && kind != "tool_use" {
		return nil
	}
	if err := b.close(); err != nil {
		return err
	}
	b.kind = kind
	b.count++
	return b.w.event("content_block_start", gin.H{"type": "content_block_start", "index": b.count - 1, "content_block": block})
}

// openCall opens the tool_use block of the call tc belongs to, unless it
// is the open one.
func (b *anBlocks) openCall(tc inference.ToolCallDelta) error {
	if b.kind == "tool_use" && b.call == tc.Index {
		return nil
	}
	id := tc.ID
	if id == "" {
		id = newID("toolu_")
	}
	b.calls = append(b.calls, streamedCall{index: tc.Index, id: id})
	if err := b.open("tool_use", gin.H{"type": "tool_use", "id": id, "name": tc.Name, "input": gin.H{}}); err != nil {
		return err
	}
	b.call = tc.Index
	return nil
}

func (b *anBlocks) delta(d gin.H) error {
	return b.w.event("content_block_delta", gin.H{"type": "content_block_delta", "index": b.count - 1, "delta": d})
}

func (b *anBlocks) close() error {
	if b.kind == "" {
		return nil
	}
	b.kind = ""
	return b.w.event("content_block_stop", gin.H{"type": "content_block_stop", "index": b.count - 1})
}

// callIDs are the ids the client was shown for the streamed calls.
func (b *anBlocks) callIDs() []string {
	ids := make([]string, len(b.calls))
	for i, c := range b.calls {
		ids[i] = c.id
	}
	return ids
}
