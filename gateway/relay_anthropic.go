package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol"
	"github.com/flywheel-ai/flywheel/protocol/anthropic"
	"github.com/flywheel-ai/flywheel/upstream"
)

// anthropicRelay is a backend that speaks Anthropic's Messages dialect
// itself (a deployment of dialect "anthropic"): an Anthropic client's body
// is relayed to it, not rebuilt, so nothing the gateway does not read
// (images, cache_control, server tools, betas) is lost on the way.
type anthropicRelay interface {
	Messages(ctx context.Context, call upstream.MessagesCall, emit func(upstream.SSEEvent) error) (*upstream.Relayed, error)
	CountTokens(ctx context.Context, call upstream.MessagesCall) ([]byte, error)
}

// relayOf is the target's relay, if its backend is one.
func relayOf(t *target) (anthropicRelay, bool) {
	r, ok := t.backend.(anthropicRelay)
	return r, ok
}

// decodeRelayed decodes a Messages body that the gateway's own decoding
// refused with strictErr, for a model whose deployment relays it: that
// server judges what it takes, and capture records a block the neutral
// request cannot hold as its placeholder. Any other model gets strictErr.
func (s *Server) decodeRelayed(c *gin.Context, body []byte, generate bool, strictErr error) (*anthropic.Request, *inference.Request, error) {
	wire, req, err := anthropic.DecodeRelayed(body, generate)
	if err != nil {
		return nil, nil, strictErr
	}
	t, err := s.router.resolve(c.Request.Context(), req.Model, principalOf(c).TenantID, "")
	if err != nil {
		return nil, nil, strictErr
	}
	if _, ok := relayOf(t); !ok {
		return nil, nil, strictErr
	}
	return wire, req, nil
}

// relayHeaders are the client's anthropic-* headers (anthropic-version,
// anthropic-beta), which go on to the server as they are.
func relayHeaders(c *gin.Context) http.Header {
	h := http.Header{}
	for k, vs := range c.Request.Header {
		if strings.HasPrefix(strings.ToLower(k), "anthropic-") {
			h[k] = vs
		}
	}
	return h
}

// relayMessages serves POST /v1/messages on a relaying deployment. The
// server gets the client's body with the model renamed and the serving
// artefacts applied (the harness and playbook in front of the system
// prompt, the tool schema's descriptions), every other byte as sent; the
// client gets the server's answer, its id replaced by the completion id
// feedback names. Capture records the call as it records any other, from
// the request as decoded (the artefacts applied the same way) and the
// answer as read.
func (s *Server) relayMessages(c *gin.Context, cl *call, relay anthropicRelay, body []byte, stream bool) {
	body, err := withArtefacts(body, cl.target.system, cl.req.Tools, changedTools(cl))
	if err != nil {
		abort(c, err)
		return
	}
	in := upstream.MessagesCall{Body: body, Header: relayHeaders(c), Stream: stream}
	if stream {
		s.relayStream(c, cl, relay, in)
		return
	}
	out, err := relay.Messages(c.Request.Context(), in, nil)
	var resp *inference.Response
	if err == nil {
		resp = out.Response
	}
	if _, err = s.captureWhole(c, cl, resp, err); err != nil {
		abort(c, err)
		return
	}
	answer, err := protocol.SetField(out.Body, "id", jsonString(cl.completionID))
	if err != nil {
		abort(c, errf(http.StatusBadGateway, "upstream sent an unreadable message: %v", err))
		return
	}
	c.Data(http.StatusOK, "application/json", answer)
}

// changedTools names the tools whose schema the call's tool-schema
// artefact overrides.
func changedTools(cl *call) []string {
	changed := make([]string, 0, len(cl.toolVersions))
	for name := range cl.toolVersions {
		changed = append(changed, name)
	}
	return changed
}

// relayStream passes the server's events to the client as they arrive,
// in order (message_start with the completion id). message_stop waits for
// the capture: the stream ends complete only once the call is committed,
// and with an error event instead if it is not, or if the server's stream
// failed or broke off.
func (s *Server) relayStream(c *gin.Context, cl *call, relay anthropicRelay, in upstream.MessagesCall) {
	w := &sseWriter{c: c}
	clientGone := false
	stop := []byte(`{"type":"message_stop"}`)
	emit := func(ev upstream.SSEEvent) error {
		if ev.Name == "message_stop" {
			stop = ev.Data
			return nil
		}
		if ev.Name == "message_start" {
			ev.Data = withMessageID(ev.Data, cl.completionID)
		}
		if err := writeEvent(w, ev.Name, ev.Data); err != nil {
			clientGone = true
			return err
		}
		return nil
	}
	out, genErr := relay.Messages(c.Request.Context(), in, emit)
	var resp *inference.Response
	if out != nil {
		resp = out.Response
	}
	if _, genErr = s.captureStreamed(c, cl, resp, genErr, clientGone, func() []string { return nil }); genErr != nil {
		if !w.started {
			abort(c, genErr)
			return
		}
		_ = w.event("error", errorBody(protoAnthropic, asAPIError(genErr)))
		return
	}
	_ = writeEvent(w, "message_stop", stop)
}

// withArtefacts is a relayed body with the serving artefacts applied:
// system in front of its system prompt, and the tools named in changed
// described as in tools.
func withArtefacts(body []byte, system string, tools []inference.Tool, changed []string) ([]byte, error) {
	body, err := anthropic.InjectSystem(body, system)
	if err == nil {
		body, err = anthropic.OverrideTools(body, tools, changed)
	}
	if err != nil {
		return nil, errf(http.StatusBadRequest, "%v", err)
	}
	return body, nil
}

// relayCountTokens serves POST /v1/messages/count_tokens on a relaying
// deployment: the server counts the body the call would send, the
// serving artefacts applied.
func relayCountTokens(c *gin.Context, t *target, relay anthropicRelay, body []byte, tools []inference.Tool) {
	tools, changed := t.artefacts.Tools(principalOf(c).TenantID, tools)
	body, err := withArtefacts(body, t.system, tools, changed)
	if err != nil {
		abort(c, err)
		return
	}
	out, err := relay.CountTokens(c.Request.Context(), upstream.MessagesCall{Body: body, Header: relayHeaders(c)})
	if err != nil {
		abort(c, err)
		return
	}
	c.Data(http.StatusOK, "application/json", out)
}

// withMessageID is message_start's data with the message's id replaced;
// data the gateway cannot read goes as it came.
func withMessageID(data []byte, id string) []byte {
	msg, err := protocol.Field(data, "message")
	if err != nil || msg == nil {
		return data
	}
	if msg, err = protocol.SetField(msg, "id", jsonString(id)); err != nil {
		return data
	}
	if out, err := protocol.SetField(data, "message", msg); err == nil {
		return out
	}
	return data
}

// writeEvent writes one server-sent event whose data is JSON.
func writeEvent(w *sseWriter, name string, data []byte) error {
	if bytes.ContainsAny(data, "\r\n") {
		var compact bytes.Buffer
		if err := json.Compact(&compact, data); err == nil {
			data = compact.Bytes()
		} else { // each line its own data field, as SSE joins them
			data = bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r"), nil), []byte("\n"), []byte("\ndata: "))
		}
	}
	var b strings.Builder
	b.Grow(len(name) + len(data) + 16)
	if name != "" {
		b.WriteString("event: ")
		b.WriteString(name)
		b.WriteByte('\n')
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	return w.raw(b.String())
}

func jsonString(s string) json.RawMessage {
	raw, _ := json.Marshal(s)
	return raw
}
