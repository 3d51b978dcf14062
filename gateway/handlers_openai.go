package gateway

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// chatCompletions is POST /v1/chat/completions.
func (s *Server) chatCompletions(c *gin.Context) {
	body, err := readBody(c)
	if err != nil {
		abort(c, err)
		return
	}
	wire, req, err := openai.Decode(body)
	if err != nil {
		abort(c, errf(http.StatusBadRequest, "%v", err))
		return
	}
	cl, err := s.prepare(c, protoOpenAI, req, wire.Stream, wire.User, "")
	if err != nil {
		abort(c, err)
		return
	}
	if wire.Stream {
		s.streamOpenAI(c, cl, wire)
		return
	}
	if n := wire.Choices(); n > 1 {
		resps, err := s.generateGroup(c, cl, n)
		if err != nil {
			abort(c, err)
			return
		}
		c.JSON(http.StatusOK, s.completion(cl, wire, resps...))
		return
	}
	resp, err := s.generate(c, cl)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, s.completion(cl, wire, resp))
}

// completion renders one response per choice; usage counts the prompt
// once and every choice's completion.
func (s *Server) completion(cl *call, wire *openai.Request, resps ...*inference.Response) openai.Completion {
	out := openai.Completion{
		ID: cl.completionID, Object: "chat.completion", Created: cl.started.Unix(), Model: wire.Model,
		SystemFingerprint: resps[0].ModelVersion, Usage: &openai.Usage{PromptTokens: resps[0].Usage.PromptTokens},
	}
	for i, resp := range resps {
		ch := oaChoiceFor(wire, resp)
		ch.Index = i
		out.Choices = append(out.Choices, ch)
		out.Usage.CompletionTokens += resp.Usage.CompletionTokens
	}
	out.Usage.TotalTokens = out.Usage.PromptTokens + out.Usage.CompletionTokens
	return out
}

func oaChoiceFor(wire *openai.Request, resp *inference.Response) openai.Choice {
	content := resp.Message.Content
	msg := &openai.RespMessage{Role: inference.RoleAssistant, Content: &content, ReasoningContent: resp.Message.Reasoning}
	if len(resp.Message.ToolCalls) > 0 {
		msg.ToolCalls = openai.RenderToolCalls(resp.Message.ToolCalls, false)
		if content == "" {
			msg.Content = nil
		}
	}
	finish := openai.FinishReason(resp.FinishReason)
	ch := openai.Choice{Message: msg, FinishReason: &finish}
	if wire.Logprobs {
		ch.Logprobs = openai.LogprobsFor(resp, 0, len(resp.Logprobs))
	}
	return ch
}

// streamOpenAI serves a Chat Completions stream. Nothing is sent until the
// backend produces its first increment, so a failure before that is a
// plain HTTP error; after it, failures are an error chunk and [DONE].
func (s *Server) streamOpenAI(c *gin.Context, cl *call, wire *openai.Request) {
	s.checkReuse(cl)
	w := &sseWriter{c: c}
	chunk := func(delta *openai.RespMessage, finish *string, lp *openai.Logprobs) openai.Completion {
		return openai.Completion{ID: cl.completionID, Object: "chat.completion.chunk", Created: cl.started.Unix(), Model: wire.Model,
			Choices: []openai.Choice{{Delta: delta, FinishReason: finish, Logprobs: lp}}}
	}
	empty := ""
	begin := func() error {
		if w.started {
			return nil
		}
		return w.event("", chunk(&openai.RespMessage{Role: inference.RoleAssistant, Content: &empty}, nil, nil))
	}
	clientGone := false
	var textCarry, reasonCarry utf8Carry
	// calls are the tool calls streamed as they arrived, by the backend's
	// index, in order; an id the backend did not send is made here, so
	// the client has it from the call's first chunk.
	var calls []streamedCall
	emit := func(d inference.Delta) error {
		if err := begin(); err != nil {
			clientGone = true
			return err
		}
		d.Text, d.Reasoning = textCarry.next(d.Text), reasonCarry.next(d.Reasoning)
		if d.Text == "" && d.Reasoning == "" && len(d.ToolCalls) == 0 {
			return nil
		}
		delta := &openai.RespMessage{ReasoningContent: d.Reasoning}
		if d.Text != "" || d.Reasoning != "" {
			text := d.Text
			delta.Content = &text
		}
		for _, tc := range d.ToolCalls {
			delta.ToolCalls = append(delta.ToolCalls, streamCall(&calls, tc))
		}
		var lp *openai.Logprobs
		if wire.Logprobs && len(d.Logprobs) > 0 {
			lp = &openai.Logprobs{Content: openai.DeltaLogprobs(d)}
		}
		if err := w.event("", chunk(delta, nil, lp)); err != nil {
			clientGone = true
			return err
		}
		return nil
	}
	resp, genErr := s.runStream(c, cl, emit, &clientGone, func() []string {
		ids := make([]string, len(calls))
		for i, sc := range calls {
			ids[i] = sc.id
		}
		return ids
	})
	if genErr != nil {
		if !w.started {
			abort(c, genErr)
			return
		}
		e := asAPIError(genErr)
		_ = w.event("", errorBody(protoOpenAI, e))
		_ = w.raw("data: [DONE]\n\n")
		return
	}
	if err := begin(); err != nil {
		return
	}
	if rest, r := textCarry.flush(), reasonCarry.flush(); rest != "" || r != "" {
		if err := w.event("", chunk(&openai.RespMessage{Content: &rest, ReasoningContent: r}, nil, nil)); err != nil {
			return
		}
	}
	if len(resp.Message.ToolCalls) > 0 && len(calls) == 0 {
		// A backend that does not stream its tool calls (the in-process
		// policy holds them back) sends them whole at the end.
		if err := w.event("", chunk(&openai.RespMessage{ToolCalls: openai.RenderToolCalls(resp.Message.ToolCalls, true)}, nil, nil)); err != nil {
			return
		}
	}
	finish := openai.FinishReason(resp.FinishReason)
	if err := w.event("", chunk(&openai.RespMessage{}, &finish, nil)); err != nil {
		return
	}
	if wire.StreamOptions != nil && wire.StreamOptions.IncludeUsage {
		u := openai.Completion{ID: cl.completionID, Object: "chat.completion.chunk", Created: cl.started.Unix(), Model: wire.Model,
			Choices: []openai.Choice{}, Usage: &openai.Usage{PromptTokens: resp.Usage.PromptTokens, CompletionTokens: resp.Usage.CompletionTokens,
				TotalTokens: resp.Usage.PromptTokens + resp.Usage.CompletionTokens}}
		if err := w.event("", u); err != nil {
			return
		}
	}
	_ = w.raw("data: [DONE]\n\n")
}

// runStream runs a streaming call through emit and captures it, as
// generate does for a whole one. clientGone says emit failed because the
// client went away; shown are the tool-call ids the client was shown, in
// order, which the backend's calls without an id keep. The error is the
// backend's or the capture's.
func (s *Server) runStream(c *gin.Context, cl *call, emit func(inference.Delta) error, clientGone *bool, shown func() []string) (*inference.Response, error) {
	resp, genErr := cl.target.backend.Stream(c.Request.Context(), cl.req, emit)
	return s.captureStreamed(c, cl, resp, genErr, *clientGone, shown)
}

// captureStreamed captures the outcome of a streaming call, as runStream
// describes: resp is what was generated (in part, where genErr says the
// stream broke).
func (s *Server) captureStreamed(c *gin.Context, cl *call, resp *inference.Response, genErr error, clientGone bool, shown func() []string) (*inference.Response, error) {
	status := statusOK
	switch {
	case genErr != nil && (clientGone || c.Request.Context().Err() != nil):
		status = statusCancelled
	case genErr != nil:
		status = statusUpstream
		s.metrics.backendErrors.WithLabelValues(cl.target.deployment, http.StatusText(asAPIError(genErr).Status)).Inc()
	}
	if genErr == nil {
		for i, id := range shown() {
			if i < len(resp.Message.ToolCalls) && resp.Message.ToolCalls[i].ID == "" {
				resp.Message.ToolCalls[i].ID = id // what the client was told
			}
		}
		fillToolCallIDs(cl.protocol, &resp.Message)
	}
	var captured *inference.Response
	if genErr == nil || resp != nil {
		captured = resp
	}
	if cerr := s.commit(c, cl, s.row(c, cl, captured, genErr, status)); cerr != nil && genErr == nil {
		genErr = cerr
	}
	return resp, genErr
}

// streamedCall is a tool call whose chunks went to the client.
type streamedCall struct {
	index int // the backend's
	id    string
}

// streamCall renders one tool-call increment as a Chat Completions delta:
// the call's first chunk has its id, type and name, later ones only more
// arguments; indexes are the calls' order of arrival.
func streamCall(calls *[]streamedCall, d inference.ToolCallDelta) openai.ToolCall {
	pos := -1
	for i, c := range *calls {
		if c.index == d.Index {
			pos = i
		}
	}
	var tc openai.ToolCall
	if pos < 0 {
		pos = len(*calls)
		id := d.ID
		if id == "" {
			id = newID("call_")
		}
		*calls = append(*calls, streamedCall{index: d.Index, id: id})
		tc.ID, tc.Type = id, "function"
	}
	tc.Index = &pos
	tc.Function.Name, tc.Function.Arguments = d.Name, d.Arguments
	return tc
}
