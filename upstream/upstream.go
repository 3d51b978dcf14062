// Package upstream is the inference.Backend for an OpenAI-compatible
// server (vLLM, SGLang, OpenAI). It asks for what capture needs (the
// engine's own prompt and sampled token ids and per-token logprobs)
// in the server's dialect: vLLM's return_token_ids on its chat endpoint
// (or return_tokens_as_token_ids on a server too old for it), or
// SGLang's native /generate (sglang.go), whose chat endpoint returns no
// ids. It bounds each
// attempt with a timeout and retries 429 / 5xx / connection failures with
// jittered exponential backoff, honouring Retry-After. A server of
// Anthropic's Messages dialect gets an Anthropic client's body relayed
// instead (anthropic.go), and an OpenAI server that speaks the Responses
// API a Responses client's (responses.go). It must not know about the gateway's HTTP
// handlers or Postgres.
package upstream

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
)

// Config is one upstream model.
type Config struct {
	// BaseURL ends in /v1, e.g. http://127.0.0.1:8000/v1.
	BaseURL string
	// Model is the upstream's name for the model.
	Model  string
	APIKey string
	// Timeout bounds one attempt (default 2m).
	Timeout time.Duration
	// Retries after the first attempt (default 0).
	Retries int
	// Backoff is the first retry delay, doubled each time (default 200ms).
	Backoff time.Duration
	// Dialect is how the server is asked for token ids (zero: deployment.DialectOpenAI,
	// plain OpenAI, which returns none).
	Dialect deployment.Dialect
	// Version stamps responses when the upstream does not say which
	// weights served (default: the model name the upstream reports).
	Version string
	// VersionsByName asks for a request's pinned version (Request.Version)
	// as the model name: the server holds each version as an adapter
	// under its version id (vLLM's dynamic LoRA).
	VersionsByName bool
	Client         *http.Client
}

// Backend talks to one upstream model.
type Backend struct {
	cfg Config
	// idsInTokens is set once the server answered logprobs without
	// token_ids (vLLM before return_token_ids): from then on the ids are
	// asked for as "token_id:N" token strings, at the cost of the text.
	idsInTokens atomic.Bool
}

// New checks cfg and returns the backend.
func New(cfg Config) (*Backend, error) {
	if cfg.BaseURL == "" || cfg.Model == "" {
		return nil, errors.New("upstream: base URL and model are required")
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 200 * time.Millisecond
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: false,
		}}
	}
	return &Backend{cfg: cfg}, nil
}

func (b *Backend) version(reported string) string {
	if b.cfg.Version != "" {
		return b.cfg.Version
	}
	if reported != "" {
		return reported
	}
	return b.cfg.Model
}
