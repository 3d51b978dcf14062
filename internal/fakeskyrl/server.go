package fakeskyrl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// The routes, as SkyRL spells them; Server.Requests and Faults.FailNext
// take these names.
const (
	RouteHealthz               = "/api/v1/healthz"
	RouteServerCapabilities    = "/api/v1/get_server_capabilities"
	RouteClientConfig          = "/api/v1/client/config"
	RouteTelemetry             = "/api/v1/telemetry"
	RouteCreateSession         = "/api/v1/create_session"
	RouteSessionHeartbeat      = "/api/v1/session_heartbeat"
	RouteCreateModel           = "/api/v1/create_model"
	RouteUnloadModel           = "/api/v1/unload_model"
	RouteGetInfo               = "/api/v1/get_info"
	RouteForward               = "/api/v1/forward"
	RouteForwardBackward       = "/api/v1/forward_backward"
	RouteOptimStep             = "/api/v1/optim_step"
	RouteSaveWeights           = "/api/v1/save_weights"
	RouteLoadWeights           = "/api/v1/load_weights"
	RouteSaveWeightsForSampler = "/api/v1/save_weights_for_sampler"
	RouteRetrieveFuture        = "/api/v1/retrieve_future"
	RouteCheckpoints           = "/api/v1/training_runs/{model_id}/checkpoints"
	RouteCheckpointArchive     = "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/archive"
	RouteCheckpointDownload    = "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/download"
	RouteCheckpointDelete      = "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_path...}"
)

// Defaults of Config.
const (
	DefaultBaseModel = "Qwen/Qwen3-0.6B"
	DefaultVocab     = 512
	// DefaultRetrieveWait is SkyRL's RETRIEVE_FUTURE_TIMEOUT_SECONDS.
	DefaultRetrieveWait = 300 * time.Second
	// DefaultMaxLoRARank is the JAX backend's max_lora_rank.
	DefaultMaxLoRARank = 32
	// loraAlpha is what create_model gives every adapter.
	loraAlpha = 32.0
)

// Config shapes a fake server; zero values take the defaults.
type Config struct {
	// BaseModel is the engine's base model, the one supported model
	// (default DefaultBaseModel).
	BaseModel string
	// Vocab is the size of the fake model's vocabulary; a token id at or
	// past it fails its request (default DefaultVocab).
	Vocab int
	// RetrieveWait is how long retrieve_future holds a request for a
	// result before answering 408 (default DefaultRetrieveWait).
	RetrieveWait time.Duration
	// MaxLoRARank bounds create_model's rank (default DefaultMaxLoRARank).
	MaxLoRARank int
	// APIKey, when set, is required in every request's X-API-Key header
	// (healthz excepted); others get 401. SkyRL itself checks no key.
	APIKey string
}

func (c Config) withDefaults() Config {
	if c.BaseModel == "" {
		c.BaseModel = DefaultBaseModel
	}
	if c.Vocab <= 0 {
		c.Vocab = DefaultVocab
	}
	if c.RetrieveWait <= 0 {
		c.RetrieveWait = DefaultRetrieveWait
	}
	if c.MaxLoRARank <= 0 {
		c.MaxLoRARank = DefaultMaxLoRARank
	}
	return c
}

// Server is the fake. Its methods and Faults are safe for concurrent use.
type Server struct {
	// Faults injects failures and delays; set them at any time.
	Faults *Faults

	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc

	mu            sync.Mutex
	nextRequestID int64
	sessions      map[string]bool
	models        map[string]*modelRecord
	futures       map[int64]*future
	seqs          map[seqKey]*future
	checkpoints   map[checkpointKey]*checkpoint
	// checkpointOrder lists checkpoints as they were created, the order
	// SkyRL's unordered query returns them in practice.
	checkpointOrder []checkpointKey
	requests        map[string]int
	samplerSaves    map[string]int
}

type modelRecord struct {
	id, sessionID, baseModel string
	loraIn                   loraConfigIn
	lora                     loraConfig
	status                   string
	// priorRequests counts the model's futures other than create_model,
	// which LoadWeights must find at zero.
	priorRequests int
	optimSteps    int
	worker        *worker
}

// New returns a running fake; call Close to stop its engine.
func New(cfg Config) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{
		Faults:       &Faults{},
		cfg:          cfg.withDefaults(),
		ctx:          ctx,
		cancel:       cancel,
		sessions:     map[string]bool{},
		models:       map[string]*modelRecord{},
		futures:      map[int64]*future{},
		seqs:         map[seqKey]*future{},
		checkpoints:  map[checkpointKey]*checkpoint{},
		requests:     map[string]int{},
		samplerSaves: map[string]int{},
	}
}

// Close stops the engine's workers; pending futures stay pending.
func (s *Server) Close() { s.cancel() }

// Handler serves SkyRL's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	handle := func(method, route string, h http.HandlerFunc) {
		mux.Handle(method+" "+route, s.guard(route, h))
	}
	handle("GET", RouteHealthz, s.healthz)
	handle("GET", RouteServerCapabilities, s.serverCapabilities)
	handle("POST", RouteClientConfig, s.clientConfig)
	handle("POST", RouteTelemetry, s.telemetry)
	handle("POST", RouteCreateSession, s.createSession)
	handle("POST", RouteSessionHeartbeat, s.sessionHeartbeat)
	handle("POST", RouteCreateModel, s.createModel)
	handle("POST", RouteUnloadModel, s.unloadModel)
	handle("POST", RouteGetInfo, s.getInfo)
	handle("POST", RouteForward, s.forward)
	handle("POST", RouteForwardBackward, s.forwardBackward)
	handle("POST", RouteOptimStep, s.optimStep)
	handle("POST", RouteSaveWeights, s.saveWeights)
	handle("POST", RouteLoadWeights, s.loadWeights)
	handle("POST", RouteSaveWeightsForSampler, s.saveWeightsForSampler)
	handle("POST", RouteRetrieveFuture, s.retrieveFuture)
	handle("GET", RouteCheckpoints, s.listCheckpoints)
	handle("GET", RouteCheckpointArchive, s.checkpointArchive)
	handle("GET", RouteCheckpointDownload, s.checkpointDownload)
	handle("DELETE", RouteCheckpointDelete, s.deleteCheckpoint)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeDetail(w, http.StatusNotFound, "Not Found")
	})
	return mux
}

// guard counts a request, checks its key and answers an injected fault
// before the route sees it.
func (s *Server) guard(route string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests[route]++
		s.mu.Unlock()
		if s.cfg.APIKey != "" && route != RouteHealthz && r.Header.Get("X-API-Key") != s.cfg.APIKey {
			writeDetail(w, http.StatusUnauthorized, "Invalid or missing API key")
			return
		}
		if f, ok := s.Faults.take(route); ok {
			if f.RetryAfter > 0 {
				w.Header().Set("Retry-After", fmt.Sprint(int((f.RetryAfter+time.Second-1)/time.Second)))
			}
			writeDetail(w, f.Status, "injected fault")
			return
		}
		h(w, r)
	})
}

// Requests is how many requests reached route (one of the Route
// constants), injected failures included.
func (s *Server) Requests(route string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[route]
}

// OptimSteps is how many optimizer steps the engine applied to a model.
func (s *Server) OptimSteps(modelID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.models[modelID]; ok {
		return m.optimSteps
	}
	return 0
}

// SamplerSaves is how many sampler checkpoints named name the engine
// wrote, over all models.
func (s *Server) SamplerSaves(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samplerSaves[name]
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeDetail answers FastAPI's HTTPException body.
func writeDetail(w http.ResponseWriter, status int, detail string) {
	writeJSON(w, status, map[string]string{"detail": detail})
}

func writeValidation(w http.ResponseWriter, errs []fieldError) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": errs})
}

// writeInternal is FastAPI's answer to an unhandled exception.
func writeInternal(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = w.Write([]byte("Internal Server Error"))
}

// newID is SkyRL's f"{prefix}_{uuid4().hex[:8]}".
func newID(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}
