package fakevllm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"time"
)

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

// AdapterCalls are the load and unload requests received, in order.
func (f *Fixture) AdapterCalls() []AdapterCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]AdapterCall(nil), f.adapterCalls...)
}

// Adapters are the loaded adapters: name → path.
func (f *Fixture) Adapters() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]string, len(f.adapters))
	for k, v := range f.adapters {
		out[k] = v
	}
	return out
}

// vllmError is vLLM's ErrorResponse body.
func vllmError(msg, typ string, code int) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
}

// models is GET /v1/models: the base model, then each loaded adapter as a
// card whose root is its path and whose parent is the base, as vLLM lists
// them.
func (f *Fixture) models(w http.ResponseWriter) {
	data := []any{map[string]any{"id": f.model(), "object": "model", "root": f.model()}}
	adapters := f.Adapters()
	names := make([]string, 0, len(adapters))
	for n := range adapters {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		data = append(data, map[string]any{"id": n, "object": "model", "root": adapters[n], "parent": f.model()})
	}
	writeJSON(w, 200, map[string]any{"object": "list", "data": data})
}

// lora serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter with
// vLLM's answers: 200 and a plain-text success line; 400 InvalidUserInput
// for a missing field or a name already loaded; 404 NotFoundError for an
// adapter path without adapter_config.json or an unknown name on unload;
// 500 when the engine fails (FailLoRA).
func (f *Fixture) lora(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	status, answer := f.loraAnswer(r.URL.Path, body)
	f.mu.Lock()
	f.adapterCalls = append(f.adapterCalls, AdapterCall{Path: r.URL.Path, Body: body, Status: status, At: time.Now()})
	f.mu.Unlock()
	if s, ok := answer.(string); ok {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, s)
		return
	}
	writeJSON(w, status, answer)
}

func (f *Fixture) loraAnswer(path string, body map[string]any) (int, any) {
	if body == nil {
		return 400, vllmError("the body must be a JSON object", "InvalidUserInput", 400)
	}
	name, _ := body["lora_name"].(string)
	if f.FailLoRA.Load() > 0 && f.FailLoRA.Add(-1) >= 0 {
		return 500, vllmError("fake engine failure", "InternalServerError", 500)
	}
	if path == "/v1/unload_lora_adapter" {
		if name == "" {
			return 400, vllmError("'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput", 400)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.adapters[name]; !ok {
			return 404, vllmError(fmt.Sprintf("The lora adapter '%s' cannot be found.", name), "NotFoundError", 404)
		}
		delete(f.adapters, name)
		return 200, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", name)
	}
	lpath, _ := body["lora_path"].(string)
	if name == "" || lpath == "" {
		return 400, vllmError("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400)
	}
	f.mu.Lock()
	_, loaded := f.adapters[name]
	f.mu.Unlock()
	if loaded {
		return 400, vllmError(fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", name), "InvalidUserInput", 400)
	}
	// vLLM reads the PEFT adapter from the path; a path without its
	// config is LoRAAdapterNotFoundError.
	if _, err := os.Stat(filepath.Join(lpath, "adapter_config.json")); err != nil {
		return 404, vllmError(fmt.Sprintf("Loading lora %s failed: No adapter found for %s", name, lpath), "NotFoundError", 404)
	}
	time.Sleep(f.LoRALatency)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.adapters == nil {
		f.adapters = map[string]string{}
	}
	f.adapters[name] = lpath
	return 200, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", name)
}
