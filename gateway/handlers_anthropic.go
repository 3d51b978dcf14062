package gateway

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/evolution"
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
	counter, ok := t.backend.(inference.Counter)
	if !ok {
		abort(c, errf(http.StatusNotImplemented, "model %q cannot count tokens: its backend has no tokenizer the gateway can reach", req.Model))
		return
	}
	req.Version = t.version
	req.Messages = evolution.InjectSystem(req.Messages, t.system)
	req.Tools, _ = t.artefacts.Tools(p.TenantID, req.Tools)
	n, err := counter.CountTokens(c.Request.Context(), req)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"input_tokens": n})
}

// messages is POST /v1/messages (Anthropic).
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
	if wire.Stream {
		s.streamAnthropic(c, cl, wire)
		return
	}
	resp, err := s.generate(c, cl)
	if err != nil {
		abort(c, err)
		return
	}
	stop := anthropic.StopReason(resp.FinishReason)
	c.JSON(http.StatusOK, anthropic.Response{
		ID: cl.completionID, Type: "message", Role: inference.RoleAssistant, Model: wire.Model,
		Content: anthropic.Content(resp.Message), StopReason: &stop,
		Usage: anthropic.Usage{InputTokens: resp.Usage.PromptTokens, OutputTokens: resp.Usage.CompletionTokens},
	})
}

// streamAnthropic serves a Messages stream: message_start, a text block
// (opened on the first text), tool_use blocks once the call is complete,
// message_delta, message_stop; an error event if generation or capture
// fails after the stream started.
func (s *Server) streamAnthropic(c *gin.Context, cl *call, wire *anthropic.Request) {
	s.checkReuse(cl)
	w := &sseWriter{c: c}
	index := 0
	textOpen := false
	clientGone := false
	begin := func() error {
		if w.started {
			return nil
		}
		return w.event("message_start", gin.H{"type": "message_start", "message": anthropic.Response{
			ID: cl.completionID, Type: "message", Role: inference.RoleAssistant, Model: wire.Model, Content: []anthropic.Block{},
		}})
	}
	openText := func() error {
		if textOpen {
			return nil
		}
		textOpen = true
		return w.event("content_block_start", gin.H{"type": "content_block_start", "index": index,
			"content_block": gin.H{"type": "text", "text": ""}})
	}
	closeText := func() error {
		if !textOpen {
			return nil
		}
		textOpen = false
		err := w.event("content_block_stop", gin.H{"type": "content_block_stop", "index": index})
		index++
		return err
	}
	var carry utf8Carry
	emit := func(d inference.Delta) error {
		err := begin()
		d.Text = carry.next(d.Text)
		if err == nil && d.Text != "" {
			if err = openText(); err == nil {
				err = w.event("content_block_delta", gin.H{"type": "content_block_delta", "index": index,
					"delta": gin.H{"type": "text_delta", "text": d.Text}})
			}
		}
		if err != nil {
			clientGone = true
		}
		return err
	}
	resp, genErr := s.runStream(c, cl, emit, &clientGone, func() []string { return nil })
	if genErr != nil {
		if !w.started {
			abort(c, genErr)
			return
		}
		_ = w.event("error", errorBody(protoAnthropic, asAPIError(genErr)))
		return
	}
	if err := emit(inference.Delta{Text: carry.flush()}); err != nil {
		return
	}
	steps := []func() error{begin}
	if len(resp.Message.ToolCalls) == 0 {
		steps = append(steps, openText)
	}
	steps = append(steps, closeText)
	for _, step := range steps {
		if step() != nil {
			return
		}
	}
	for _, tc := range resp.Message.ToolCalls {
		if w.event("content_block_start", gin.H{"type": "content_block_start", "index": index,
			"content_block": gin.H{"type": "tool_use", "id": tc.ID, "name": tc.Name, "input": gin.H{}}}) != nil {
			return
		}
		if w.event("content_block_delta", gin.H{"type": "content_block_delta", "index": index,
			"delta": gin.H{"type": "input_json_delta", "partial_json": string(anthropic.ToolInput(tc.Arguments))}}) != nil {
			return
		}
		if w.event("content_block_stop", gin.H{"type": "content_block_stop", "index": index}) != nil {
			return
		}
		index++
	}
	if w.event("message_delta", gin.H{"type": "message_delta",
		"delta": gin.H{"stop_reason": anthropic.StopReason(resp.FinishReason), "stop_sequence": nil},
		"usage": gin.H{"input_tokens": resp.Usage.PromptTokens, "output_tokens": resp.Usage.CompletionTokens}}) != nil {
		return
	}
	_ = w.event("message_stop", gin.H{"type": "message_stop"})
}
