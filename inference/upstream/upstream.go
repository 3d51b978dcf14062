// Package upstream is the inference.Backend for an OpenAI-compatible
// server (vLLM, SGLang, OpenAI). It asks for what capture needs (the
// engine's own prompt and sampled token ids and per-token logprobs)
// in the server's dialect: vLLM's return_token_ids on its chat endpoint
// (or return_tokens_as_token_ids on a server too old for it), or
// SGLang's native /generate (sglang.go), whose chat endpoint returns no
// ids. It bounds each
// attempt with a timeout and retries 429 / 5xx / connection failures with
// jittered exponential backoff, honouring Retry-After. It must not know
// about the gateway's HTTP handlers or Postgres.
package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/flywheel-ai/flywheel/inference"
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
	// Dialect is how the server is asked for token ids (zero: DialectOpenAI,
	// plain OpenAI, which returns none).
	Dialect Dialect
	// Version stamps responses when the upstream does not say which
	// weights served (default: the model name the upstream reports).
	Version string
	// VersionsByName asks for a request's pinned version (Request.Version)
	// as the model name: the server holds each version as an adapter
	// under its version id (vLLM's dynamic LoRA).
	VersionsByName bool
	Client         *http.Client
}

// Dialect names the extensions a server understands for returning the
// engine's token ids.
type Dialect string

const (
	// DialectVLLM asks the chat endpoint for ids with vLLM's
	// return_token_ids (return_tokens_as_token_ids on an older vLLM).
	DialectVLLM Dialect = "vllm"
	// DialectSGLang generates through SGLang's native /generate with the
	// prompt's input_ids and return_logprob (sglang.go).
	DialectSGLang Dialect = "sglang"
	// DialectOpenAI is plain OpenAI Chat Completions: no ids, so its
	// samples never train (for servers that reject unknown parameters).
	DialectOpenAI Dialect = "openai"
)

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

type wireMessage struct {
	Role       string         `json:"role"`
	Content    *string        `json:"content"`
	Name       string         `json:"name,omitempty"`
	ToolCalls  []wireToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type wireToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type wireTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

type wireRequest struct {
	Model       string        `json:"model"`
	Messages    []wireMessage `json:"messages"`
	Tools       []wireTool    `json:"tools,omitempty"`
	ToolChoice  any           `json:"tool_choice,omitempty"`
	MaxTokens   int           `json:"max_tokens,omitempty"`
	Temperature *float64      `json:"temperature,omitempty"`
	TopP        *float64      `json:"top_p,omitempty"`
	Stop        []string      `json:"stop,omitempty"`
	Seed        *int64        `json:"seed,omitempty"`
	// The client's own parameters, forwarded as they came.
	ResponseFormat    json.RawMessage    `json:"response_format,omitempty"`
	ParallelToolCalls *bool              `json:"parallel_tool_calls,omitempty"`
	FrequencyPenalty  *float64           `json:"frequency_penalty,omitempty"`
	PresencePenalty   *float64           `json:"presence_penalty,omitempty"`
	LogitBias         map[string]float64 `json:"logit_bias,omitempty"`
	Logprobs          bool               `json:"logprobs"`
	TopLogprobs       int                `json:"top_logprobs,omitempty"`
	Stream            bool               `json:"stream,omitempty"`
	StreamOptions     *streamOptions     `json:"stream_options,omitempty"`
	ReturnTokenID     *bool              `json:"return_token_ids,omitempty"`
	TokensAsIDs       *bool              `json:"return_tokens_as_token_ids,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

func (b *Backend) wire(req *inference.Request, stream bool) wireRequest {
	w := wireRequest{Model: b.cfg.Model, MaxTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP,
		Stop: req.Stop, Seed: req.Seed, Logprobs: true, TopLogprobs: req.TopLogprobs, Stream: stream,
		ResponseFormat: req.ResponseFormat, ParallelToolCalls: req.ParallelToolCalls, FrequencyPenalty: req.FrequencyPenalty,
		PresencePenalty: req.PresencePenalty, LogitBias: req.LogitBias}
	if b.cfg.VersionsByName && req.Version != "" {
		w.Model = req.Version
	}
	if stream {
		w.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if b.cfg.Dialect == DialectVLLM {
		t := true
		w.ReturnTokenID = &t
		if b.idsInTokens.Load() {
			w.TokensAsIDs = &t
		}
	}
	for _, m := range req.Messages {
		content := m.Content
		wm := wireMessage{Role: m.Role, Content: &content, Name: m.Name, ToolCallID: m.ToolCallID}
		if m.Role == inference.RoleAssistant && content == "" && len(m.ToolCalls) > 0 {
			wm.Content = nil
		}
		for _, tc := range m.ToolCalls {
			var wt wireToolCall
			wt.ID, wt.Type = tc.ID, "function"
			wt.Function.Name, wt.Function.Arguments = tc.Name, tc.Arguments
			wm.ToolCalls = append(wm.ToolCalls, wt)
		}
		w.Messages = append(w.Messages, wm)
	}
	for _, t := range req.Tools {
		var wt wireTool
		wt.Type = "function"
		wt.Function.Name, wt.Function.Description, wt.Function.Parameters = t.Name, t.Description, t.Parameters
		w.Tools = append(w.Tools, wt)
	}
	switch req.ToolChoice {
	case "":
	case "auto", "none", "required":
		w.ToolChoice = req.ToolChoice
	default:
		w.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": req.ToolChoice}}
	}
	return w
}

type wireLogprob struct {
	Token       string  `json:"token"`
	Logprob     float32 `json:"logprob"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float32 `json:"logprob"`
	} `json:"top_logprobs"`
}

type wireChoice struct {
	Message struct {
		Content          *string        `json:"content"`
		ReasoningContent string         `json:"reasoning_content"`
		ToolCalls        []wireToolCall `json:"tool_calls"`
	} `json:"message"`
	Delta struct {
		Content          *string        `json:"content"`
		ReasoningContent string         `json:"reasoning_content"`
		ToolCalls        []wireToolCall `json:"tool_calls"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
	// StopReason is vLLM's: the stop string that ended the answer.
	StopReason stopReason `json:"stop_reason"`
	Logprobs   *struct {
		Content []wireLogprob `json:"content"`
	} `json:"logprobs"`
	TokenIDs []int `json:"token_ids"`
}

type wireResponse struct {
	// Error is set on a chunk that reports a failure after the stream
	// started (vLLM sends it, then [DONE]).
	Error          *wireError   `json:"error"`
	Model          string       `json:"model"`
	Choices        []wireChoice `json:"choices"`
	PromptTokenIDs []int        `json:"prompt_token_ids"`
	Usage          *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

type wireError struct {
	Message string `json:"message"`
}

// maxResponseBytes bounds a non-streaming answer; a longer one is cut
// and fails to decode.
const maxResponseBytes = 256 << 20

// bodyBuffers recycles response buffers: decoding copies every string out,
// so nothing keeps a reference into a buffer once it is put back.
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// putBodyBuffer returns buf to the pool unless one huge answer grew it.
func putBodyBuffer(buf *bytes.Buffer) {
	if buf.Cap() <= 1<<20 {
		bodyBuffers.Put(buf)
	}
}

// Complete runs one non-streaming generation.
func (b *Backend) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	start := time.Now()
	if b.native(req) {
		resp, err := b.generate(ctx, req)
		if err == nil {
			resp.Latency = time.Since(start)
			return resp, nil
		}
		if !errors.Is(err, errNoChatTokens) {
			return nil, err
		}
	}
	body, err := json.Marshal(b.wire(req, false))
	if err != nil {
		return nil, fmt.Errorf("upstream: encode request: %w", err)
	}
	var resp *inference.Response
	err = b.retry(ctx, func(ctx context.Context) error {
		httpResp, err := b.post(ctx, body)
		if err != nil {
			return err
		}
		defer httpResp.Body.Close()
		buf := bodyBuffers.Get().(*bytes.Buffer)
		defer putBodyBuffer(buf)
		buf.Reset()
		var w wireResponse
		_, err = buf.ReadFrom(io.LimitReader(httpResp.Body, maxResponseBytes))
		if err == nil {
			err = decodeWire(buf.Bytes(), &w)
		}
		if err != nil {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable response", Err: err}
		}
		if w.Error != nil {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream failed: " + w.Error.Message}
		}
		if len(w.Choices) == 0 {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent no choices"}
		}
		resp = b.assemble(&w)
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.learnIDs(resp)
	resp.Latency = time.Since(start)
	return resp, nil
}

// learnIDs notes a server that answered logprobs but no token ids: it
// does not know return_token_ids, so later requests ask for the ids in
// the token strings instead. Asking for both always would cost every
// modern server its token text (vLLM computes bytes from that string).
func (b *Backend) learnIDs(resp *inference.Response) {
	if b.cfg.Dialect == DialectVLLM && resp != nil && len(resp.Logprobs) > 0 && len(resp.CompletionTokenIDs) == 0 {
		b.idsInTokens.Store(true)
	}
}

func (b *Backend) assemble(w *wireResponse) *inference.Response {
	ch := w.Choices[0]
	resp := &inference.Response{PromptTokenIDs: w.PromptTokenIDs, CompletionTokenIDs: ch.TokenIDs, ModelVersion: b.version(w.Model)}
	resp.Message.Role = inference.RoleAssistant
	if ch.Message.Content != nil {
		resp.Message.Content = *ch.Message.Content
	}
	resp.Message.Reasoning = ch.Message.ReasoningContent
	for _, tc := range ch.Message.ToolCalls {
		resp.Message.ToolCalls = append(resp.Message.ToolCalls, inference.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	if ch.FinishReason != nil {
		resp.FinishReason = *ch.FinishReason
	}
	resp.StopSequence = string(ch.StopReason)
	if ch.Logprobs != nil {
		addLogprobs(resp, ch.Logprobs.Content, len(ch.TokenIDs) == 0)
	}
	if w.Usage != nil {
		resp.Usage = inference.Usage{PromptTokens: w.Usage.PromptTokens, CompletionTokens: w.Usage.CompletionTokens}
	}
	return resp
}

// addLogprobs appends per-token logprobs; with vLLM's
// return_tokens_as_token_ids the token text is "token_id:N", which also
// gives the id when the server did not return token_ids.
func addLogprobs(resp *inference.Response, lps []wireLogprob, idsFromTokens bool) {
	for _, lp := range lps {
		resp.Logprobs = append(resp.Logprobs, lp.Logprob)
		resp.CompletionTokens = append(resp.CompletionTokens, lp.Token)
		if idsFromTokens {
			if id, ok := tokenID(lp.Token); ok {
				resp.CompletionTokenIDs = append(resp.CompletionTokenIDs, id)
			}
		}
		if len(lp.TopLogprobs) > 0 {
			top := make([]inference.TopLogprob, len(lp.TopLogprobs))
			for i, t := range lp.TopLogprobs {
				id, _ := tokenID(t.Token)
				top[i] = inference.TopLogprob{TokenID: id, Token: t.Token, Logprob: t.Logprob}
			}
			resp.TopLogprobs = append(resp.TopLogprobs, top)
		}
	}
	if len(resp.CompletionTokenIDs) != len(resp.Logprobs) && idsFromTokens {
		resp.CompletionTokenIDs = nil // partial ids are worse than none
	}
}

func tokenID(tok string) (int, bool) {
	s, ok := strings.CutPrefix(tok, "token_id:")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
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

// Stream runs one streaming generation.
func (b *Backend) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	start := time.Now()
	var resp *inference.Response
	var err error
	if b.native(req) {
		resp, err = b.streamGenerate(ctx, req, emit)
	}
	if !b.native(req) || errors.Is(err, errNoChatTokens) {
		var body []byte
		if body, err = json.Marshal(b.wire(req, true)); err != nil {
			return nil, fmt.Errorf("upstream: encode request: %w", err)
		}
		resp, err = b.streamFrom(ctx, b.cfg.BaseURL+"/chat/completions", body, b.readStream, emit)
	}
	if err != nil {
		return resp, err
	}
	b.learnIDs(resp)
	resp.Latency = time.Since(start)
	return resp, nil
}

// streamFrom posts body to url and reads the answer's stream with read.
// Retries happen only before the first increment was emitted: after that
// the client has seen output.
func (b *Backend) streamFrom(ctx context.Context, url string, body []byte,
	read func(io.Reader, func(inference.Delta) error) (*inference.Response, error), emit func(inference.Delta) error) (*inference.Response, error) {
	var resp *inference.Response
	emitted := false
	err := b.retry(ctx, func(ctx context.Context) error {
		if emitted {
			return errNoRetry
		}
		httpResp, err := b.postTo(ctx, url, body)
		if err != nil {
			return err
		}
		defer httpResp.Body.Close()
		resp, err = read(httpResp.Body, func(d inference.Delta) error {
			emitted = true
			return emit(d)
		})
		if err != nil && emitted {
			return noRetry{err}
		}
		return err
	})
	var nr noRetry
	if errors.As(err, &nr) {
		err = nr.err
	}
	return resp, err
}

var errNoRetry = errors.New("upstream: stream already started")

type noRetry struct{ err error }

func (n noRetry) Error() string { return n.err.Error() }
func (n noRetry) Unwrap() error { return n.err }

func (b *Backend) readStream(r io.Reader, emit func(inference.Delta) error) (*inference.Response, error) {
	resp := &inference.Response{ModelVersion: b.version("")}
	resp.Message.Role = inference.RoleAssistant
	var content, reasoning strings.Builder
	calls := map[int]*inference.ToolCall{}
	var order []int
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		var w wireResponse
		if err := unmarshalWire(data, &w); err != nil {
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable stream chunk", Err: err}
		}
		if w.Error != nil {
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream failed: " + w.Error.Message}
		}
		if w.Model != "" {
			resp.ModelVersion = b.version(w.Model)
		}
		if len(w.PromptTokenIDs) > 0 {
			resp.PromptTokenIDs = w.PromptTokenIDs
		}
		if w.Usage != nil {
			resp.Usage = inference.Usage{PromptTokens: w.Usage.PromptTokens, CompletionTokens: w.Usage.CompletionTokens}
		}
		if len(w.Choices) == 0 {
			continue
		}
		ch := w.Choices[0]
		d := inference.Delta{TokenIDs: ch.TokenIDs, Reasoning: ch.Delta.ReasoningContent}
		if ch.Delta.Content != nil {
			d.Text = *ch.Delta.Content
		}
		resp.CompletionTokenIDs = append(resp.CompletionTokenIDs, ch.TokenIDs...)
		if ch.Logprobs != nil {
			before := len(resp.CompletionTokenIDs)
			addLogprobs(resp, ch.Logprobs.Content, len(ch.TokenIDs) == 0)
			for _, lp := range ch.Logprobs.Content {
				d.Logprobs = append(d.Logprobs, lp.Logprob)
				d.Tokens = append(d.Tokens, lp.Token)
			}
			if len(ch.TokenIDs) == 0 {
				d.TokenIDs = resp.CompletionTokenIDs[min(before, len(resp.CompletionTokenIDs)):]
			}
		}
		for _, tc := range ch.Delta.ToolCalls {
			idx := 0
			if tc.Index != nil {
				idx = *tc.Index
			}
			c, ok := calls[idx]
			if !ok {
				c = &inference.ToolCall{}
				calls[idx] = c
				order = append(order, idx)
			}
			if tc.ID != "" {
				c.ID = tc.ID
			}
			if tc.Function.Name != "" {
				c.Name = tc.Function.Name
			}
			c.Arguments += tc.Function.Arguments
			d.ToolCalls = append(d.ToolCalls, inference.ToolCallDelta{Index: idx, ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
		if ch.FinishReason != nil {
			resp.FinishReason = *ch.FinishReason
		}
		if ch.StopReason != "" {
			resp.StopSequence = string(ch.StopReason)
		}
		content.WriteString(d.Text)
		reasoning.WriteString(d.Reasoning)
		if d.Text != "" || d.Reasoning != "" || len(d.TokenIDs) > 0 || len(d.ToolCalls) > 0 {
			if err := emit(d); err != nil {
				return resp, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream broke", Err: err}
	}
	if !done {
		return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream ended without [DONE]"}
	}
	resp.Message.Content = content.String()
	resp.Message.Reasoning = reasoning.String()
	for _, i := range order {
		resp.Message.ToolCalls = append(resp.Message.ToolCalls, *calls[i])
	}
	return resp, nil
}

// CountTokens implements inference.Counter with the server's tokenizer
// endpoint, which applies the model's own chat template (tokenize); a
// plain OpenAI server has none (501).
func (b *Backend) CountTokens(ctx context.Context, req *inference.Request) (int, error) {
	ids, err := b.tokenize(ctx, req)
	if err != nil {
		return 0, err
	}
	return len(ids), nil
}

// tokenize returns the prompt's token ids as the server's chat template
// and tokenizer make them: vLLM's POST /tokenize at the server's root
// (beside /v1), or SGLang's POST /v1/tokenize, whose TokenizeRequest
// takes "messages" and "tools" and renders them as its chat endpoint does
// (entrypoints/openai/protocol.py). Both answer {"tokens", "count",
// "max_model_len"}. A server without the route answers 501.
func (b *Backend) tokenize(ctx context.Context, req *inference.Request) ([]int, error) {
	var url string
	switch b.cfg.Dialect {
	case DialectVLLM:
		url = strings.TrimSuffix(b.cfg.BaseURL, "/v1") + "/tokenize"
	case DialectSGLang:
		url = b.cfg.BaseURL + "/tokenize"
	default:
		return nil, &inference.Error{Status: http.StatusNotImplemented, Message: "this upstream has no tokenizer endpoint (its dialect is plain OpenAI)"}
	}
	w := b.wire(req, false)
	in := tokenizeRequest{Model: w.Model, Messages: w.Messages, Tools: w.Tools}
	if b.cfg.Dialect == DialectVLLM {
		t := true
		in.AddGenerationPrompt = &t
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("upstream: encode request: %w", err)
	}
	var out struct {
		Tokens []int `json:"tokens"`
		Count  *int  `json:"count"`
	}
	err = b.retry(ctx, func(ctx context.Context) error {
		resp, err := b.postTo(ctx, url, body)
		if err != nil {
			var ie *inference.Error
			var st statusError
			if errors.As(err, &ie) && errors.As(err, &st) && st == http.StatusNotFound {
				ie.Status, ie.Message = http.StatusNotImplemented, "the upstream has no tokenize endpoint"
			}
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out); err != nil || out.Count == nil || *out.Count != len(out.Tokens) {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable tokenize answer", Err: err}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

// tokenizeRequest is the chat form of vLLM's and SGLang's tokenize
// request. add_generation_prompt is vLLM's (default true there too);
// SGLang always adds the generation prompt, as its chat endpoint does.
type tokenizeRequest struct {
	Model               string        `json:"model"`
	Messages            []wireMessage `json:"messages"`
	Tools               []wireTool    `json:"tools,omitempty"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt,omitempty"`
}

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
	resp, err := b.cfg.Client.Do(req)
	if err != nil {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream unreachable", Err: err}
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	e := &inference.Error{Status: resp.StatusCode, Message: upstreamMessage(msg, resp.StatusCode), Err: statusError(resp.StatusCode)}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if secs, err := strconv.Atoi(s); err == nil {
			e.RetryAfter = time.Duration(secs) * time.Second
		}
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
	case resp.StatusCode >= 500:
		e.Status = http.StatusBadGateway
		if resp.StatusCode == http.StatusServiceUnavailable {
			e.Status = http.StatusServiceUnavailable
		}
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity:
		e.Status = http.StatusBadRequest
	default:
		e.Status = http.StatusBadGateway
	}
	return nil, e
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

func (b *Backend) retry(ctx context.Context, attempt func(ctx context.Context) error) error {
	var err error
	for i := 0; ; i++ {
		actx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		err = attempt(actx)
		cancel()
		if err == nil || errors.Is(err, errNoRetry) {
			return err
		}
		var nr noRetry
		if errors.As(err, &nr) || ctx.Err() != nil || !Retryable(err) || i >= b.cfg.Retries {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return &inference.Error{Status: http.StatusBadGateway, Message: "upstream timed out", Err: err}
			}
			return err
		}
		wait := b.cfg.Backoff << i
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

// Fallback tries backends in order, moving on when one fails in a way
// another might not (429, 5xx, unreachable, timeout).
type Fallback []inference.Backend

// Complete implements inference.Backend.
func (f Fallback) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	var err error
	for _, b := range f {
		var resp *inference.Response
		resp, err = b.Complete(ctx, req)
		if err == nil || !Retryable(err) {
			return resp, err
		}
	}
	return nil, err
}

// CountTokens implements inference.Counter with the first backend, which
// serves the model the fallbacks stand in for.
func (f Fallback) CountTokens(ctx context.Context, req *inference.Request) (int, error) {
	if c, ok := f[0].(inference.Counter); ok {
		return c.CountTokens(ctx, req)
	}
	return 0, &inference.Error{Status: http.StatusNotImplemented, Message: "this model's backend cannot count tokens"}
}

// Stream implements inference.Backend; it falls back only while nothing
// has been emitted.
func (f Fallback) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	var err error
	for _, b := range f {
		emitted := false
		var resp *inference.Response
		resp, err = b.Stream(ctx, req, func(d inference.Delta) error { emitted = true; return emit(d) })
		if err == nil || emitted || !Retryable(err) {
			return resp, err
		}
	}
	return nil, err
}

// stopReason is vLLM's choice.stop_reason: the stop string that ended the
// answer; a stop token's id (a number) or null leave it "".
type stopReason string

func (r *stopReason) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '"' {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*r = stopReason(s)
	return nil
}
