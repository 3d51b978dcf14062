// Package fakesglang is a FAKE of an SGLang server, not a model server:
// it implements the part of SGLang's HTTP contract that Flywheel uses, as
// SGLang's entrypoints/http_server.py, entrypoints/openai/protocol.py and
// managers/io_struct.py define it, where a real SGLang would need a GPU
// and a model:
//
//   - POST /v1/tokenize (and /tokenize) {"model", "prompt" | "messages",
//     "tools"} answers {"tokens", "count", "max_model_len"}: the chat
//     template applied to messages, as the chat endpoint would; exactly one
//     of prompt and messages, else 400 (PromptOnlyTokenize: messages are a
//     400, as before SGLang's tokenize took them);
//   - POST /generate with GenerateReqInput {"text" | "input_ids",
//     "sampling_params", "return_logprob", "top_logprobs_num",
//     "return_text_in_logprobs", "stream"} answers {"text", "output_ids",
//     "meta_info": {"id", "finish_reason", "prompt_tokens",
//     "completion_tokens", "weight_version", "output_token_logprobs":
//     [[logprob, id, text], …], "output_top_logprobs"}}; with "stream",
//     SSE "data:" chunks that each hold everything so far (or only what is
//     new, with IncrementalStreaming), then "data: [DONE]"; a failure after
//     the stream started is a {"error": {"message"}} chunk before [DONE];
//     errors before it are 400 {"error": {"message"}};
//   - POST /update_weights_from_disk {"model_path", "weight_version", …}
//     answers 200 {"success": true, "message", "num_paused_requests"} or
//     400 {"success": false, "message"}; requests that arrive during the
//     update wait for it, as SGLang pauses them, and none fails;
//   - GET /model_info answers {"model_path", "weight_version", …};
//   - everything else (/v1/chat/completions, /v1/models) is the vLLM-dialect
//     fake's, which speaks the same OpenAI protocol, less vLLM's token-id
//     parameters: SGLang's chat endpoint returns no ids.
package fakesglang

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flywheel-ai/flywheel/internal/fakevllm"
)

// Fake is the fake SGLang server. Set its fields before serving.
type Fake struct {
	// Chat answers the OpenAI endpoints.
	Chat fakevllm.Fixture
	// ModelPath is the path the server started with.
	ModelPath string
	// LoadLatency is how long an update takes.
	LoadLatency time.Duration
	// FailNext, when > 0, fails that many updates with 500 (an engine
	// crash mid-update, not SGLang's own 400).
	FailNext atomic.Int64

	// Latency is added to each /generate answer (spread over a stream).
	Latency time.Duration
	// FailNextGenerate, when > 0, answers that many /generate calls with
	// FailStatus (default 500).
	FailNextGenerate atomic.Int64
	FailStatus       int
	// ErrorChunkAfter > 0 ends /generate streams after that many chunks
	// with an error chunk and [DONE].
	ErrorChunkAfter int
	// IncrementalStreaming streams only what is new in each chunk, as
	// SGLang does with --incremental-streaming-output.
	IncrementalStreaming bool
	// PromptOnlyTokenize makes /v1/tokenize take only a prompt.
	PromptOnlyTokenize bool

	generated atomic.Int64
	// tokenizes and generates are the bodies received, in order.
	tokenizes [][]byte
	generates [][]byte

	// swap is held for writing during an update: chat requests hold it for
	// reading, so they wait for the update instead of failing.
	swap    sync.RWMutex
	mu      sync.Mutex
	path    string
	version string
	updates []map[string]any
}

// Updates are the update bodies received, in order.
func (f *Fake) Updates() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.updates...)
}

// Generates are the /generate bodies received, decoded, in order.
func (f *Fake) Generates() []map[string]any { return f.decoded(&f.generates) }

// Tokenizes are the /v1/tokenize bodies received, decoded, in order.
func (f *Fake) Tokenizes() []map[string]any { return f.decoded(&f.tokenizes) }

func (f *Fake) record(to *[][]byte, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*to = append(*to, body)
}

func (f *Fake) decoded(from *[][]byte) []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]map[string]any, len(*from))
	for i, b := range *from {
		_ = json.Unmarshal(b, &out[i])
	}
	return out
}

// Weights are the loaded model path and weight version.
func (f *Fake) Weights() (path, version string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.path == "" {
		return f.ModelPath, f.version
	}
	return f.path, f.version
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// ServeHTTP implements http.Handler.
func (f *Fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/update_weights_from_disk" && r.Method == http.MethodPost:
		f.update(w, r)
	case r.URL.Path == "/model_info" && r.Method == http.MethodGet:
		path, version := f.Weights()
		writeJSON(w, 200, map[string]any{"model_path": path, "tokenizer_path": path, "is_generation": true, "weight_version": version})
	default:
		// Requests wait while an update holds the weights.
		f.swap.RLock()
		defer f.swap.RUnlock()
		switch {
		case r.Method == http.MethodPost && (r.URL.Path == "/generate" || r.URL.Path == "/generate/"):
			f.generate(w, r)
		case r.Method == http.MethodPost && (r.URL.Path == "/v1/tokenize" || r.URL.Path == "/tokenize"):
			f.tokenize(w, r)
		case r.URL.Path == "/v1/chat/completions":
			withoutTokenIDs(r)
			f.Chat.ServeHTTP(w, r)
		default:
			f.Chat.ServeHTTP(w, r)
		}
	}
}

// withoutTokenIDs drops vLLM's token-id parameters from a chat request:
// SGLang's chat endpoint has none, so it returns no ids.
func withoutTokenIDs(r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if json.Unmarshal(raw, &body) == nil {
		delete(body, "return_token_ids")
		delete(body, "return_tokens_as_token_ids")
		raw, _ = json.Marshal(body)
	}
	r.Body = io.NopCloser(bytes.NewReader(raw))
}

func (f *Fake) update(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	if err := json.Unmarshal(raw, &body); err != nil {
		writeJSON(w, 422, map[string]any{"detail": "body is not JSON: " + err.Error()})
		return
	}
	f.mu.Lock()
	f.updates = append(f.updates, body)
	f.mu.Unlock()
	path, _ := body["model_path"].(string)
	version, _ := body["weight_version"].(string)
	if path == "" {
		writeJSON(w, 422, map[string]any{"detail": "model_path is required"})
		return
	}
	if f.FailNext.Load() > 0 && f.FailNext.Add(-1) >= 0 {
		writeJSON(w, 500, map[string]any{"detail": "fake engine failure"})
		return
	}
	// SGLang loads a Hugging Face model directory; without its config the
	// update fails and the old weights keep serving.
	if _, err := os.Stat(filepath.Join(path, "config.json")); err != nil {
		writeJSON(w, 400, map[string]any{"success": false, "num_paused_requests": 0,
			"message": fmt.Sprintf("Failed to get weights iterator: %s is not a model directory.", path)})
		return
	}
	f.swap.Lock()
	time.Sleep(f.LoadLatency)
	f.mu.Lock()
	f.path, f.version = path, version
	f.mu.Unlock()
	f.swap.Unlock()
	writeJSON(w, 200, map[string]any{"success": true, "message": "Succeeded to update model weights.", "num_paused_requests": 0})
}
