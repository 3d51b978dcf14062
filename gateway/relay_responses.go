package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/responses"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/upstream"
)

// responsesRelay is a backend whose server speaks OpenAI's Responses API
// itself (an openai-dialect deployment with responses: true): a Responses
// client's body is relayed to it, not converted to Chat Completions, and
// the responses it answered live there, under its ids.
type responsesRelay interface {
	Create(ctx context.Context, body []byte, stream bool, emit func(upstream.SSEEvent) error) (*upstream.Relayed, error)
	Get(ctx context.Context, id string) ([]byte, error)
	Delete(ctx context.Context, id string) ([]byte, error)
}

// responsesRelayOf is the target's Responses relay, if its backend is one.
func responsesRelayOf(t *target) (responsesRelay, bool) {
	r, ok := t.backend.(responsesRelay)
	return r, ok
}

// relaysResponses reports whether model's deployment relays the
// Responses API.
func (s *Server) relaysResponses(c *gin.Context, model string) bool {
	t, err := s.router.resolve(c.Request.Context(), model, principalOf(c).TenantID, "")
	if err != nil {
		return false
	}
	_, ok := responsesRelayOf(t)
	return ok
}

// decodeResponses decodes a Responses body: strictly for a deployment the
// gateway serves itself, as relayed (the server judges) for one that
// relays the API. relay reports which.
func (s *Server) decodeResponses(c *gin.Context, body []byte) (wire *responses.Request, relay bool, err error) {
	wire, err = responses.Decode(body)
	if err == nil {
		return wire, s.relaysResponses(c, wire.Model), nil
	}
	relayed, rerr := responses.DecodeRelayed(body)
	if rerr != nil || !s.relaysResponses(c, relayed.Model) {
		return nil, false, err
	}
	return relayed, true, nil
}

// relayResponse serves POST /v1/responses on a relaying deployment. The
// server gets the client's body with the model renamed and the serving
// artefacts applied (the harness and playbook in front of the
// instructions, the tool schema's descriptions), every other byte as
// sent; the client gets the server's answer as it came, its id included:
// the server holds the response, so that id is the one the client
// continues, reads and deletes it by, and the one feedback names. Capture
// records the call as it records any other.
func (s *Server) relayResponse(c *gin.Context, wire *responses.Request, body []byte) {
	var chained string
	if wire.PreviousResponseID != "" {
		var err error
		if chained, err = s.relayedChain(c, wire.PreviousResponseID); err != nil {
			abort(c, err)
			return
		}
	}
	// The conversation before this turn lives at the server; the step
	// records this turn's input, its session the turns before.
	cl, err := s.prepare(c, protoResponses, wire.Neutral(nil), wire.Stream, wire.EndUser(), chained)
	if err != nil {
		abort(c, err)
		return
	}
	relay, ok := responsesRelayOf(cl.target)
	if !ok { // the deployment changed since decodeResponses looked
		abort(c, errf(http.StatusServiceUnavailable, "model %q is being reconfigured; retry", wire.Model))
		return
	}
	body, err = responses.InjectInstructions(body, cl.target.system)
	if err == nil {
		body, err = responses.OverrideTools(body, cl.req.Tools, changedTools(cl))
	}
	if err != nil {
		abort(c, errf(http.StatusBadRequest, "%v", err))
		return
	}
	if wire.Stream {
		s.relayResponseStream(c, cl, relay, body)
		return
	}
	out, err := relay.Create(c.Request.Context(), body, false, nil)
	var resp *inference.Response
	if err == nil {
		resp = out.Response
		err = adoptResponseID(cl, out.ID)
	}
	if _, err = s.captureWhole(c, cl, resp, err); err != nil {
		abort(c, err)
		return
	}
	c.Data(http.StatusOK, "application/json", out.Body)
}

// relayResponseStream passes the server's events to the client as they
// arrive, in order. The last one (response.completed, or .incomplete)
// waits for the capture: the stream ends complete only once the call is
// committed, and with an error event instead if it is not, or if the
// server's stream failed or broke off. A response.failed is the server's
// own account of its failure and goes on as it came.
func (s *Server) relayResponseStream(c *gin.Context, cl *call, relay responsesRelay, body []byte) {
	w := &sseWriter{c: c}
	clientGone := false
	var last *upstream.SSEEvent
	sent := 0
	emit := func(ev upstream.SSEEvent) error {
		if responses.Terminal(ev.Name) {
			last = &ev
			return nil
		}
		if err := writeEvent(w, ev.Name, ev.Data); err != nil {
			clientGone = true
			return err
		}
		sent++
		return nil
	}
	out, genErr := relay.Create(c.Request.Context(), body, true, emit)
	var resp *inference.Response
	if out != nil {
		resp = out.Response
		if err := adoptResponseID(cl, out.ID); err != nil && genErr == nil {
			genErr = err
		}
	}
	_, genErr = s.captureStreamed(c, cl, resp, genErr, clientGone, func() []string { return nil })
	switch {
	case last != nil && (genErr == nil || last.Name == responses.EventFailed):
		_ = writeEvent(w, last.Name, last.Data)
	case !w.started:
		abort(c, genErr)
	default:
		e := asAPIError(genErr)
		_ = w.event(responses.EventError, gin.H{"type": responses.EventError, "code": openAIErrorType(e.Status),
			"message": e.Message, "param": nil, "sequence_number": sent})
	}
}

// adoptResponseID makes the server's id for the response the call's
// completion id: the id the client saw and will name. A stream that broke
// before the server named it keeps the gateway's.
func adoptResponseID(cl *call, id string) error {
	if id == "" {
		return nil
	}
	if len(id) > responses.MaxResponseID || !utf8.ValidString(id) || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' }) {
		return errf(http.StatusBadGateway, "upstream sent a response id the gateway cannot keep")
	}
	cl.completionID = id
	if cl.span != nil {
		cl.span.SetAttributes(attribute.String(attrResponseID, id))
	}
	return nil
}

// relayedChain is the session of a relayed response the tenant's call
// produced, which a request continues (previous_response_id): the server
// holds the conversation, the gateway only which tenant and session it is.
// An id the tenant's calls did not produce is not found, whatever the
// server holds.
func (s *Server) relayedChain(c *gin.Context, id string) (string, error) {
	it, err := s.relayedInteraction(c, id)
	if err != nil {
		return "", err
	}
	if _, _, err := store.ResponseBody(c.Request.Context(), s.deps.DB, principalOf(c).TenantID, id); err == nil {
		return "", errf(http.StatusBadRequest, "previous_response_id: response %q was answered by the gateway, not by this model's server; continue it on model %q", id, it.Deployment)
	}
	return it.SessionID, nil
}

// relayedInteraction is the captured call that answered response id,
// when the caller may reach it: its tenant's, for a per-session key its
// own session's, and answered.
func (s *Server) relayedInteraction(c *gin.Context, id string) (*store.Interaction, error) {
	p := principalOf(c)
	it, err := store.InteractionByCompletion(c.Request.Context(), s.deps.DB, p.TenantID, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (it.Protocol != protoResponses || it.Status != statusOK ||
		(p.SessionID != "" && it.SessionID != p.SessionID))) {
		return nil, noStoredResponse(id)
	}
	if err != nil {
		return nil, &apiError{Status: http.StatusServiceUnavailable, Message: "stored responses cannot be read; retry", RetryAfter: time.Second}
	}
	return it, nil
}

// atServer relays GET or DELETE /v1/responses/{id} (op) to the server that
// holds the response, when the gateway relayed it.
func (s *Server) atServer(c *gin.Context, id string, op func(responsesRelay, context.Context, string) ([]byte, error)) ([]byte, error) {
	it, err := s.relayedInteraction(c, id)
	if err != nil {
		return nil, err
	}
	p := principalOf(c)
	if err := p.mayUse(it.Deployment); err != nil {
		return nil, err
	}
	t, err := s.router.resolve(c.Request.Context(), it.Deployment, p.TenantID, "")
	if err != nil {
		return nil, err
	}
	relay, ok := responsesRelayOf(t)
	if !ok {
		return nil, noStoredResponse(id)
	}
	return op(relay, c.Request.Context(), id)
}

// notFound reports whether err is a 404 for the client.
func notFound(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}
