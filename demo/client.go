package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
)

// The demo's HTTP plumbing beside the OpenAI client: the fleet's JSON
// calls to Flywheel's own endpoints (sessions, rewards, feedback, backlog,
// consent), the wait on a rate limit, and reading which version answered.

// HeaderModelVersion is the response header a gateway may use for the
// serving version. The Flywheel gateway reports it in system_fingerprint;
// the header wins when both are present.
const HeaderModelVersion = "X-Flywheel-Model-Version"

// maxErrorBody bounds how much of an error response is kept, and
// maxAnswerBody how much of a 2xx answer is read.
const (
	maxErrorBody  = 4 << 10
	maxAnswerBody = 1 << 20
)

func (f *Fleet) post(ctx context.Context, path string, body any) error {
	return f.postInto(ctx, path, body, nil)
}

// postInto posts body as JSON with the fleet's key and decodes a 2xx
// answer into out (when not nil).
func (f *Fleet) postInto(ctx context.Context, path string, body any, out any) error {
	return f.send(ctx, http.MethodPost, path, body, out)
}

// send makes one JSON request with the fleet's key.
func (f *Fleet) send(ctx context.Context, method, path string, body any, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.RequestTimeout)
	defer cancel()
	resp, err := doRetrying(ctx, f.cfg.HTTPClient, func() (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, method, f.root+path, bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+f.cfg.APIKey)
		req.Header.Set("Content-Type", "application/json")
		return req, nil
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		return fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	if out != nil {
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBody)).Decode(out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

// doRetrying sends the request newReq builds and answers its response. A
// 429 is the key's rate limit, not a verdict: it waits as told and sends
// again, up to maxSendAttempts, so a reward or a status reading is not
// lost to the fleet's own burst (the OpenAI client does the same for
// model calls). The last 429 is answered as it is.
func doRetrying(ctx context.Context, client *http.Client, newReq func() (*http.Request, error)) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		req, err := newReq()
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusTooManyRequests || attempt >= maxSendAttempts {
			return resp, nil
		}
		wait := retryAfter(resp.Header.Get("Retry-After"))
		resp.Body.Close()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("rate limited: %w", ctx.Err())
		case <-time.After(wait):
		}
	}
}

// maxSendAttempts bounds the retries of a rate-limited request.
const maxSendAttempts = 5

// retryAfter reads a Retry-After in seconds (default and cap: 1s and 5s).
func retryAfter(h string) time.Duration {
	secs, err := strconv.Atoi(strings.TrimSpace(h))
	if err != nil || secs <= 0 {
		return time.Second
	}
	return min(time.Duration(secs)*time.Second, 5*time.Second)
}

// servedVersion is the version that answered: the header, else the
// system fingerprint, else the model name.
func servedVersion(resp *openai.ChatCompletion, httpResp *http.Response) string {
	if httpResp != nil && httpResp.Header.Get(HeaderModelVersion) != "" {
		return httpResp.Header.Get(HeaderModelVersion)
	}
	if resp.SystemFingerprint != "" {
		return resp.SystemFingerprint
	}
	return resp.Model
}
