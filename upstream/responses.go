package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/responses"
)

// ResponsesRelay is the client of an OpenAI server that speaks the
// Responses API too (api.openai.com; a deployment of the openai dialect
// with responses: true). A Responses client's body is relayed to
// {base_url}/responses as it was sent, but for the model name, so
// previous_response_id, store, hosted tools, reasoning and include reach
// the server, which holds the conversation; the answer is read only to
// tell capture what was said. Every other client is served by the Chat
// Completions backend it wraps. The server returns no token ids, so its
// samples never train (trajectory's rule for a step without ids).
type ResponsesRelay struct {
	inference.Backend
	cfg Config
	// models are the server's names to try, in order: the deployment's
	// model, then its fallbacks.
	models []string
}

// NewResponsesRelay checks cfg (BaseURL ends in /v1, as for chat) and
// returns the relay; chat serves the other protocols.
func NewResponsesRelay(chat inference.Backend, cfg Config, fallbacks []string) (*ResponsesRelay, error) {
	b, err := New(cfg) // the same defaults
	if err != nil {
		return nil, err
	}
	return &ResponsesRelay{Backend: chat, cfg: b.cfg, models: append([]string{cfg.Model}, fallbacks...)}, nil
}

// CountTokens implements inference.Counter where the chat backend does.
func (r *ResponsesRelay) CountTokens(ctx context.Context, req *inference.Request) (int, error) {
	if c, ok := r.Backend.(inference.Counter); ok {
		return c.CountTokens(ctx, req)
	}
	return 0, &inference.Error{Status: http.StatusNotImplemented, Message: "this model's backend cannot count tokens"}
}

// Create relays POST /responses: a whole answer is returned with the
// server's id; a stream's events go to emit as they arrive, in order,
// the last one (response.completed, response.incomplete or
// response.failed) included, but for an error event, which is returned as
// the error. A response.failed is returned with the answer and an error.
// Retries and fallbacks happen only before the first event was emitted.
func (r *ResponsesRelay) Create(ctx context.Context, body []byte, stream bool, emit func(SSEEvent) error) (*Relayed, error) {
	return relayModels(ctx, r.cfg, r.models, body, stream, emit,
		func(ctx context.Context, body []byte, model string, emit func(SSEEvent) error) (*Relayed, error) {
			if !stream {
				return r.complete(ctx, body)
			}
			return relayStream(ctx, r.cfg.Timeout, func(ctx context.Context) (*http.Response, error) {
				return r.do(ctx, http.MethodPost, "/responses", body)
			}, func(body io.Reader, tick func()) (*Relayed, error) {
				return readResponsesSSE(body, tick, emit)
			})
		})
}

// Get relays GET /responses/{id} and returns the server's response
// object.
func (r *ResponsesRelay) Get(ctx context.Context, id string) ([]byte, error) {
	return r.read(ctx, http.MethodGet, id)
}

// Delete relays DELETE /responses/{id} and returns the server's answer.
func (r *ResponsesRelay) Delete(ctx context.Context, id string) ([]byte, error) {
	return r.read(ctx, http.MethodDelete, id)
}

func (r *ResponsesRelay) read(ctx context.Context, method, id string) ([]byte, error) {
	var out []byte
	err := retryLoop(ctx, r.cfg, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		defer cancel()
		resp, err := r.do(actx, method, "/responses/"+url.PathEscape(id), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		out, err = readJSON(resp.Body)
		return err
	})
	return out, err
}

// readJSON reads a whole JSON answer.
func readJSON(r io.Reader) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(r, maxResponseBytes))
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream answer was cut", Err: err}
	}
	if !json.Valid(raw) {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable answer"}
	}
	return raw, nil
}

func (r *ResponsesRelay) complete(ctx context.Context, body []byte) (*Relayed, error) {
	resp, err := r.do(ctx, http.MethodPost, "/responses", body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := readJSON(resp.Body)
	if err != nil {
		return nil, err
	}
	a, err := responses.ReadAnswer(raw)
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable response", Err: err}
	}
	return &Relayed{Body: raw, Response: a.Response, ID: a.ID}, nil
}

// readResponsesSSE reads a Responses stream: each event goes to emit, in
// order, up to the terminal one (an error event is returned as the error
// instead). The answer is what arrived, however the stream ended.
func readResponsesSSE(body io.Reader, tick func(), emit func(SSEEvent) error) (*Relayed, error) {
	var sr responses.StreamReader
	err := scanSSE(body, tick, func(ev SSEEvent) (bool, error) {
		done, err := sr.Event(ev.Name, ev.Data)
		var se *responses.StreamError
		switch {
		case errors.As(err, &se):
			return true, streamFailure(se.Code, se.Message)
		case err != nil:
			return true, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable event", Err: err}
		}
		ev.Name = sr.Last
		return done, emit(ev)
	})
	if errors.Is(err, errStreamEnded) {
		err = &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream ended before response.completed"}
	}
	out := &Relayed{Response: sr.Response(), ID: sr.ID}
	if err == nil && sr.Last == responses.EventFailed {
		code, msg := "", "the response failed"
		if e := sr.Answer.Error; e != nil {
			code, msg = e.Code, e.Message
		}
		err = streamFailure(code, msg)
	}
	return out, err
}

// streamFailure is a failure the server reported in a stream (an error
// event, or response.failed), with the status OpenAI gives its code.
func streamFailure(code, message string) error {
	status := http.StatusInternalServerError
	switch code {
	case "rate_limit_exceeded":
		status = http.StatusTooManyRequests
	case "server_error":
		status = http.StatusBadGateway
	case "invalid_prompt", "invalid_request_error", "context_length_exceeded":
		status = http.StatusBadRequest
	}
	if code == "" {
		code = "error"
	}
	return &inference.Error{Status: status, Message: "upstream: " + message, Err: fmt.Errorf("upstream stream: %s", code)}
}

// do sends one request with the deployment's key; a non-2xx answer
// becomes an *inference.Error in the status OpenAI's clients act on.
func (r *ResponsesRelay) do(ctx context.Context, method, path string, body []byte) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.cfg.BaseURL+path, rd)
	if err != nil {
		return nil, fmt.Errorf("upstream: build request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	if r.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.APIKey)
	}
	return send(r.cfg.Client, req, func(status int, raw []byte, h http.Header) error {
		return openAIError(status, raw, h)
	})
}

// openAIError is an OpenAI server's error as the gateway answers it: its
// own status (400, 404, 409, 413, 422; 429 with its Retry-After; 5xx), but
// for a refused key or account (401, 402, 403), which is the deployment's
// fault, not the client's key's: 502, lest the client's SDK ask its user
// for a new key.
func openAIError(status int, body []byte, h http.Header) *inference.Error {
	e := &inference.Error{Status: status, Message: upstreamMessage(body, status), Err: statusError(status)}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusPaymentRequired || status == http.StatusForbidden:
		e.Status, e.Message = http.StatusBadGateway, fmt.Sprintf("upstream refused the deployment's credentials (%d): %s", status, e.Message)
	case status < 400 || status > 599:
		e.Status = http.StatusBadGateway
	}
	if ms, err := strconv.Atoi(h.Get("Retry-After-Ms")); err == nil && ms > 0 {
		e.RetryAfter = time.Duration(ms) * time.Millisecond
	} else if secs, err := strconv.Atoi(h.Get("Retry-After")); err == nil && secs > 0 {
		e.RetryAfter = time.Duration(secs) * time.Second
	}
	return e
}
