// Package modelserver is Flywheel's own model server: it serves an Engine
// over vLLM's OpenAI-compatible HTTP dialect. Its engine in production is
// the small in-process policy (trainer.Engine; New), so the gateway's
// upstream backend, its release gates and its weight sync reach the
// embedded policy exactly as they reach a vLLM deployment with dynamic
// LoRA. The tests' vLLM fake (internal/fakevllm) is this same server over
// a scripted engine (NewWithEngine). It answers /v1/chat/completions (with
// vLLM's token-id and logprob extensions, streamed or not), /tokenize,
// /v1/models, /health, and /v1/load_lora_adapter and
// /v1/unload_lora_adapter, where each trained version is an "adapter"
// named <name>@vN whose checkpoint is a whole policy.
//
// It owns only that HTTP surface and the registry of loaded adapters. It
// must not know about Postgres, Temporal or the gateway, and it never
// trains: weights reach it only as checkpoint paths.
package modelserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/trainer"
)

// Limits.
const (
	// maxRequestBytes bounds a request body; a longer one is 413.
	maxRequestBytes = 16 << 20
	// maxNameBytes bounds the served model name.
	maxNameBytes = 200
	// ownedBy is what vLLM reports as every card's owner.
	ownedBy = "vllm"
)

// Defaults.
const (
	defaultMaxTokens  = 64 // as trainer.EngineConfig
	defaultKeepLoaded = 8  // as vLLM's max_cpu_loras
)

// Log messages are constants; everything dynamic is an attribute.
const (
	msgGenerationFailed = "model server generation failed"
	msgAdapterLoaded    = "model server adapter loaded"
	msgAdapterUnloaded  = "model server adapter unloaded"
	msgAdapterRestored  = "model server adapter restored"
	msgRestoreSkipped   = "model server adapter not restored"
)

// Config configures a Server.
type Config struct {
	// Name is the served model name (vLLM's --served-model-name) and the
	// prefix of adapter names: an adapter is "<Name>@v<N>", N the
	// checkpoint's version. Required; it must not contain "@" or spaces.
	Name string
	// BasePath is the base checkpoint's path, reported as the base card's
	// root in /v1/models. Default: Name.
	BasePath string
	// StateFile, when set, keeps the loaded adapters (name → path) as
	// JSON, rewritten atomically on each load/unload and reloaded by New,
	// so a restarted server serves what it served (vLLM loses runtime
	// adapters on restart; ours need not). Its directory is created.
	// Default: none.
	StateFile string
	// DefaultMaxTokens applies to a request with none. Default 64.
	DefaultMaxTokens int
	// KeepLoaded bounds adapters held in memory at once (an LRU, like
	// vLLM's max_cpu_loras); evicted ones reload from their path on
	// demand. Registration is unbounded. Default 8.
	KeepLoaded int
	// BaseOnly serves the base alone, as vLLM without
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING: the adapter endpoints answer 404,
	// and a request naming any model is answered by the base (vLLM would
	// refuse a name it does not serve; a test fake stands behind
	// deployments of any name). Default: false.
	BaseOnly bool
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.BasePath == "" {
		c.BasePath = c.Name
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = defaultMaxTokens
	}
	if c.KeepLoaded == 0 {
		c.KeepLoaded = defaultKeepLoaded
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Name == "" || len(c.Name) > maxNameBytes || strings.Contains(c.Name, "@") ||
		strings.ContainsFunc(c.Name, func(r rune) bool { return r <= ' ' }) {
		errs = append(errs, fmt.Errorf("name %q: want 1 to %d printable characters without spaces or @", c.Name, maxNameBytes))
	}
	if c.DefaultMaxTokens < 1 {
		errs = append(errs, fmt.Errorf("default max tokens %d: want a positive number", c.DefaultMaxTokens))
	}
	if c.KeepLoaded < 1 {
		errs = append(errs, fmt.Errorf("keep loaded %d: want a positive number", c.KeepLoaded))
	}
	return errors.Join(errs...)
}

// adapter is one registered adapter.
type adapter struct {
	path string
	// created is when it was loaded (its card's created).
	created int64
	// maxLen is its weights' context.
	maxLen int
}

// Server serves one base model and its adapters. It is an http.Handler.
type Server struct {
	cfg     Config
	engine  Engine
	mux     *http.ServeMux
	maxLen  int   // the base's context
	created int64 // when the base was served

	// mu guards the registry. Nothing calls the engine while holding it
	// but Loaded, which must not call back.
	mu       sync.RWMutex
	adapters map[string]adapter
}

// New serves the policy base (version baseVersion) under cfg.Name; each
// adapter is a whole checkpoint of the policy, named <Name>@v<N>.
func New(base *trainer.Model, baseVersion int64, cfg Config) (*Server, error) {
	if base == nil {
		return nil, errors.New("model server: nil base model")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("model server config: %w", err)
	}
	p, err := newPolicy(base, baseVersion, cfg)
	if err != nil {
		return nil, fmt.Errorf("model server: %w", err)
	}
	return NewWithEngine(p, cfg)
}

// NewWithEngine serves engine under cfg.Name.
func NewWithEngine(engine Engine, cfg Config) (*Server, error) {
	if engine == nil {
		return nil, errors.New("model server: nil engine")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("model server config: %w", err)
	}
	s := &Server{cfg: cfg, engine: engine, maxLen: engine.MaxLen(), created: time.Now().Unix(), adapters: map[string]adapter{}}
	if cfg.StateFile != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.StateFile), 0o755); err != nil {
			return nil, fmt.Errorf("model server: state file directory: %w", err)
		}
	}
	if err := s.restore(); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	s.mux = http.NewServeMux()
	s.mux.Handle("/health", only(http.MethodGet, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	s.mux.Handle("/v1/models", only(http.MethodGet, s.handleModels))
	s.mux.Handle("/v1/chat/completions", only(http.MethodPost, s.handleChat))
	s.mux.Handle("/tokenize", only(http.MethodPost, s.handleTokenize))
	s.mux.Handle("/v1/tokenize", only(http.MethodPost, s.handleTokenize))
	if !s.cfg.BaseOnly {
		s.mux.Handle("/v1/load_lora_adapter", only(http.MethodPost, s.handleLoad))
		s.mux.Handle("/v1/unload_lora_adapter", only(http.MethodPost, s.handleUnload))
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		// FastAPI's answer to a route it does not have.
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
}

// only answers other methods as FastAPI does.
func only(method string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
			return
		}
		h(w, r)
	})
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// resolve maps a request's model name to the engine's version name ("":
// the base) and that model's context. A name that is neither the base nor
// a registered adapter is not served, even while the engine still holds
// its weights.
func (s *Server) resolve(model string) (version string, maxLen int, ok bool) {
	if model == "" || model == s.cfg.Name || s.cfg.BaseOnly {
		return "", s.maxLen, true // vLLM answers a request without a model with the base
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	a, ok := s.adapters[model]
	return model, a.maxLen, ok
}

// served is the name an answer reports: the adapter's, or the base's.
func (s *Server) served(version string) string {
	if version == "" {
		return s.cfg.Name
	}
	return version
}

func modelNotFound(w http.ResponseWriter, model string) {
	writeError(w, http.StatusNotFound, errNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
}

// modelCard is one entry of /v1/models, as vLLM lists it.
type modelCard struct {
	ID          string     `json:"id"`
	Object      string     `json:"object"`
	Created     int64      `json:"created"`
	OwnedBy     string     `json:"owned_by"`
	Root        string     `json:"root"`
	Parent      *string    `json:"parent"`
	MaxModelLen int        `json:"max_model_len"`
	Permission  []struct{} `json:"permission"`
}

// handleModels is GET /v1/models: the base, then each adapter (sorted by
// name) with the base as its parent and its path as its root.
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	cards := []modelCard{{ID: s.cfg.Name, Object: "model", Created: s.created, OwnedBy: ownedBy, Root: s.cfg.BasePath,
		MaxModelLen: s.maxLen, Permission: []struct{}{}}}
	s.mu.RLock()
	for _, name := range slices.Sorted(maps.Keys(s.adapters)) {
		a, parent := s.adapters[name], s.cfg.Name
		cards = append(cards, modelCard{ID: name, Object: "model", Created: a.created, OwnedBy: ownedBy, Root: a.path,
			Parent: &parent, MaxModelLen: a.maxLen, Permission: []struct{}{}})
	}
	s.mu.RUnlock()
	writeJSON(w, http.StatusOK, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", cards})
}

// vLLM's error types.
const (
	errBadRequest   = "BadRequestError"
	errNotFound     = "NotFoundError"
	errInternal     = "InternalServerError"
	errInvalidInput = "InvalidUserInput"
)

// errorType is the type vLLM names a status by.
func errorType(status int) string {
	switch {
	case status == http.StatusNotFound:
		return errNotFound
	case status >= 500:
		return errInternal
	}
	return errBadRequest
}

// writeError answers vLLM's error JSON.
func writeError(w http.ResponseWriter, status int, typ, message string) {
	writeJSON(w, status, errorBody{Object: "error", Message: message, Type: typ, Code: status})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.Marshal(errorBody{Object: "error", Message: "encode answer: " + err.Error(), Type: errInternal, Code: status})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body) // a client that left cannot be told
}

// readJSON decodes the request body into v. It answers the failure
// itself (413 past maxRequestBytes, else 400 with typ) and reports false.
func readJSON(w http.ResponseWriter, r *http.Request, v any, typ, invalid string) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, typ, "the request body is over "+strconv.Itoa(maxRequestBytes)+" bytes")
		return false
	case err != nil:
		writeError(w, http.StatusBadRequest, typ, "read request body: "+err.Error())
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, typ, invalid+": "+err.Error())
		return false
	}
	return true
}
