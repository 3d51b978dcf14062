package gateway

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/inference"
)

// messages is POST /v1/messages (Anthropic).
func (s *Server) messages(c *gin.Context) {
	body, err := readBody(c)
	if err != nil {
		abort(c, err)
		return
	}
	wire, req, err := decodeAnthropic(body)
	if err != nil {
		abort(c, err)
		return
	}
	endUser := ""
	if wire.Metadata != nil {
		endUser = wire.Metadata.UserID
	}
	cl, err := s.prepare(c, protoAnthropic, body, req, wire.Stream, endUser)
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
	stop := anStopReason(resp.FinishReason)
	c.JSON(http.StatusOK, anResponse{
		ID: cl.completionID, Type: "message", Role: inference.RoleAssistant, Model: wire.Model,
		Content: anContent(resp.Message), StopReason: &stop,
		Usage: anUsage{InputTokens: resp.Usage.PromptTokens, OutputTokens: resp.Usage.CompletionTokens},
	})
}

// streamAnthropic serves a Messages stream: message_start, a text block
// (opened on the first text), tool_use blocks once the call is complete,
// message_delta, message_stop; an error event if generation or capture
// fails after the stream started.
func (s *Server) streamAnthropic(c *gin.Context, cl *call, wire *anRequest) {
	s.checkReuse(cl)
	w := &sseWriter{c: c}
	index := 0
	textOpen := false
	clientGone := false
	begin := func() error {
		if w.started {
			return nil
		}
		return w.event("message_start", gin.H{"type": "message_start", "message": anResponse{
			ID: cl.completionID, Type: "message", Role: inference.RoleAssistant, Model: wire.Model, Content: []anBlock{},
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
	resp, genErr := cl.target.backend.Stream(c.Request.Context(), cl.req, emit)
	status := statusOK
	switch {
	case genErr != nil && (clientGone || c.Request.Context().Err() != nil):
		status = statusCancelled
	case genErr != nil:
		status = statusUpstream
		s.metrics.backendErrors.WithLabelValues(cl.target.deployment, http.StatusText(asAPIError(genErr).Status)).Inc()
	}
	if genErr == nil {
		fillToolCallIDs(protoAnthropic, &resp.Message)
	}
	if cerr := s.commit(c, cl, s.row(c, cl, resp, genErr, status)); cerr != nil && genErr == nil {
		genErr = cerr
	}
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
			"delta": gin.H{"type": "input_json_delta", "partial_json": string(toolInput(tc.Arguments))}}) != nil {
			return
		}
		if w.event("content_block_stop", gin.H{"type": "content_block_stop", "index": index}) != nil {
			return
		}
		index++
	}
	if w.event("message_delta", gin.H{"type": "message_delta",
		"delta": gin.H{"stop_reason": anStopReason(resp.FinishReason), "stop_sequence": nil},
		"usage": gin.H{"input_tokens": resp.Usage.PromptTokens, "output_tokens": resp.Usage.CompletionTokens}}) != nil {
		return
	}
	_ = w.event("message_stop", gin.H{"type": "message_stop"})
}
