package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/flywheel-ai/flywheel/inference"
)

// post sends one attempt; a non-2xx status becomes an *inference.Error.
func (b *Backend) post(ctx context.Context, body []byte) (*http.Response, error) {
	return b.postTo(ctx, b.cfg.BaseURL+"/chat/completions", body)
}

func (b *Backend) postTo(ctx context.Context, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("upstream: build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	// The caller's trace goes on to the engine (vLLM and SGLang read it).
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	if b.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.cfg.APIKey)
	}
	return send(b.cfg.Client, req, func(status int, msg []byte, h http.Header) error {
		e := &inference.Error{Status: status, Message: upstreamMessage(msg, status), Err: statusError(status)}
		if s := h.Get("Retry-After"); s != "" {
			if secs, err := strconv.Atoi(s); err == nil {
				e.RetryAfter = time.Duration(secs) * time.Second
			}
		}
		switch {
		case status == http.StatusTooManyRequests:
		case status >= 500:
			e.Status = http.StatusBadGateway
			if status == http.StatusServiceUnavailable {
				e.Status = http.StatusServiceUnavailable
			}
		case status == http.StatusBadRequest || status == http.StatusUnprocessableEntity:
			e.Status = http.StatusBadRequest
		default:
			e.Status = http.StatusBadGateway
		}
		return e
	})
}

// send does req: a 2xx answer is returned for the caller to read; a
// connection that failed is a 502; any other answer's first 4 KiB go to
// failed, which maps them to the error the dialect's clients expect.
func send(c *http.Client, req *http.Request, failed func(status int, body []byte, h http.Header) error) (*http.Response, error) {
	resp, err := c.Do(req)
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream unreachable", Err: err}
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return nil, failed(resp.StatusCode, raw, resp.Header)
}

// statusError is the status the upstream answered, kept under the one
// the gateway answers.
type statusError int

func (s statusError) Error() string { return fmt.Sprintf("upstream answered %d", int(s)) }

func upstreamMessage(body []byte, status int) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		if e.Error.Message != "" {
			return "upstream: " + e.Error.Message
		}
		if e.Message != "" {
			return "upstream: " + e.Message
		}
	}
	return fmt.Sprintf("upstream answered %d", status)
}

// Retryable reports whether err is worth another attempt (or a fallback).
func Retryable(err error) bool {
	var ie *inference.Error
	if errors.As(err, &ie) {
		return ie.Status == http.StatusTooManyRequests || ie.Status >= 500
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// retry runs attempt, each time bounded by the timeout, as retryLoop does.
func (b *Backend) retry(ctx context.Context, attempt func(ctx context.Context) error) error {
	return retryLoop(ctx, b.cfg, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		defer cancel()
		return attempt(actx)
	})
}

// retryLoop runs attempt until it succeeds, fails in a way another try
// would not mend, or cfg.Retries are spent, waiting a jittered exponential
// backoff (or the Retry-After the server asked for) in between.
func retryLoop(ctx context.Context, cfg Config, attempt func(ctx context.Context) error) error {
	var err error
	for i := 0; ; i++ {
		err = attempt(ctx)
		if err == nil || errors.Is(err, errNoRetry) {
			return err
		}
		var nr noRetry
		if errors.As(err, &nr) || ctx.Err() != nil || !Retryable(err) || i >= cfg.Retries {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return &inference.Error{Status: http.StatusBadGateway, Message: "upstream timed out", Err: err}
			}
			return err
		}
		wait := cfg.Backoff << i
		wait = wait/2 + time.Duration(rand.Int64N(int64(wait/2)+1))
		var ie *inference.Error
		if errors.As(err, &ie) && ie.RetryAfter > wait {
			wait = ie.RetryAfter
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// errNoRetry and noRetry end retry at once: a stream that emitted cannot
// be tried again (streamFrom).
var errNoRetry = errors.New("upstream: stream already started")

type noRetry struct{ err error }

func (n noRetry) Error() string { return n.err.Error() }
func (n noRetry) Unwrap() error { return n.err }
