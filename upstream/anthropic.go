package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/anthropic"
)

// Anthropic is the client of a server of Anthropic's Messages dialect
// (api.anthropic.com, or any server that speaks it). It relays a Messages
// body as the client sent it, but for the model name, and reads the answer
// only to tell capture what was said: tools, thinking, images and
// cache_control reach the server because nothing is rebuilt. A client of
// another protocol has its request converted (Complete, Stream). The key
// goes as x-api-key. Such a server returns no token ids, so its samples
// never train (trajectory's rule for a step without ids).
type Anthropic struct {
	cfg Config
	// models are the server's names to try, in order: the deployment's
	// model, then its fallbacks.
	models []string
}

// anthropicVersion is sent where the client named none (count_tokens
// from a client that omits it is refused by the gateway before this).
const anthropicVersion = "2023-06-01"

// NewAnthropic checks cfg (its BaseURL is the API's root, such as
// https://api.anthropic.com; a trailing /v1 is dropped) and returns the
// client; fallbacks are other models on the same server, tried when the
// model fails with 429, 5xx or a timeout before anything was relayed.
func NewAnthropic(cfg Config, fallbacks []string) (*Anthropic, error) {
	if cfg.BaseURL == "" || cfg.Model == "" {
		return nil, errors.New("upstream: base URL and model are required")
	}
	cfg.BaseURL = strings.TrimSuffix(strings.TrimRight(cfg.BaseURL, "/"), "/v1")
	b, err := New(cfg) // the same defaults
	if err != nil {
		return nil, err
	}
	return &Anthropic{cfg: b.cfg, models: append([]string{cfg.Model}, fallbacks...)}, nil
}

// MessagesCall is one Messages call to relay.
type MessagesCall struct {
	// Body is the request as the client sent it; only its model changes.
	Body []byte
	// Header holds the client's anthropic-* headers (anthropic-version,
	// anthropic-beta), sent on as they are.
	Header http.Header
	// Stream is the body's stream flag.
	Stream bool
}

// Complete implements inference.Backend for the OpenAI protocols: the
// neutral request converted to a Messages body (anthropic.FromNeutral says
// what that loses), the answer read as capture reads a relayed one.
func (a *Anthropic) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	body, err := neutralBody(req, false)
	if err != nil {
		return nil, err
	}
	out, err := a.Messages(ctx, MessagesCall{Body: body}, nil)
	if err != nil {
		return nil, err
	}
	return out.Response, nil
}

// Stream implements inference.Backend as Complete does, the stream's text,
// thinking and tool-call increments emitted as they arrive.
func (a *Anthropic) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	body, err := neutralBody(req, true)
	if err != nil {
		return nil, err
	}
	out, err := a.Messages(ctx, MessagesCall{Body: body, Stream: true}, func(ev SSEEvent) error {
		if ev.delta == nil {
			return nil
		}
		return emit(*ev.delta)
	})
	if out == nil {
		return nil, err
	}
	return out.Response, err
}

func neutralBody(req *inference.Request, stream bool) ([]byte, error) {
	wire, err := anthropic.FromNeutral(req)
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadRequest, Message: err.Error()}
	}
	wire.Stream = stream
	body, err := json.Marshal(wire)
	if err != nil {
		return nil, fmt.Errorf("upstream: encode request: %w", err)
	}
	return body, nil
}

// Messages relays one Messages call: a whole answer is returned, a
// stream's events go to emit as they arrive, in order, but for an error
// event, which is returned as the error. Retries and fallbacks happen only
// before the first event was emitted.
func (a *Anthropic) Messages(ctx context.Context, call MessagesCall, emit func(SSEEvent) error) (*Relayed, error) {
	return relayModels(ctx, a.cfg, a.models, call.Body, call.Stream, emit,
		func(ctx context.Context, body []byte, model string, emit func(SSEEvent) error) (*Relayed, error) {
			if !call.Stream {
				return a.complete(ctx, body, call.Header, model)
			}
			return relayStream(ctx, a.cfg.Timeout, func(ctx context.Context) (*http.Response, error) {
				return a.post(ctx, "/v1/messages", body, call.Header)
			}, func(r io.Reader, tick func()) (*Relayed, error) {
				return readSSE(r, model, tick, emit)
			})
		})
}

// CountTokens relays POST /v1/messages/count_tokens and returns the
// server's answer ({"input_tokens": N}).
func (a *Anthropic) CountTokens(ctx context.Context, call MessagesCall) ([]byte, error) {
	body, err := withModel(call.Body, a.models[0])
	if err != nil {
		return nil, err
	}
	var out []byte
	err = retryLoop(ctx, a.cfg, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
		defer cancel()
		resp, err := a.post(actx, "/v1/messages/count_tokens", body, call.Header)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		out, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
		if err != nil || !json.Valid(out) {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable token count", Err: err}
		}
		return nil
	})
	return out, err
}

func (a *Anthropic) complete(ctx context.Context, body []byte, h http.Header, model string) (*Relayed, error) {
	resp, err := a.post(ctx, "/v1/messages", body, h)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream answer was cut", Err: err}
	}
	var m anthropicMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable message", Err: err}
	}
	var mb messageBuilder
	mb.start(&m)
	return &Relayed{Body: raw, Response: mb.response(model)}, nil
}

// readSSE reads a Messages stream: each event goes to emit, in order (but
// an error event, which is returned as the error), until message_stop;
// tick is called on every line. The answer is what arrived, however the
// stream ended.
func readSSE(r io.Reader, model string, tick func(), emit func(SSEEvent) error) (*Relayed, error) {
	var mb messageBuilder
	err := scanSSE(r, tick, func(ev SSEEvent) (bool, error) {
		done, err := mb.event(&ev)
		ev.delta = mb.delta
		if err == nil && ev.Name != "error" {
			err = emit(ev)
		}
		return done, err
	})
	if errors.Is(err, errStreamEnded) {
		err = &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream ended before message_stop"}
	}
	return &Relayed{Response: mb.response(model)}, err
}

// post sends one request; a non-2xx answer becomes an *inference.Error in
// the status Anthropic's clients expect.
func (a *Anthropic) post(ctx context.Context, path string, body []byte, h http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.cfg.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("upstream: build request: %w", err)
	}
	for k, vs := range h {
		if strings.HasPrefix(strings.ToLower(k), "anthropic-") {
			req.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), vs...)
		}
	}
	if req.Header.Get("anthropic-version") == "" {
		req.Header.Set("anthropic-version", anthropicVersion)
	}
	req.Header.Set("Content-Type", "application/json")
	if a.cfg.APIKey != "" {
		req.Header.Set("x-api-key", a.cfg.APIKey)
	}
	return send(a.cfg.Client, req, func(status int, raw []byte, h http.Header) error {
		var e anthropicErrorBody
		_ = json.Unmarshal(raw, &e)
		ie := anthropicError(status, e.Error.Type, e.Error.Message)
		if secs, err := strconv.Atoi(h.Get("Retry-After")); err == nil && secs > 0 {
			ie.RetryAfter = time.Duration(secs) * time.Second
		}
		return ie
	})
}

// anthropicErrorBody is Anthropic's error JSON (a response body, or an
// error event's data).
type anthropicErrorBody struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// anthropicError is the server's error as the gateway answers it: its own
// status (429 with its Retry-After, 529 overloaded, 5xx), but for a
// refused key or account (401, 402, 403), which is the deployment's
// fault, not the client's key's: 502, lest the client's SDK ask its user
// for a new key.
func anthropicError(status int, kind, message string) *inference.Error {
	if kind == "" {
		kind = "error"
	}
	detail := fmt.Sprintf("%d %s", status, kind)
	if message != "" {
		detail += ": " + message
	}
	e := &inference.Error{Status: status, Message: "upstream: " + message, Err: statusError(status)}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusPaymentRequired || status == http.StatusForbidden:
		e.Status, e.Message = http.StatusBadGateway, "upstream refused the deployment's credentials ("+detail+")"
	case status < 400 || status > 599:
		e.Status, e.Message = http.StatusBadGateway, "upstream answered "+detail
	case message == "":
		e.Message = "upstream answered " + detail
	}
	return e
}

// errorEventStatus is the HTTP status Anthropic gives an error type, for
// an error that arrives as a stream event.
func errorEventStatus(kind string) int {
	switch kind {
	case "invalid_request_error":
		return http.StatusBadRequest
	case "authentication_error":
		return http.StatusUnauthorized
	case "permission_error":
		return http.StatusForbidden
	case "not_found_error":
		return http.StatusNotFound
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	case "rate_limit_error":
		return http.StatusTooManyRequests
	case "timeout_error":
		return http.StatusGatewayTimeout
	case "overloaded_error":
		return 529
	}
	return http.StatusInternalServerError
}
