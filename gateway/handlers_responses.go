package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
	"github.com/flywheel-ai/flywheel/protocol/responses"
	"github.com/flywheel-ai/flywheel/store"
)

// createResponse is POST /v1/responses (OpenAI's Responses API). A call
// is captured and trains like a chat call; a response that continues
// another (previous_response_id) continues its conversation and its
// session. The response is stored for GET and chaining unless the client
// sent store: false; a 2xx means both the interaction and the stored
// response are committed. A deployment whose server speaks the API itself
// has the body relayed (relay_responses.go).
func (s *Server) createResponse(c *gin.Context) {
	body, err := readBody(c)
	if err != nil {
		abort(c, err)
		return
	}
	wire, relay, err := s.decodeResponses(c, body)
	if err != nil {
		abort(c, errf(http.StatusBadRequest, "%v", err))
		return
	}
	if relay {
		s.relayResponse(c, wire, body)
		return
	}
	var history []inference.Message
	var chained string
	if wire.PreviousResponseID != "" {
		p := principalOf(c)
		chained, history, err = s.responseHistory(c.Request.Context(), p.TenantID, wire.PreviousResponseID)
		if err == nil && p.SessionID != "" && chained != p.SessionID {
			// A per-session key reaches its own session's responses only.
			err = noStoredResponse(wire.PreviousResponseID)
		}
		if err != nil {
			abort(c, err)
			return
		}
	}
	cl, err := s.prepare(c, protoResponses, wire.Neutral(history), wire.Stream, wire.EndUser(), chained)
	if err != nil {
		abort(c, err)
		return
	}
	out := wire.Envelope(cl.completionID, cl.started.Unix())
	if wire.Stream {
		s.streamResponse(c, cl, wire, out)
		return
	}
	resp, err := s.generate(c, cl)
	if err != nil {
		abort(c, err)
		return
	}
	out.Finish(resp, responseLogprobs(wire, resp), &responses.IDs{New: newID}, time.Now().Unix())
	if err := s.keepResponse(c, cl, wire, &out); err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, out)
}

// streamResponse serves a Responses stream: response.created, each output
// item as it is generated, then response.completed once the call and the
// response are committed; after the first event, a failure is an error
// event and response.failed.
func (s *Server) streamResponse(c *gin.Context, cl *call, wire *responses.Request, out responses.Response) {
	s.checkReuse(cl)
	w := &sseWriter{c: c}
	st := &responses.Streamer{IDs: responses.IDs{New: newID}, Emit: func(name string, ev map[string]any) error {
		return w.event(name, ev)
	}}
	begin := func() error {
		if w.started {
			return nil
		}
		return st.Start(out)
	}
	clientGone := false
	var textCarry, reasonCarry utf8Carry
	emit := func(d inference.Delta) error {
		d.Text, d.Reasoning = textCarry.next(d.Text), reasonCarry.next(d.Reasoning)
		var lp []responses.Logprob
		if wire.WantLogprobs() && d.Text != "" {
			lp = openai.DeltaLogprobs(d)
		}
		err := begin()
		if err == nil {
			err = st.Delta(d, lp)
		}
		if err != nil {
			clientGone = true
		}
		return err
	}
	resp, genErr := s.runStream(c, cl, emit, &clientGone, st.CallIDs)
	if genErr == nil {
		if err := emit(inference.Delta{Text: textCarry.flush(), Reasoning: reasonCarry.flush()}); err != nil {
			return
		}
		if err := begin(); err != nil {
			return
		}
		out.Finish(resp, responseLogprobs(wire, resp), &st.IDs, time.Now().Unix())
		genErr = s.keepResponse(c, cl, wire, &out)
	}
	if genErr != nil {
		if !w.started {
			abort(c, genErr)
			return
		}
		e := asAPIError(genErr)
		_ = st.Fail(out, openAIErrorType(e.Status), e.Message)
		return
	}
	_ = st.Finish(&out)
}

// responseLogprobs are the output text's logprobs, when the request asked
// for them.
func responseLogprobs(wire *responses.Request, resp *inference.Response) []responses.Logprob {
	if !wire.WantLogprobs() {
		return nil
	}
	return openai.LogprobsFor(resp, 0, len(resp.Logprobs)).Content
}

// keepResponse stores a finished response for GET and chaining, unless
// the client asked not to.
func (s *Server) keepResponse(c *gin.Context, cl *call, wire *responses.Request, out *responses.Response) error {
	if !wire.Stored() {
		return nil
	}
	input, err := json.Marshal(wire.Items())
	if err != nil {
		return err
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	// Like the capture, the write must not depend on the client staying.
	err = store.InsertResponse(context.WithoutCancel(c.Request.Context()), s.deps.DB, store.StoredResponse{
		TenantID: cl.p.TenantID, ID: out.ID, SessionID: cl.sessionID, PreviousID: wire.PreviousResponseID,
		Input: pgJSON(input), Body: pgJSON(body)})
	if err != nil {
		s.deps.Logger.Error(msgResponseStoreFailed, append(logAttrs(c), "response", out.ID, "err", err)...)
		return &apiError{Status: http.StatusServiceUnavailable, Message: "the response could not be stored; retry", RetryAfter: time.Second}
	}
	return nil
}

const msgResponseStoreFailed = "storing a response failed"

// responseHistory is the conversation a stored response ends (its
// chain's inputs and outputs, without their instructions, which OpenAI
// does not carry over) and its session.
func (s *Server) responseHistory(ctx context.Context, tenantID, id string) (string, []inference.Message, error) {
	session, links, err := store.ResponseChain(ctx, s.deps.DB, tenantID, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil, noStoredResponse(id)
	}
	if err != nil {
		return "", nil, &apiError{Status: http.StatusServiceUnavailable, Message: "stored responses cannot be read; retry", RetryAfter: time.Second}
	}
	var items []responses.InputItem
	for _, l := range links {
		var in, out []responses.InputItem
		if err := json.Unmarshal(l.Input, &in); err != nil {
			return "", nil, err
		}
		if err := json.Unmarshal(l.Output, &out); err != nil {
			return "", nil, err
		}
		items = append(append(items, in...), out...)
	}
	msgs, err := responses.Messages(items)
	if err != nil {
		return "", nil, err
	}
	return session, msgs, nil
}

// noStoredResponse is the 404 for a response the caller cannot reach.
func noStoredResponse(id string) error {
	return errf(http.StatusNotFound, "no stored response %q (a response sent with store: false is not kept)", id)
}

// storedResponse is a stored response the caller may reach: its tenant's,
// and for a per-session key its own session's.
func (s *Server) storedResponse(c *gin.Context, id string) (json.RawMessage, error) {
	p := principalOf(c)
	body, session, err := store.ResponseBody(c.Request.Context(), s.deps.DB, p.TenantID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && p.SessionID != "" && session != p.SessionID) {
		return nil, noStoredResponse(id)
	}
	return body, err
}

// getResponse is GET /v1/responses/{id}: the gateway's stored response,
// or one a relaying deployment's server holds, read there.
func (s *Server) getResponse(c *gin.Context) {
	id := c.Param("id")
	body, err := s.storedResponse(c, id)
	if notFound(err) {
		body, err = s.atServer(c, id, responsesRelay.Get)
	}
	if err != nil {
		abort(c, err)
		return
	}
	c.Data(http.StatusOK, "application/json; charset=utf-8", body)
}

// deleteResponse is DELETE /v1/responses/{id}. The captured interaction
// stays (forget removes it); the response can no longer be read or
// continued. One a relaying deployment's server holds is deleted there.
func (s *Server) deleteResponse(c *gin.Context) {
	id := c.Param("id")
	_, err := s.storedResponse(c, id)
	if notFound(err) {
		var answer []byte
		if answer, err = s.atServer(c, id, responsesRelay.Delete); err == nil {
			c.Data(http.StatusOK, "application/json; charset=utf-8", answer)
			return
		}
	}
	if err != nil {
		abort(c, err)
		return
	}
	err = store.DeleteResponse(c.Request.Context(), s.deps.DB, principalOf(c).TenantID, id)
	if errors.Is(err, store.ErrNotFound) {
		err = noStoredResponse(id)
	}
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"id": id, "object": "response.deleted", "deleted": true})
}
