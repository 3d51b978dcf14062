// Package fakesglang is a FAKE of an SGLang server, not a model server:
// it implements the part of SGLang's HTTP contract that weight sync uses,
// as SGLang's http_server documents it, where a real SGLang would need a
// GPU and a model:
//
//   - POST /update_weights_from_disk {"model_path", "weight_version", …}
//     answers 200 {"success": true, "message", "num_paused_requests"} or
//     400 {"success": false, "message"}; requests that arrive during the
//     update wait for it, as SGLang pauses them, and none fails;
//   - GET /model_info answers {"model_path", "weight_version", …};
//   - everything else (/v1/chat/completions, /v1/models) is the vLLM-dialect
//     fake's, which speaks the same OpenAI protocol.
package fakesglang

import (
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
		f.swap.RLock()
		defer f.swap.RUnlock()
		f.Chat.ServeHTTP(w, r)
	}
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
