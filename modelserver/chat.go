package modelserver

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// minLogprob stands for a logprob that is not a finite number, as vLLM
// writes -inf (JSON has no infinities).
const minLogprob = -9999

// handleChat is POST /v1/chat/completions.
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var wire chatRequest
	if !readJSON(w, r, &wire, errBadRequest, "invalid request") {
		return
	}
	req, err := wire.request()
	if err != nil {
		writeError(w, http.StatusBadRequest, errBadRequest, err.Error())
		return
	}
	version, _, ok := s.resolve(wire.Model)
	if !ok {
		modelNotFound(w, wire.Model)
		return
	}
	req.Version = version
	a := answer{id: "chatcmpl-" + rand.Text(), created: time.Now().Unix(), model: s.served(version), wire: &wire, tokenText: s.engine.TokenText}
	if wire.Stream {
		s.stream(w, r, req, a)
		return
	}
	resp, err := s.engine.Complete(r.Context(), req)
	if err != nil {
		s.engineError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, a.completion(resp))
}

// engineError answers a generation that failed before anything was sent.
func (s *Server) engineError(w http.ResponseWriter, r *http.Request, err error) {
	var ie *inference.Error
	switch {
	case errors.As(err, &ie):
		if ie.RetryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(ie.RetryAfter.Seconds()))))
		}
		writeError(w, ie.Status, errorType(ie.Status), ie.Message)
	case r.Context().Err() != nil:
		// The client left; nobody reads the answer.
	default:
		s.cfg.Logger.Error(msgGenerationFailed, "error", err)
		writeError(w, http.StatusInternalServerError, errInternal, err.Error())
	}
}

// answer is what every part of one answer repeats.
type answer struct {
	id      string
	created int64
	model   string
	wire    *chatRequest
	// tokenText is the engine's.
	tokenText func(id int) string
	// streamedToolCalls is set once the engine streamed tool-call
	// increments, so the finish does not send the calls again.
	streamedToolCalls bool
}

// completion is the non-streaming answer.
func (a answer) completion(resp *inference.Response) chatCompletion {
	content := resp.Message.Content
	msg := wireMessage{Role: inference.RoleAssistant, Content: &content, ReasoningContent: resp.Message.Reasoning,
		ToolCalls: openai.RenderToolCalls(resp.Message.ToolCalls, false)}
	if content == "" && len(msg.ToolCalls) > 0 {
		msg.Content = nil
	}
	choice := completionChoice{Message: msg, FinishReason: resp.FinishReason, StopReason: stopReason(resp)}
	if a.wire.Logprobs {
		choice.Logprobs = a.logprobs(resp.CompletionTokenIDs, resp.Logprobs, resp.TopLogprobs)
	}
	out := chatCompletion{ID: a.id, Object: "chat.completion", Created: a.created, Model: a.model,
		Choices: []completionChoice{choice}, Usage: usage(resp.Usage)}
	if a.wire.ReturnTokenIDs {
		out.Choices[0].TokenIDs = resp.CompletionTokenIDs
		out.PromptTokenIDs = resp.PromptTokenIDs
	}
	return out
}

// stopReason is vLLM's stop_reason: the stop sequence that ended the
// answer, where the engine says which.
func stopReason(resp *inference.Response) *string {
	if resp.StopSequence == "" {
		return nil
	}
	return &resp.StopSequence
}

func usage(u inference.Usage) openai.Usage {
	return openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
}

// logprobs is the logprobs object of ids; top, when the engine has it,
// holds each position's alternatives.
func (a answer) logprobs(ids []int, lps []float32, top [][]inference.TopLogprob) *wireLogprobs {
	out := &wireLogprobs{Content: make([]wireLogprob, len(ids))}
	for i, id := range ids {
		tok := a.token(id)
		lp := wireLogprob{Token: tok, Bytes: openai.Bytes(tok), TopLogprobs: []wireTopLogprob{}}
		if i < len(lps) {
			lp.Logprob = finite(lps[i])
		}
		if i < len(top) {
			for _, t := range top[i] {
				alt := a.token(t.TokenID)
				lp.TopLogprobs = append(lp.TopLogprobs, wireTopLogprob{Token: alt, Logprob: finite(t.Logprob), Bytes: openai.Bytes(alt)})
			}
		}
		out.Content[i] = lp
	}
	return out
}

// token is a token's text, or "token_id:N" when the client asked for ids
// in place of text (vLLM's return_tokens_as_token_ids).
func (a answer) token(id int) string {
	if a.wire.TokensAsIDs {
		return "token_id:" + strconv.Itoa(id)
	}
	return a.tokenText(id)
}

func finite(lp float32) float32 {
	if math.IsInf(float64(lp), 0) || math.IsNaN(float64(lp)) {
		return minLogprob
	}
	return lp
}

// stream answers with server-sent events, as vLLM streams: a first chunk
// with the role (and the prompt's ids), one chunk per engine increment,
// the tool calls the engine held back, the finish, the usage when asked,
// and [DONE]. Nothing is written until the engine produced its first
// token, so a refused request still gets its status and error JSON.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, req *inference.Request, a answer) {
	sse := &eventWriter{w: w}
	sse.flusher, _ = w.(http.Flusher)
	started := false
	start := func() error {
		started = true
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		empty := ""
		first := a.chunk(chunkChoice{Delta: chunkDelta{Role: inference.RoleAssistant, Content: &empty}})
		if a.wire.ReturnTokenIDs {
			// The engine renders the same prompt; rendering it here lets
			// the first chunk carry it, as vLLM's does.
			ids, err := s.engine.PromptTokens(req, true)
			if err != nil {
				return fmt.Errorf("render prompt: %w", err)
			}
			first.PromptTokenIDs = ids
		}
		return sse.send(first)
	}
	resp, err := s.engine.Stream(r.Context(), req, func(d inference.Delta) error {
		if !started {
			if err := start(); err != nil {
				return err
			}
		}
		a.streamedToolCalls = a.streamedToolCalls || len(d.ToolCalls) > 0
		return sse.send(a.deltaChunk(d))
	})
	if err != nil && !started {
		s.engineError(w, r, err)
		return
	}
	if err == nil && !started { // the engine emits every token: only defensive
		err = start()
	}
	if err == nil {
		err = s.finish(sse, resp, a)
	}
	if err == nil || r.Context().Err() != nil || sse.err != nil {
		return // done, or nobody is left to tell
	}
	// The status is sent: vLLM reports the failure in the stream, then
	// ends it.
	s.cfg.Logger.Error(msgGenerationFailed, "error", err, "model", a.model)
	msg := err.Error()
	var ie *inference.Error
	if errors.As(err, &ie) {
		msg = ie.Message
	}
	_ = sse.send(map[string]errorBody{"error": {Object: "error", Message: msg, Type: errInternal, Code: http.StatusInternalServerError}})
	_ = sse.done()
}

// finish sends what follows the last token.
func (s *Server) finish(sse *eventWriter, resp *inference.Response, a answer) error {
	if len(resp.Message.ToolCalls) > 0 && !a.streamedToolCalls {
		if err := sse.send(a.chunk(chunkChoice{Delta: chunkDelta{ToolCalls: openai.RenderToolCalls(resp.Message.ToolCalls, true)}})); err != nil {
			return err
		}
	}
	reason := resp.FinishReason
	if err := sse.send(a.chunk(chunkChoice{FinishReason: &reason, StopReason: stopReason(resp)})); err != nil {
		return err
	}
	if a.wire.StreamOptions != nil && a.wire.StreamOptions.IncludeUsage {
		u := usage(resp.Usage)
		c := a.chunk()
		c.Usage = &u
		if err := sse.send(c); err != nil {
			return err
		}
	}
	return sse.done()
}

// chunk is one chat.completion.chunk with choices (none: a usage chunk).
func (a answer) chunk(choices ...chunkChoice) chatChunk {
	if choices == nil {
		choices = []chunkChoice{}
	}
	return chatChunk{ID: a.id, Object: "chat.completion.chunk", Created: a.created, Model: a.model, Choices: choices}
}

// deltaChunk carries one engine increment: its text (or its tool-call
// increments and its thinking, where the engine streams them), and its
// tokens' ids and logprobs when asked. The engine's increments carry no
// alternatives, so top_logprobs stay empty in a stream.
func (a answer) deltaChunk(d inference.Delta) chatChunk {
	text := d.Text
	ch := chunkChoice{Delta: chunkDelta{Content: &text, ReasoningContent: d.Reasoning}}
	if len(d.ToolCalls) > 0 {
		ch.Delta.ToolCalls = toolCallDeltas(d.ToolCalls)
	}
	if text == "" && (len(d.ToolCalls) > 0 || d.Reasoning != "") {
		ch.Delta.Content = nil
	}
	if a.wire.ReturnTokenIDs {
		ch.TokenIDs = d.TokenIDs
	}
	if a.wire.Logprobs && len(d.TokenIDs) > 0 {
		ch.Logprobs = a.logprobs(d.TokenIDs, d.Logprobs, nil)
	}
	return a.chunk(ch)
}

// toolCallDeltas are tool-call increments as a stream chunk carries them:
// the first of a call with its id, type and name, later ones more
// arguments.
func toolCallDeltas(in []inference.ToolCallDelta) []openai.ToolCall {
	out := make([]openai.ToolCall, len(in))
	for i, d := range in {
		idx := d.Index
		out[i].Index, out[i].ID = &idx, d.ID
		if d.ID != "" {
			out[i].Type = "function"
		}
		out[i].Function.Name, out[i].Function.Arguments = d.Name, d.Arguments
	}
	return out
}

// eventWriter writes server-sent events. After a failed write it writes
// nothing more and keeps answering that failure, which aborts generation.
type eventWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	err     error
}

func (e *eventWriter) send(v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	return e.write(append(append([]byte("data: "), body...), "\n\n"...))
}

func (e *eventWriter) done() error { return e.write([]byte("data: [DONE]\n\n")) }

func (e *eventWriter) write(b []byte) error {
	if e.err != nil {
		return e.err
	}
	if _, err := e.w.Write(b); err != nil {
		e.err = fmt.Errorf("write stream: %w", err)
		return e.err
	}
	if e.flusher != nil {
		e.flusher.Flush()
	}
	return nil
}
