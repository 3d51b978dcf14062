package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
)

// EngineConfig configures the serving engine.
type EngineConfig struct {
	// Name prefixes version names ("NAME@vN"). Default "flywheel-policy".
	Name string
	// DefaultMaxTokens applies when a request sets none. Default 64.
	DefaultMaxTokens int
	// KeepVersions is how many recent versions stay loaded for requests
	// that pin one (canary, shadow, replay). Default 4.
	KeepVersions int
	// Loader, when set, loads a version that is not in memory (a canary
	// or serving version trained by another process, or one evicted), so a
	// route naming any stored version never fails. CheckpointDir.Load fits.
	Loader func(version int64) (*Model, error)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c EngineConfig) withDefaults() EngineConfig {
	if c.Name == "" {
		c.Name = "flywheel-policy"
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = 64
	}
	if c.KeepVersions == 0 {
		c.KeepVersions = 4
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c EngineConfig) validate() error {
	if strings.Contains(c.Name, "@") {
		return fmt.Errorf("engine name %q must not contain @", c.Name)
	}
	if c.DefaultMaxTokens < 1 || c.KeepVersions < 1 {
		return fmt.Errorf("default_max_tokens %d and keep_versions %d must be positive", c.DefaultMaxTokens, c.KeepVersions)
	}
	return nil
}

// served is one immutable version.
type served struct {
	model   *Model
	version int64
	name    string
}

// Engine serves the in-process policy through inference.Backend. Publishing
// swaps one pointer: a request reads it once when it starts and finishes on
// those weights, so nothing waits for a new version and no request mixes two.
type Engine struct {
	cfg     EngineConfig
	current atomic.Pointer[served]
	mu      sync.Mutex
	recent  []*served // newest last, for pinned requests
	seed    atomic.Uint64
}

var _ inference.Backend = (*Engine)(nil)

// NewEngine serves m as version.
func NewEngine(m *Model, version int64, cfg EngineConfig) (*Engine, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	e := &Engine{cfg: cfg}
	e.seed.Store(uint64(time.Now().UnixNano()))
	if err := e.Publish(m, version); err != nil {
		return nil, err
	}
	return e, nil
}

// VersionName is how version is reported in responses.
func (e *Engine) VersionName(version int64) string {
	return e.cfg.Name + "@v" + strconv.FormatInt(version, 10)
}

// Publish makes m (which the engine now owns and never writes) the serving
// version. Versions only move forward.
func (e *Engine) Publish(m *Model, version int64) error {
	if m == nil {
		return errors.New("publish: nil model")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.current.Load(); cur != nil && version <= cur.version {
		return fmt.Errorf("publish: version %d is not newer than the serving version %d", version, cur.version)
	}
	s := &served{model: m, version: version, name: e.VersionName(version)}
	e.recent = append(e.recent, s)
	e.current.Store(s)
	e.evictLocked()
	e.cfg.Logger.Debug("policy version published", "version", s.name)
	return nil
}

// Current returns the serving model and its version.
func (e *Engine) Current() (*Model, int64) {
	s := e.current.Load()
	return s.model, s.version
}

func (e *Engine) pick(name string) (*served, error) {
	if name == "" {
		return e.current.Load(), nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, s := range e.recent {
		if s.name == name || "v"+strconv.FormatInt(s.version, 10) == name {
			// Most recently used last, so eviction drops the coldest.
			e.recent = append(append(e.recent[:i:i], e.recent[i+1:]...), s)
			return s, nil
		}
	}
	version, ok := e.parseVersion(name)
	if !ok || e.cfg.Loader == nil {
		return nil, &inference.Error{Status: 404, Message: fmt.Sprintf("model version %q is not loaded", name)}
	}
	m, err := e.cfg.Loader(version)
	if err != nil {
		return nil, &inference.Error{Status: 404, Message: fmt.Sprintf("model version %q is not available", name), Err: err}
	}
	s := &served{model: m, version: version, name: e.VersionName(version)}
	e.recent = append(e.recent, s)
	e.evictLocked()
	return s, nil
}

// parseVersion reads "NAME@vN" (this engine's name) or "vN".
func (e *Engine) parseVersion(name string) (int64, bool) {
	if rest, ok := strings.CutPrefix(name, e.cfg.Name+"@"); ok {
		name = rest
	}
	digits, ok := strings.CutPrefix(name, "v")
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	return v, err == nil && v >= 0
}

// evictLocked keeps at most KeepVersions loaded, never the current one.
func (e *Engine) evictLocked() {
	cur := e.current.Load()
	for len(e.recent) > e.cfg.KeepVersions {
		i := 0
		if e.recent[0] == cur && len(e.recent) > 1 {
			i = 1
		}
		e.recent = append(e.recent[:i], e.recent[i+1:]...)
	}
}

// Evict drops version from memory unless it is the serving one, so the
// next request naming it goes through Loader again: its checkpoint may have
// changed (an adapter unloaded, then loaded from another path). Requests
// already running on it finish on the weights they read.
func (e *Engine) Evict(version int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := e.current.Load()
	kept := e.recent[:0]
	for _, s := range e.recent {
		if s.version != version || s == cur {
			kept = append(kept, s)
		}
	}
	clear(e.recent[len(kept):]) // no stale pointer keeps evicted weights alive
	e.recent = kept
}

// Complete implements inference.Backend.
func (e *Engine) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	return e.generate(ctx, req, nil)
}

// Stream implements inference.Backend. Text inside a tool call is held back:
// tool calls arrive only in the final response.
func (e *Engine) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	if emit == nil {
		return nil, badRequest("stream: nil emit")
	}
	return e.generate(ctx, req, emit)
}

// CountTokens implements inference.Counter: the length of the prompt as
// the policy renders it, tools included.
func (e *Engine) CountTokens(ctx context.Context, req *inference.Request) (int, error) {
	prompt, err := RenderPrompt(req.Messages, req.Tools, req.ToolChoice, req.PromptTokenIDs)
	if err != nil {
		return 0, badRequest("%v", err)
	}
	return len(prompt), nil
}

// unsupported refuses what the policy's sampler cannot honour, rather
// than answering as if it had: structured output, penalties, logit bias,
// and at most one tool call (it may write several).
func unsupported(req *inference.Request) error {
	const why = "the in-process policy cannot honour %s; send it to an upstream deployment, or leave it out"
	if f := bytes.TrimSpace(req.ResponseFormat); len(f) > 0 && string(f) != "null" {
		var rf struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(f, &rf) != nil || rf.Type != "text" {
			return badRequest(why, "response_format "+rf.Type)
		}
	}
	if p := req.FrequencyPenalty; p != nil && *p != 0 {
		return badRequest(why, "frequency_penalty")
	}
	if p := req.PresencePenalty; p != nil && *p != 0 {
		return badRequest(why, "presence_penalty")
	}
	if len(req.LogitBias) > 0 {
		return badRequest(why, "logit_bias")
	}
	if p := req.ParallelToolCalls; p != nil && !*p && len(req.Tools) > 0 {
		return badRequest(why, "parallel_tool_calls: false")
	}
	return nil
}

func badRequest(format string, args ...any) error {
	return &inference.Error{Status: 400, Message: fmt.Sprintf(format, args...)}
}

func (e *Engine) generate(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	start := time.Now()
	if req == nil {
		return nil, badRequest("nil request")
	}
	if len(req.Messages) == 0 && len(req.PromptTokenIDs) == 0 {
		return nil, badRequest("messages are empty")
	}
	if err := unsupported(req); err != nil {
		return nil, err
	}
	s, err := e.pick(req.Version)
	if err != nil {
		return nil, err
	}
	prompt, err := RenderPrompt(req.Messages, req.Tools, req.ToolChoice, req.PromptTokenIDs)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	rng := e.requestRNG(req)
	streamer := &textStreamer{stops: req.Stop}
	parseTools := req.ToolChoice != "none" && len(req.Tools) > 0
	var onToken func(int, int, float32) error
	if emit != nil {
		onToken = streamTokens(emit, streamer, parseTools)
	}
	gens, err := s.model.Generate(ctx, [][]int{prompt}, e.sampleOptions(req), rng, onToken)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ie *inputError
		if errors.As(err, &ie) {
			return nil, badRequest("%v", err)
		}
		return nil, err // emit's own error
	}
	g := gens[0]
	if emit != nil {
		if rest := streamer.flush(g.StopText); rest != "" {
			if err := emit(inference.Delta{Text: rest}); err != nil {
				return nil, err
			}
		}
	}
	resp := response(s, prompt, g, parseTools, rng)
	resp.Latency = time.Since(start)
	return resp, nil
}

// sampleOptions are the request's sampling parameters, with the engine's
// default length.
func (e *Engine) sampleOptions(req *inference.Request) SampleOptions {
	opts := SampleOptions{Temperature: req.Temperature, MaxTokens: req.MaxTokens, Stop: req.Stop, TopLogprobs: req.TopLogprobs}
	if req.TopP != nil {
		opts.TopP = *req.TopP
	}
	if opts.MaxTokens == 0 {
		opts.MaxTokens = e.cfg.DefaultMaxTokens
	}
	return opts
}

// requestRNG gives each request its own stream: reproducible when the
// request names a seed, else seeded by the next value of the engine's
// sequence.
func (e *Engine) requestRNG(req *inference.Request) *rand.Rand {
	if req.Seed != nil {
		return rand.New(rand.NewPCG(uint64(*req.Seed), 0))
	}
	return rand.New(rand.NewPCG(e.seed.Add(0x9e3779b97f4a7c15), 1))
}

// streamTokens turns each sampled token into a delta for emit: its id and
// log-prob always, its text unless it is inside a tool call (when tools are
// parsed) or the end of the message; stop strings are held back by
// streamer.
func streamTokens(emit func(inference.Delta) error, streamer *textStreamer, parseTools bool) func(int, int, float32) error {
	inTool := false
	return func(_ int, id int, lp float32) error {
		d := inference.Delta{TokenIDs: []int{id}, Logprobs: []float32{lp}}
		switch {
		case id == TokImEnd:
		case parseTools && id == TokToolStart:
			inTool = true
		case parseTools && id == TokToolEnd:
			inTool = false
		case !inTool:
			d.Text = streamer.push(TokenText(id))
		}
		return emit(d)
	}
}

// response is the finished generation g of prompt on version s: its text
// without the end token and the stop string, tool calls parsed when asked
// (ids drawn from rng), and per-token text and alternatives.
func response(s *served, prompt []int, g Generation, parseTools bool, rng *rand.Rand) *inference.Response {
	ids := g.IDs
	if n := len(ids); n > 0 && ids[n-1] == TokImEnd {
		ids = ids[:n-1]
	}
	text := Tokenizer{}.Decode(ids)
	if g.StopText != "" {
		text = strings.TrimSuffix(text, g.StopText)
	}
	resp := &inference.Response{
		Message:            inference.Message{Role: inference.RoleAssistant},
		FinishReason:       g.Finish,
		PromptTokenIDs:     prompt,
		CompletionTokenIDs: g.IDs,
		Logprobs:           g.Logprobs,
		ModelVersion:       s.name,
		Usage:              inference.Usage{PromptTokens: len(prompt), CompletionTokens: len(g.IDs)},
	}
	if parseTools {
		resp.Message.Content, resp.Message.ToolCalls = ParseAssistant(text, fmt.Sprintf("call_%d_%d", s.version, rng.Uint32()))
		if len(resp.Message.ToolCalls) > 0 {
			resp.FinishReason = inference.FinishToolCalls
		}
	} else {
		resp.Message.Content = text
	}
	for i, id := range g.IDs {
		resp.CompletionTokens = append(resp.CompletionTokens, TokenText(id))
		if len(g.Top) > i {
			alts := make([]inference.TopLogprob, len(g.Top[i]))
			for j, t := range g.Top[i] {
				alts[j] = inference.TopLogprob{TokenID: t.ID, Token: TokenText(t.ID), Logprob: t.Logprob}
			}
			resp.TopLogprobs = append(resp.TopLogprobs, alts)
		}
	}
	return resp
}
