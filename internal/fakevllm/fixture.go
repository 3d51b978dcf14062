// Package fakevllm is a FAKE of vLLM, which cannot run here (it needs a
// GPU and weights). It is not a second server of vLLM's dialect: the wire
// (routes, request decoding, errors, LoRA load and unload, SSE) is
// Flywheel's own model server (modelserver) over a scripted engine (a byte
// tokenizer and a deterministic answer), with a configurable latency,
// injectable failures and a record of the requests received. Tests and
// `flywheel bench gateway` use it where a real vLLM would be.
//
// What differs from the model server on purpose is the fixture's, and
// says so: the scripted engine, OldTokenIDs (a vLLM from before
// return_token_ids), and without RuntimeLoRA a server of the base alone
// that answers any model name.
package fakevllm

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/modelserver"
)

// Fixture is the fake upstream. Set its fields before serving.
type Fixture struct {
	// Latency is added before every answer (and between stream chunks,
	// divided evenly).
	Latency time.Duration
	// Model is the served model name (default "fixture-model").
	Model string
	// FailStatus, when FailNext > 0, is answered to the next FailNext
	// chat requests (default 503), with RetryAfter seconds if set.
	FailStatus int
	RetryAfter int
	FailNext   atomic.Int64
	// BreakStreamAfter > 0 cuts streams after that many chunks without
	// [DONE], as a crashed upstream would.
	BreakStreamAfter int
	// ErrorChunkAfter > 0 ends streams after that many chunks with an
	// error chunk and [DONE], as vLLM does when generation fails once the
	// stream has started (create_streaming_error_response).
	ErrorChunkAfter int
	// OldTokenIDs ignores return_token_ids, as vLLM did before it had
	// that parameter; return_tokens_as_token_ids still works.
	OldTokenIDs bool
	// RuntimeLoRA serves vLLM's dynamic LoRA endpoints, as vLLM does with
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (without it they are 404):
	// POST /v1/load_lora_adapter {"lora_name","lora_path"} and
	// /v1/unload_lora_adapter {"lora_name"}. A chat request must then name
	// the base model or a loaded adapter, or it gets vLLM's 404; without
	// it, any name is answered by the base.
	RuntimeLoRA bool
	// AdapterReply, when set, is how a loaded adapter answers (given its
	// name and the last user message) in place of the base's echo.
	AdapterReply func(adapter, last string) string
	// Reasoning, when set, is exposed thinking every answer starts with,
	// as vLLM's reasoning parser returns it: message.reasoning_content, or
	// in a stream a delta of its own before the answer's (its tokens are
	// not among the answer's ids here).
	Reasoning string
	// LoRALatency is added to each adapter load, as reading weights takes.
	LoRALatency time.Duration
	// FailLoRA, when > 0, fails that many adapter loads with 500.
	FailLoRA atomic.Int64

	// Requests counts the chat requests received.
	Requests atomic.Int64

	once   sync.Once
	server *modelserver.Server
	err    error

	mu      sync.Mutex
	last    []byte
	lastHdr http.Header
	// adapterCalls are the load / unload requests received, in order.
	adapterCalls []AdapterCall
}

// AdapterCall is one load or unload request the fake received.
type AdapterCall struct {
	// Path is the endpoint: /v1/load_lora_adapter or /v1/unload_lora_adapter.
	Path string
	// Body is the request body as sent.
	Body map[string]any
	// Status is what the fake answered.
	Status int
	At     time.Time
}

func (f *Fixture) model() string {
	if f.Model == "" {
		return "fixture-model"
	}
	return f.Model
}

// start builds the model server over the scripted engine, once.
func (f *Fixture) start() (*modelserver.Server, error) {
	f.once.Do(func() {
		f.server, f.err = modelserver.NewWithEngine(engine{f}, modelserver.Config{Name: f.model(), BaseOnly: !f.RuntimeLoRA,
			// The failures it would log are the ones a test injected.
			Logger: slog.New(slog.DiscardHandler)})
	})
	return f.server, f.err
}

// ServeHTTP records what the tests read back (the chat requests, the
// adapter calls) and hands the request to the model server.
func (f *Fixture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s, err := f.start()
	if err != nil {
		http.Error(w, "fake vLLM: "+err.Error(), http.StatusInternalServerError)
		return
	}
	switch {
	case r.URL.Path == "/v1/chat/completions":
		f.Requests.Add(1)
		body := f.readBody(r)
		f.mu.Lock()
		f.last, f.lastHdr = body, r.Header.Clone()
		f.mu.Unlock()
		if f.OldTokenIDs {
			r.Body = io.NopCloser(bytes.NewReader(withoutTokenIDs(body)))
		}
		s.ServeHTTP(w, r)
	case f.RuntimeLoRA && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "_lora_adapter"):
		body := f.readBody(r)
		var fields map[string]any
		_ = json.Unmarshal(body, &fields) // a body that is no object is recorded as nil
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		s.ServeHTTP(rec, r)
		f.mu.Lock()
		f.adapterCalls = append(f.adapterCalls, AdapterCall{Path: r.URL.Path, Body: fields, Status: rec.status, At: time.Now()})
		f.mu.Unlock()
	default:
		s.ServeHTTP(w, r)
	}
}

// readBody reads r's body and puts it back for the server.
func (f *Fixture) readBody(r *http.Request) []byte {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		body = nil // the server answers the truncated body
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body
}

// withoutTokenIDs drops return_token_ids from a chat request, as a vLLM
// that does not know the parameter ignores it.
func withoutTokenIDs(body []byte) []byte {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body
	}
	delete(fields, "return_token_ids")
	out, err := json.Marshal(fields)
	if err != nil {
		return body
	}
	return out
}

// statusRecorder remembers the status a handler answered.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(status int) {
	s.status = status
	s.ResponseWriter.WriteHeader(status)
}

// LastHeader is a header of the last chat request received.
func (f *Fixture) LastHeader(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastHdr.Get(name)
}

// LastRequest is the last chat request body received, decoded on demand
// so serving stays cheap (the benchmark runs this fixture in its process).
func (f *Fixture) LastRequest() map[string]any {
	f.mu.Lock()
	body := f.last
	f.mu.Unlock()
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	return m
}

// AdapterCalls are the load and unload requests received, in order.
func (f *Fixture) AdapterCalls() []AdapterCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]AdapterCall(nil), f.adapterCalls...)
}

// Adapters are the loaded adapters: name → path.
func (f *Fixture) Adapters() map[string]string {
	s, err := f.start()
	if err != nil {
		return nil
	}
	return s.Adapters()
}

// PromptIDs are the ids the fixture conditions a chat on: its template
// ("role:content\n" per message) in its byte tokenizer. messages is a
// JSON array of chat messages whose content is a string.
func PromptIDs(messages json.RawMessage) ([]int, error) {
	var raw []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(messages, &raw); err != nil {
		return nil, err
	}
	msgs := make([]inference.Message, len(raw))
	for i, m := range raw {
		msgs[i] = inference.Message{Role: m.Role, Content: text(m.Content)}
	}
	return tokens(renderPrompt(msgs)), nil
}

// text is a content's string, or its JSON as it is.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

// EventStream starts a text/event-stream answer on w: send writes one
// "data: <JSON>" event, done the "data: [DONE]" that ends the stream.
// The SGLang fake streams with it.
func EventStream(w http.ResponseWriter) (send func(any), done func()) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	write := func(b []byte) {
		_, _ = w.Write(b) // a client that left cannot be told
		if fl != nil {
			fl.Flush()
		}
	}
	send = func(v any) {
		b, _ := json.Marshal(v)
		write(append(append([]byte("data: "), b...), "\n\n"...))
	}
	return send, func() { write([]byte("data: [DONE]\n\n")) }
}
