package tinkerserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// maxGone bounds how many unloaded or evicted model ids are remembered for
// a clearer 404.
const maxGone = 10000

// model is one trainable model and its request queue.
type model struct {
	id, base string
	lora     trainer.LoRAConfig
	jobs     chan job
	// learner and unloaded belong to the worker goroutine; learner is
	// nil until a request needs it (see trainee).
	learner  *trainer.Learner
	unloaded bool
	// Guarded by Server.mu.
	pending  int // queued or running
	requests int // requests after create_model (load_weights must be first)
	lastUsed time.Time
}

// job is one request run on its model's worker.
type job struct {
	fut *future
	run func(ctx context.Context, m *model) (any, error)
	// release, when set, runs after the job whether or not it ran (a
	// checkpoint name it reserved).
	release func()
}

// work runs m's requests in order until its queue closes.
func (s *Server) work(m *model) {
	defer s.workers.Done()
	for j := range m.jobs {
		var res any
		var err error
		switch {
		case s.ctx.Err() != nil:
			err = errors.New("the server is shutting down")
		case m.unloaded:
			err = fmt.Errorf("%w: model %s was unloaded before this request ran", errClient, m.id)
		default:
			res, err = j.run(s.ctx, m)
		}
		if err != nil {
			level := slogLevel(err)
			s.cfg.Logger.Log(s.ctx, level, msgRequestFailed, "model", m.id, "request", j.fut.kind, "request_id", j.fut.id, "err", err)
		}
		if j.release != nil {
			j.release()
		}
		j.fut.finish(res, err)
		s.mu.Lock()
		m.pending--
		m.lastUsed = time.Now()
		s.mu.Unlock()
	}
}

// submit queues run on the model's worker as a new future, or returns the
// future that a retry with the same seq_id already has; data is the
// request as deduplication compares it. admit, when set, may refuse the
// request (under the registry lock) with a status and a detail; release
// undoes what admit reserved, once the job is done or when it is not queued
// after all.
// When it refuses, submit answers the HTTP request itself and returns nil.
func (s *Server) submit(c *gin.Context, modelID string, seq *int64, kind string, data any,
	admit func(m *model) (int, string), release func(), run func(ctx context.Context, m *model) (any, error)) *future {
	body, err := tinker.Marshal(data)
	if err != nil {
		abort(c, http.StatusInternalServerError, "encode request: "+err.Error())
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[modelID]
	if m == nil {
		s.modelNotFound(c, modelID)
		return nil
	}
	old, err := s.futures.lookupSeq(modelID, seq, kind, body)
	if err != nil {
		abort(c, http.StatusConflict, err.Error())
		return nil
	}
	if old != nil {
		return old
	}
	if admit != nil {
		if status, detail := admit(m); status != 0 {
			abort(c, status, detail)
			return nil
		}
	}
	f := &future{id: s.newID(), model: modelID, kind: kind, data: body, done: make(chan struct{})}
	select {
	case m.jobs <- job{fut: f, run: run, release: release}:
	default:
		if release != nil {
			release()
		}
		abort(c, http.StatusTooManyRequests, fmt.Sprintf("model %s has %d requests waiting", modelID, cap(m.jobs)))
		return nil
	}
	m.pending++
	m.requests++
	m.lastUsed = time.Now()
	s.futures.add(f, seq)
	return f
}

// trainee is m's learner, made from its base model by the first request
// that trains or saves it: a model whose first request is load_weights
// (a train step from a saved state) never makes the fresh one it would
// replace. Run on m's worker only.
func (s *Server) trainee(m *model) (*trainer.Learner, error) {
	if m.learner == nil {
		l, err := trainer.NewLearner(s.cfg.BaseModels[m.base], m.lora)
		if err != nil {
			return nil, err
		}
		m.learner = l
	}
	return m.learner, nil
}

// modelNotFound is SkyRL's 404, with the reason when the model was loaded
// once.
func (s *Server) modelNotFound(c *gin.Context, id string) {
	if why, ok := s.gone[id]; ok {
		abort(c, http.StatusNotFound, fmt.Sprintf("Model not found: %s was %s; its saved states remain, load one into a new model", id, why))
		return
	}
	abort(c, http.StatusNotFound, "Model not found")
}

// forgetLocked removes m from the registry and stops its worker once the
// queue is drained.
func (s *Server) forgetLocked(m *model, why string) {
	if s.models[m.id] != m {
		return
	}
	delete(s.models, m.id)
	if len(s.gone) >= maxGone {
		clear(s.gone)
	}
	s.gone[m.id] = why
	close(m.jobs)
}

// evictLocked makes room for one more model by forgetting the least
// recently used idle one; false when every model is busy.
func (s *Server) evictLocked() bool {
	if len(s.models) < s.cfg.MaxModels {
		return true
	}
	var lru *model
	for _, m := range s.models {
		if m.pending == 0 && (lru == nil || m.lastUsed.Before(lru.lastUsed)) {
			lru = m
		}
	}
	if lru == nil {
		return false
	}
	s.forgetLocked(lru, "evicted while idle")
	s.cfg.Logger.Info(msgModelEvicted, "model", lru.id, "idle", time.Since(lru.lastUsed))
	return true
}

func (s *Server) capabilities(c *gin.Context) {
	var caps tinker.Capabilities
	names := make([]string, 0, len(s.cfg.BaseModels))
	for n := range s.cfg.BaseModels {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		caps.SupportedModels = append(caps.SupportedModels, struct {
			ModelName string `json:"model_name"`
		}{n})
	}
	c.JSON(http.StatusOK, caps)
}

func (s *Server) createSession(c *gin.Context) {
	var req tinker.CreateSessionRequest
	if !decode(c, &req, nil) {
		return
	}
	id := "session_" + randomHex()
	s.mu.Lock()
	s.sessions[id] = true
	s.mu.Unlock()
	c.JSON(http.StatusOK, tinker.CreateSessionResponse{Type: "create_session", SessionID: id})
}

func (s *Server) heartbeat(c *gin.Context) {
	var req struct {
		SessionID string `json:"session_id"`
	}
	if !decode(c, &req, func(ch *checker) { ch.required(req.SessionID, "session_id") }) {
		return
	}
	s.mu.Lock()
	ok := s.sessions[req.SessionID]
	s.mu.Unlock()
	if !ok {
		abort(c, http.StatusNotFound, "Session not found")
		return
	}
	c.JSON(http.StatusOK, gin.H{"type": "session_heartbeat"})
}

// createModelOutput is create_model's result, SkyRL's CreateModelOutput.
type createModelOutput struct {
	ModelID    string         `json:"model_id"`
	BaseModel  string         `json:"base_model"`
	LoraConfig resolvedConfig `json:"lora_config"`
}

// resolvedConfig is the adapter configuration a model got, defaults
// filled, as SkyRL's types.LoraConfig.
type resolvedConfig struct {
	Rank         int     `json:"rank"`
	Alpha        float64 `json:"alpha"`
	Seed         int64   `json:"seed"`
	TrainAttn    bool    `json:"train_attn"`
	TrainMLP     bool    `json:"train_mlp"`
	TrainUnembed bool    `json:"train_unembed"`
}

func (s *Server) createModel(c *gin.Context) {
	var req tinker.CreateModelRequest
	if !decode(c, &req, func(ch *checker) {
		ch.required(req.SessionID, "session_id")
		ch.required(req.BaseModel, "base_model")
	}) {
		return
	}
	base := s.cfg.BaseModels[req.BaseModel]
	if base == nil {
		abort(c, http.StatusBadRequest, fmt.Sprintf("base model %q is not served here (get_server_capabilities lists them)", req.BaseModel))
		return
	}
	lc := req.LoraConfig
	if maxRank := min(s.cfg.MaxLoRARank, base.Config.DModel); lc.Rank < 0 || lc.Rank > maxRank {
		abort(c, http.StatusBadRequest, fmt.Sprintf("LoRA rank %d must be between 1 and %d, or 0 for full weights", lc.Rank, maxRank))
		return
	}
	seed := mrand.Int64N(math.MaxInt32) // SkyRL draws from [0, 2^31)
	if lc.Seed != nil {
		seed = *lc.Seed
	}
	flag := func(v *bool, def bool) bool {
		if v == nil {
			return def
		}
		return *v
	}
	rc := resolvedConfig{Rank: lc.Rank, Alpha: trainer.DefaultLoRAAlpha, Seed: seed,
		TrainAttn: flag(lc.TrainAttn, true), TrainMLP: flag(lc.TrainMLP, true), TrainUnembed: flag(lc.TrainUnembed, false)}
	if rc.Rank > 0 && !rc.TrainAttn && !rc.TrainMLP && !rc.TrainUnembed {
		abort(c, http.StatusBadRequest, "lora_config trains no layer: set train_attn, train_mlp or train_unembed")
		return
	}
	lora := trainer.LoRAConfig{Rank: rc.Rank, Alpha: rc.Alpha, Seed: uint64(seed), Attn: rc.TrainAttn, MLP: rc.TrainMLP, Unembed: rc.TrainUnembed}
	if err := lora.Validate(base.Config); err != nil {
		abort(c, http.StatusBadRequest, err.Error())
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		abort(c, http.StatusServiceUnavailable, "the server is shutting down")
		return
	case !s.sessions[req.SessionID]:
		abort(c, http.StatusNotFound, "Session not found")
		return
	case !s.evictLocked():
		abort(c, http.StatusTooManyRequests, fmt.Sprintf("all %d models are busy; try again when one is idle or unloaded", s.cfg.MaxModels))
		return
	}
	id := s.newModelID()
	m := &model{id: id, base: req.BaseModel, lora: lora, jobs: make(chan job, s.cfg.MaxQueue), lastUsed: time.Now()}
	s.models[id] = m
	s.workers.Add(1)
	go s.work(m)
	f := &future{id: s.newID(), model: id, kind: reqCreateModel, done: make(chan struct{})}
	f.finish(createModelOutput{ModelID: id, BaseModel: req.BaseModel, LoraConfig: rc}, nil)
	s.futures.add(f, nil)
	s.cfg.Logger.Info(msgModelCreated, "model", id, "base_model", req.BaseModel, "rank", rc.Rank)
	c.JSON(http.StatusOK, tinker.CreateModelResponse{ModelID: id, BaseModel: req.BaseModel, LoraConfig: &req.LoraConfig, Status: "created", RequestID: f.id})
}

// newModelID draws an id that no loaded, forgotten or saved model has.
func (s *Server) newModelID() string {
	for {
		id := "model_" + randomHex()
		_, gone := s.gone[id]
		if s.models[id] == nil && !gone && !s.store.hasModel(id) {
			return id
		}
	}
}

func (s *Server) unloadModel(c *gin.Context) {
	var req tinker.UnloadModelRequest
	if !decode(c, &req, func(ch *checker) { ch.required(req.ModelID, "model_id") }) {
		return
	}
	f := s.submit(c, req.ModelID, nil, reqUnloadModel, struct{}{}, nil, nil, func(_ context.Context, m *model) (any, error) {
		s.mu.Lock()
		s.forgetLocked(m, "unloaded")
		s.mu.Unlock()
		m.unloaded, m.learner = true, nil
		s.cfg.Logger.Info(msgModelUnloaded, "model", m.id)
		return gin.H{"model_id": m.id, "status": "unloaded", "type": "unload_model"}, nil
	})
	if f != nil {
		c.JSON(http.StatusOK, tinker.UnloadModelResponse{RequestID: f.id, ModelID: req.ModelID})
	}
}

func randomHex() string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b[:])
}
