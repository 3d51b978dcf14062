// Package weightsync puts a trained version's weights into the engine
// that serves its deployment, through each engine's documented HTTP API:
//
//   - vLLM's dynamic LoRA (VLLMLoRA): POST /v1/load_lora_adapter
//     {"lora_name", "lora_path"} and /v1/unload_lora_adapter {"lora_name"}.
//     Each version is an adapter named by its version id (<deployment>@vN),
//     so the candidate and the serving version answer side by side and a
//     request picks one by its model name.
//   - SGLang's full weights (SGLangDisk): POST /update_weights_from_disk
//     {"model_path", "weight_version"}. The engine holds one set of
//     weights, replaced in place.
//
// Sync reconciles an engine with the versions that should be there, so a
// retry, a restarted engine or a lost answer all end in the same state. It
// knows nothing of releases or Postgres.
package weightsync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
)

// Engine is one serving engine's weight endpoints.
type Engine interface {
	// Loaded lists what the engine holds: version name → checkpoint path.
	Loaded(ctx context.Context) (map[string]string, error)
	// Load makes the checkpoint at path serve as name.
	Load(ctx context.Context, name, path string) error
	// Unload releases name (an in-place engine keeps its one set).
	Unload(ctx context.Context, name string) error
	// ByName: see deployment.WeightSync.ByName.
	ByName() bool
}

// Error is an engine's refusal or failure.
type Error struct {
	// Status is the engine's HTTP status (0: no answer).
	Status int
	Op     string
	// Message is the engine's own message.
	Message string
	// Temporary failures (5xx, no answer, a timeout) are worth a retry;
	// a refusal (4xx) is not.
	Temporary bool
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("weight sync: %s: %s", e.Op, e.Message)
	}
	return fmt.Sprintf("weight sync: %s: engine answered %d: %s", e.Op, e.Status, e.Message)
}

// Temporary reports whether err is worth another attempt.
func Temporary(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Temporary
}

// New builds the engine client for settings s of a deployment whose
// OpenAI-compatible base URL is baseURL.
func New(s deployment.WeightSync, baseURL, apiKey string, client *http.Client) (Engine, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	root := strings.TrimRight(s.URL, "/")
	if root == "" {
		root = strings.TrimRight(baseURL, "/")
		if s.Kind == deployment.WeightSyncSGLangDisk {
			root = strings.TrimSuffix(root, "/v1")
		}
	}
	timeout := 2 * time.Minute
	if s.Kind == deployment.WeightSyncSGLangDisk {
		timeout = 10 * time.Minute
	}
	if d, err := time.ParseDuration(s.Timeout); err == nil && d > 0 {
		timeout = d
	}
	if client == nil {
		client = &http.Client{}
	}
	c := caller{root: root, key: apiKey, client: client, timeout: timeout}
	if s.Kind == deployment.WeightSyncSGLangDisk {
		return &SGLangDisk{c: c}, nil
	}
	return &VLLMLoRA{c: c}, nil
}

// caller sends one JSON request to an engine.
type caller struct {
	root    string
	key     string
	client  *http.Client
	timeout time.Duration
}

// do sends body (nil: a GET) to path and returns the answer's status and
// body; no answer at all is a temporary *Error.
func (c caller) do(ctx context.Context, op, path string, body any) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		method, rd = http.MethodPost, bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.root+path, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("weight sync: %s: %w", op, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		msg := "engine unreachable: " + err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			msg = fmt.Sprintf("no answer within %s", c.timeout)
		}
		return 0, nil, &Error{Op: op, Message: msg, Temporary: true}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, &Error{Op: op, Status: resp.StatusCode, Message: "answer cut off: " + err.Error(), Temporary: true}
	}
	return resp.StatusCode, raw, nil
}

// engineMessage is the message of an engine's error body: vLLM's
// {"error": {"message"}}, SGLang's {"message"}, FastAPI's {"detail"}.
func engineMessage(raw []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
		Detail  any    `json:"detail"`
	}
	if json.Unmarshal(raw, &e) == nil {
		switch {
		case e.Error.Message != "":
			return e.Error.Message
		case e.Message != "":
			return e.Message
		case e.Detail != nil:
			return fmt.Sprint(e.Detail)
		}
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func failure(op string, status int, raw []byte) *Error {
	return &Error{Op: op, Status: status, Message: engineMessage(raw), Temporary: status >= 500 || status == http.StatusTooManyRequests}
}

// VLLMLoRA is vLLM's dynamic LoRA API (the server runs with
// --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
type VLLMLoRA struct{ c caller }

// ByName implements Engine: each adapter answers under its name.
func (*VLLMLoRA) ByName() bool { return true }

// Loaded lists the adapters of GET /v1/models: the cards with a parent,
// whose root is the adapter's path.
func (v *VLLMLoRA) Loaded(ctx context.Context) (map[string]string, error) {
	status, raw, err := v.c.do(ctx, "list adapters", "/models", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, failure("list adapters", status, raw)
	}
	var list struct {
		Data []struct {
			ID     string  `json:"id"`
			Root   string  `json:"root"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, &Error{Op: "list adapters", Status: status, Message: "not a model list: " + err.Error()}
	}
	out := map[string]string{}
	for _, m := range list.Data {
		if m.Parent != nil && *m.Parent != "" {
			out[m.ID] = m.Root
		}
	}
	return out, nil
}

// Load implements Engine. vLLM refuses a name already loaded (400); when
// that name is loaded from the same path (an earlier attempt whose answer
// was lost) the load has happened, and Load says so.
func (v *VLLMLoRA) Load(ctx context.Context, name, path string) error {
	const op = "load adapter"
	status, raw, err := v.c.do(ctx, op, "/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": path})
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusOK:
		return nil
	case status == http.StatusNotFound && isRouteMissing(raw):
		return runtimeLoRAOff(op, status, "/v1/load_lora_adapter")
	case status == http.StatusBadRequest && strings.Contains(engineMessage(raw), "already been loaded"):
		loaded, lerr := v.Loaded(ctx)
		if lerr != nil {
			return lerr
		}
		if p, ok := loaded[name]; ok && p == path {
			return nil
		}
		return &Error{Op: op, Status: status, Message: fmt.Sprintf("adapter %s is loaded from %q, not %q", name, loaded[name], path)}
	}
	return failure(op, status, raw)
}

// Unload implements Engine; an adapter the engine does not have (404) is
// already unloaded.
func (v *VLLMLoRA) Unload(ctx context.Context, name string) error {
	const op = "unload adapter"
	status, raw, err := v.c.do(ctx, op, "/unload_lora_adapter", map[string]string{"lora_name": name})
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusOK:
		return nil
	case status == http.StatusNotFound && isRouteMissing(raw):
		return runtimeLoRAOff(op, status, "/v1/unload_lora_adapter")
	case status == http.StatusNotFound:
		return nil
	}
	return failure(op, status, raw)
}

// runtimeLoRAOff is the error for a vLLM without route (its runtime LoRA
// updating is off).
func runtimeLoRAOff(op string, status int, route string) *Error {
	return &Error{Op: op, Status: status, Message: "the server has no " + route + ": start vLLM with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"}
}

// isRouteMissing tells FastAPI's 404 for a route it does not have
// ({"detail": "Not Found"}) from vLLM's own NotFoundError.
func isRouteMissing(raw []byte) bool {
	var e struct {
		Detail string `json:"detail"`
	}
	return json.Unmarshal(raw, &e) == nil && e.Detail == "Not Found"
}

// SGLangDisk is SGLang's in-place weight update from disk.
type SGLangDisk struct{ c caller }

// ByName implements Engine: the one set of weights answers every name.
func (*SGLangDisk) ByName() bool { return false }

// Loaded reads GET /model_info: the weight version and its model path.
func (s *SGLangDisk) Loaded(ctx context.Context) (map[string]string, error) {
	const op = "model info"
	status, raw, err := s.c.do(ctx, op, "/model_info", nil)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, failure(op, status, raw)
	}
	var info struct {
		ModelPath     string `json:"model_path"`
		WeightVersion string `json:"weight_version"`
	}
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, &Error{Op: op, Status: status, Message: "not model info: " + err.Error()}
	}
	if info.WeightVersion == "" {
		return map[string]string{}, nil
	}
	return map[string]string{info.WeightVersion: info.ModelPath}, nil
}

// Load implements Engine: the engine's weights become path's, versioned
// name. SGLang answers 400 {"success": false, "message"} when it cannot,
// and keeps the old weights.
func (s *SGLangDisk) Load(ctx context.Context, name, path string) error {
	const op = "update weights from disk"
	status, raw, err := s.c.do(ctx, op, "/update_weights_from_disk", map[string]any{"model_path": path, "weight_version": name})
	if err != nil {
		return err
	}
	if status == http.StatusOK {
		var out struct {
			Success bool   `json:"success"`
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &out) == nil && out.Success {
			return nil
		}
		return &Error{Op: op, Status: status, Message: "the engine did not say success: " + engineMessage(raw)}
	}
	return failure(op, status, raw)
}

// Unload implements Engine: full weights are replaced, never unloaded.
func (*SGLangDisk) Unload(context.Context, string) error { return nil }

// Report is what one Sync did.
type Report struct {
	Loaded   []string `json:"loaded,omitempty"`
	Unloaded []string `json:"unloaded,omitempty"`
	// Kept are the wanted versions the engine already held.
	Kept []string `json:"kept,omitempty"`
}

// Sync makes the engine hold want (version name → checkpoint path):
//   - a by-name engine loads each wanted version it lacks and, when
//     unload is set, unloads the versions named prefix+… it holds but
//     nobody wants (other adapters on the same server are not ours);
//   - an in-place engine loads serving, the one version it serves, unless
//     it already holds it.
//
// Loads come before unloads, so what is routed is always there.
func Sync(ctx context.Context, e Engine, prefix string, want map[string]string, serving string, unload bool) (Report, error) {
	var rep Report
	loaded, err := e.Loaded(ctx)
	if err != nil {
		return rep, err
	}
	if !e.ByName() {
		path, ok := want[serving]
		if serving == "" || !ok {
			return rep, nil // the base weights, or nothing trained to put there
		}
		if p, held := loaded[serving]; held && p == path {
			rep.Kept = append(rep.Kept, serving)
			return rep, nil
		}
		if err := e.Load(ctx, serving, path); err != nil {
			return rep, err
		}
		rep.Loaded = append(rep.Loaded, serving)
		return rep, nil
	}
	for _, name := range sortedKeys(want) {
		if p, held := loaded[name]; held && p == want[name] {
			rep.Kept = append(rep.Kept, name)
			continue
		} else if held {
			// Another path under the same name: the engine must drop it
			// before it can load the one wanted.
			if err := e.Unload(ctx, name); err != nil {
				return rep, err
			}
		}
		if err := e.Load(ctx, name, want[name]); err != nil {
			return rep, err
		}
		rep.Loaded = append(rep.Loaded, name)
	}
	if !unload {
		return rep, nil
	}
	for _, name := range sortedKeys(loaded) {
		if _, ok := want[name]; ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		if err := e.Unload(ctx, name); err != nil {
			return rep, err
		}
		rep.Unloaded = append(rep.Unloaded, name)
	}
	return rep, nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
