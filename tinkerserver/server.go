// Package tinkerserver serves the embedded trainer over the Tinker training
// API, the HTTP contract of package tinker, answering each route as SkyRL
// tx's skyrl/tinker/api.py does: a request answers a future at once, a
// worker per model runs that model's requests in order on a
// trainer.Learner, and retrieve_future long-polls for the result (408 while
// it is not ready, 404 for an unknown one, 400 {"detail"} for a failed
// one). A body that does not parse or names an unknown loss is 422, as
// FastAPI answers; a datum the learner refuses fails its future with 400.
//
// Training states (save_weights) and sampler archives (a tar.gz of the
// PEFT adapter, or of the full weights for rank 0) live under Config.Dir
// and outlive the process: a restarted server loads a state saved before.
// Models, sessions and futures live in memory only.
//
// Where SkyRL tx and Tinker differ, this server follows Tinker: the
// gradient is that of the summed loss (SkyRL's JAX backend divides each
// datum's loss by its weight sum and averages over datums), and
// forward_backward reports metrics["loss:sum"]. optim_step reports both
// SkyRL's skyrl.ai/grad_norm and skyrl.ai/learning_rate and plain
// grad_norm, learning_rate and step. A seq_id deduplicates every
// model-scoped request that carries one (SkyRL reads it on forward,
// forward_backward and optim_step only), so a retried save is not a 409.
//
// It owns the HTTP surface, the futures and the checkpoint directory; it
// must not know about the control plane, and it never samples.
package tinkerserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/tinker"
	"github.com/flywheel-ai/flywheel/trainer"
)

// Defaults and limits.
const (
	defaultRetrieveWait = 30 * time.Second
	defaultMaxModels    = 8
	defaultMaxLoRARank  = 32 // SkyRL tx's max_lora_rank
	defaultMaxQueue     = 64
	defaultFutureTTL    = time.Hour
	// maxBody bounds a request body; a longer one is 413.
	maxBody = 64 << 20
	// archiveExpiry is how long the archive redirect says its URL holds.
	archiveExpiry = 2 * time.Hour
)

// Log messages are constants; everything dynamic is an attribute.
const (
	msgRequestFailed = "tinker request failed"
	msgModelCreated  = "tinker model created"
	msgModelEvicted  = "tinker model evicted while idle"
	msgModelUnloaded = "tinker model unloaded"
)

// Config configures a Server.
type Config struct {
	// BaseModels are the models it trains, by name, as create_model's
	// base_model names them and get_server_capabilities lists them. They
	// are never written. Required.
	BaseModels map[string]*trainer.Model
	// Dir holds training states and sampler archives:
	// Dir/<model_id>/weights/<name>.safetensors and
	// Dir/<model_id>/sampler_weights/<name>.tar.gz. Created if needed.
	// Required.
	Dir string
	// APIKey, when set, must be every request's X-API-Key header (healthz
	// excepted); anything else is 401. Default: no check.
	APIKey string
	// RetrieveWait bounds how long retrieve_future holds a request for a
	// result that is not ready before answering 408. Default 30s.
	RetrieveWait time.Duration
	// MaxModels bounds the models held in memory. Creating one more evicts
	// the least recently used idle model (its saved states stay on disk);
	// when every model is busy, create_model is 429. Default 8.
	MaxModels int
	// MaxLoRARank bounds create_model's rank (also at most a base's
	// d_model). Default 32, SkyRL tx's.
	MaxLoRARank int
	// MaxQueue bounds the requests waiting per model; one more is 429.
	// Default 64.
	MaxQueue int
	// FutureTTL is how long a finished future can be retrieved. Default 1h.
	FutureTTL time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.RetrieveWait == 0 {
		c.RetrieveWait = defaultRetrieveWait
	}
	if c.MaxModels == 0 {
		c.MaxModels = defaultMaxModels
	}
	if c.MaxLoRARank == 0 {
		c.MaxLoRARank = defaultMaxLoRARank
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = defaultMaxQueue
	}
	if c.FutureTTL == 0 {
		c.FutureTTL = defaultFutureTTL
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if len(c.BaseModels) == 0 {
		errs = append(errs, errors.New("base models: at least one is required"))
	}
	for name, m := range c.BaseModels {
		if m == nil || name == "" {
			errs = append(errs, fmt.Errorf("base model %q: want a name and a model", name))
		}
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("dir: required"))
	}
	if c.RetrieveWait < 0 || c.FutureTTL < 0 {
		errs = append(errs, fmt.Errorf("retrieve wait %v and future ttl %v must be positive", c.RetrieveWait, c.FutureTTL))
	}
	if c.MaxModels < 1 || c.MaxLoRARank < 1 || c.MaxQueue < 1 {
		errs = append(errs, fmt.Errorf("max models %d, max lora rank %d and max queue %d must be positive", c.MaxModels, c.MaxLoRARank, c.MaxQueue))
	}
	return errors.Join(errs...)
}

// Server is the Tinker API over Learners. It is an http.Handler.
type Server struct {
	cfg     Config
	engine  *gin.Engine
	ctx     context.Context // cancelled by Close; every job runs under it
	cancel  context.CancelFunc
	workers sync.WaitGroup
	nextID  atomic.Int64
	futures *futureStore
	store   *checkpointStore

	// mu guards the sessions and the model registry; no learner work
	// happens while it is held.
	mu       sync.Mutex
	sessions map[string]bool
	models   map[string]*model
	gone     map[string]string // model id → why it is no longer loaded
	closed   bool
}

// New serves cfg.BaseModels; Close stops its workers.
func New(cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("tinker server config: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("tinker server: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, ctx: ctx, cancel: cancel, futures: newFutureStore(cfg.FutureTTL),
		store: newCheckpointStore(cfg.Dir), sessions: map[string]bool{}, models: map[string]*model{}, gone: map[string]string{}}
	// Request ids are integers as SkyRL's are; starting from the clock
	// keeps a restarted server from answering an old id with a new future.
	s.nextID.Store(time.Now().UnixMicro())
	s.routes()
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.engine.ServeHTTP(w, r) }

// Close fails the requests still queued, lets running ones see their
// context cancelled, and waits for the workers.
func (s *Server) Close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for id, m := range s.models {
			close(m.jobs)
			delete(s.models, id)
		}
	}
	s.mu.Unlock()
	s.cancel()
	s.workers.Wait()
}

func (s *Server) routes() {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.HandleMethodNotAllowed = true
	e.Use(gin.Recovery())
	e.NoRoute(func(c *gin.Context) { abort(c, http.StatusNotFound, "Not Found") })
	e.NoMethod(func(c *gin.Context) { abort(c, http.StatusMethodNotAllowed, "Method Not Allowed") })
	e.GET(tinker.PathHealthz, func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	api := e.Group("/", s.checkKey)
	api.GET(tinker.PathCapabilities, s.capabilities)
	api.POST(tinker.PathCreateSession, s.createSession)
	api.POST(tinker.PathSessionHeartbeat, s.heartbeat)
	api.POST(tinker.PathCreateModel, s.createModel)
	api.POST(tinker.PathUnloadModel, s.unloadModel)
	api.POST(tinker.PathForward, s.forward)
	api.POST(tinker.PathForwardBackward, s.forwardBackward)
	api.POST(tinker.PathOptimStep, s.optimStep)
	api.POST(tinker.PathSaveWeights, s.saveWeights)
	api.POST(tinker.PathLoadWeights, s.loadWeights)
	api.POST(tinker.PathSaveWeightsForSampler, s.saveWeightsForSampler)
	api.POST(tinker.PathRetrieveFuture, s.retrieveFuture)
	api.GET(tinker.PathTrainingRuns+"/:model/checkpoints", s.listCheckpoints)
	api.GET(tinker.PathTrainingRuns+"/:model/checkpoints/:checkpoint/archive", s.archive)
	api.GET(tinker.PathTrainingRuns+"/:model/checkpoints/:checkpoint/download", s.download)
	api.DELETE(tinker.PathTrainingRuns+"/:model/checkpoints/:checkpoint/:name", s.deleteCheckpoint)
	api.DELETE(tinker.PathTrainingRuns+"/:model/checkpoints/:checkpoint", badCheckpointID)
	s.engine = e
}

// checkKey refuses a request without the configured API key.
func (s *Server) checkKey(c *gin.Context) {
	if s.cfg.APIKey == "" {
		return
	}
	if subtle.ConstantTimeCompare([]byte(c.GetHeader("X-API-Key")), []byte(s.cfg.APIKey)) != 1 {
		abort(c, http.StatusUnauthorized, "Invalid API key")
	}
}

// abort answers FastAPI's error body, {"detail": "..."}.
func abort(c *gin.Context, status int, detail string) {
	c.AbortWithStatusJSON(status, gin.H{"detail": detail})
}

// newID is the next request id.
func (s *Server) newID() string { return fmt.Sprint(s.nextID.Add(1)) }
