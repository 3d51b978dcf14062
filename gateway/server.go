// Package gateway is Flywheel's HTTP API (gin): the OpenAI and Anthropic
// protocol surfaces agents point their base_url at, sessions, rewards,
// feedback, export and admin endpoints, and the capture of every
// interaction into Postgres. It must not run workflows inline or block a
// model call on training: it signals workflows with ids and small summaries.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/gateway/capture"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// Log messages are constants; everything dynamic is an attribute.
const (
	msgListening = "gateway listening"
	msgStopping  = "gateway stopping"
)

// Deps are the gateway's collaborators.
type Deps struct {
	DB     *pgxpool.Pool
	Logger *slog.Logger
	// Notifier delivers session notices; nil: none (the session workflow
	// reconciles from Postgres).
	Notifier Notifier
	// Registry receives the gateway's metrics and is served on /metrics;
	// nil: a registry of its own.
	Registry *prometheus.Registry
	// Forgets starts the workflow that retires model versions trained on
	// forgotten data; nil: `flywheel forget retire ID` does it by hand.
	Forgets ForgetStarter
	// Tokenizers are the tokenizers Flywheel holds, by deployment, so the
	// ids of redacted steps can be rebuilt (trajectory.Rules).
	Tokenizers map[string]trajectory.Tokenizer
	// Now is the clock of the rate limits; nil: time.Now.
	Now func() time.Time
	// TracerProvider makes the model calls' spans; nil: OpenTelemetry's
	// global provider.
	TracerProvider trace.TracerProvider
}

// Server is the HTTP gateway.
type Server struct {
	cfg      config.GatewayConfig
	deps     Deps
	engine   *gin.Engine
	router   *router
	capture  *capture.Committer
	metrics  *metrics
	keys     *keyCache
	requests *requestLimiter
	tokens   *tokenLimiter
	rules    trajectory.Rules
	notifier Notifier
	tails    *tails
	budgets  budgets
	// logins are the status page's logins; loginFailures counts failed
	// ones per client address.
	logins        *statusLogins
	loginFailures *requestLimiter
	closeOnce     sync.Once
}

// New builds the gateway. It fails on settings that cannot serve (a
// default admin key on a non-loopback address, a bad redaction pattern).
func New(cfg config.GatewayConfig, deps Deps) (*Server, error) {
	if err := checkAdminKey(cfg); err != nil {
		return nil, err
	}
	if deps.DB == nil {
		// A 2xx means the interaction is committed: there is no gateway
		// without the database it commits to.
		return nil, errors.New("gateway: a database is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Registry == nil {
		// The process's own figures (goroutines, heap, RSS, open files)
		// beside the gateway's: what a soak or a fault test reads for leaks.
		deps.Registry = prometheus.NewRegistry()
		deps.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	rules, err := trajectory.NewRules(cfg, deps.Tokenizers)
	if err != nil {
		return nil, err
	}
	rt, err := newRouter(cfg, deps.DB, deps.Logger)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = rt.register(ctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("gateway: register the configured upstream models: %w", err)
	}
	m := newMetrics(deps.Registry)
	s := &Server{
		cfg: cfg, deps: deps, router: rt, metrics: m, rules: rules,
		keys:          &keyCache{ttl: cfg.KeyCacheTTL, m: map[string]keyEntry{}},
		requests:      newRequestLimiter(cfg.RateLimitRPS, cfg.RateLimitBurst, max(1, cfg.Replicas)),
		tokens:        newTokenLimiter(max(1, cfg.Replicas)),
		notifier:      deps.Notifier,
		tails:         newTails(defaultTailBytes),
		logins:        &statusLogins{m: map[string]statusLogin{}},
		loginFailures: newRequestLimiter(loginFailureRate, loginFailureBurst, 1),
	}
	if s.notifier == nil {
		s.notifier = nopNotifier{}
	}
	if tn, ok := s.notifier.(*TemporalNotifier); ok {
		tn.metrics = m
		tn.UseOutbox(deps.DB)
	}
	if s.capture, err = capture.New(context.Background(), deps.DB, capture.Options{MaxBatch: cfg.CaptureBatchMax, Wait: cfg.CaptureBatchWait,
		Logger: deps.Logger, Batch: m.captureBatch, Commit: m.captureCommit}); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

// checkAdminKey refuses the development admin key anywhere but loopback.
func checkAdminKey(cfg config.GatewayConfig) error {
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway listen %q: %w", cfg.Listen, err)
	}
	if cfg.AdminKey == config.DefaultAdminKey && !config.IsLoopback(host) {
		return fmt.Errorf("gateway: refusing to listen on %s with the default admin key; set FLYWHEEL_GATEWAY_ADMIN_KEY", cfg.Listen)
	}
	return nil
}

func (s *Server) routes() {
	gin.SetMode(gin.ReleaseMode)
	e := gin.New()
	e.Use(gin.Recovery(), s.requestID, s.metrics.observe, traceContext)
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(s.deps.Registry, promhttp.HandlerOpts{})))

	for _, prefix := range []string{"/v1", "/s/:session_id/v1"} {
		oa := e.Group(prefix, withProtocol(protoOpenAI), s.limitBody, s.auth)
		oa.POST("/chat/completions", s.chatCompletions)
		oa.GET("/models", s.listModels)
		oa.GET("/models/:model", s.getModel)
		oa.POST("/responses", s.createResponse)
		oa.GET("/responses/:id", s.getResponse)
		oa.DELETE("/responses/:id", s.deleteResponse)
		an := e.Group(prefix, withProtocol(protoAnthropic), s.limitBody, s.auth)
		an.POST("/messages", s.messages)
		an.POST("/messages/count_tokens", s.countTokens)
	}
	api := e.Group("/v1", withProtocol(protoOpenAI), s.limitBody, s.auth)
	api.POST("/sessions", s.createSession)
	api.GET("/sessions/:id", s.getSession)
	api.POST("/sessions/:id/reward", s.postReward)
	api.POST("/sessions/:id/end", s.endSession)
	api.POST("/sessions/:id/consent", s.sessionConsent)
	api.POST("/feedback", s.postFeedback)
	api.PUT("/end_users/:end_user/consent", s.endUserConsent)
	api.POST("/forget", s.forget)
	api.GET("/trajectories", s.exportTrajectories)
	api.GET("/status", s.status)
	api.GET("/backlog", s.backlog)
	api.GET("/usage", s.usage)
	e.GET("/status", withProtocol(protoOpenAI), s.statusAuth, s.statusPage)
	e.POST("/status/login", withProtocol(protoOpenAI), s.limitBody, s.statusLoginPost)
	e.POST("/status/logout", withProtocol(protoOpenAI), s.limitBody, s.statusLogoutPost)

	adm := e.Group("/admin/v1", withProtocol(protoOpenAI), s.limitBody, s.admin)
	adm.POST("/keys", s.adminCreateKey)
	adm.GET("/keys", s.adminListKeys)
	adm.GET("/usage", s.adminUsage)
	adm.POST("/keys/:id/revoke", s.adminRevokeKey)
	adm.POST("/keys/:id/rotate", s.adminRotateKey)
	adm.GET("/models", s.listModels)
	adm.POST("/deployments", s.adminCreateDeployment)
	adm.GET("/deployments", s.adminListDeployments)
	adm.GET("/deployments/:name", s.adminGetDeployment)
	adm.PUT("/deployments/:name", s.adminUpdateDeployment)
	adm.GET("/deployments/:name/suites", s.adminListSuites)
	adm.GET("/deployments/:name/suites/:suite", s.adminGetSuite)
	adm.PUT("/deployments/:name/suites/:suite", s.adminPutSuite)
	adm.DELETE("/deployments/:name/suites/:suite", s.adminDeleteSuite)

	e.NoRoute(func(c *gin.Context) {
		abort(c, errf(http.StatusNotFound, "no route %s %s", c.Request.Method, c.Request.URL.Path))
	})
	s.engine = e
}

// now is the rate limits' clock.
func (s *Server) now() time.Time { return s.deps.Now() }

// Handler is the gateway as an http.Handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.engine }

// healthz answers while the process runs.
func (s *Server) healthz(c *gin.Context) {
	c.JSON(http.StatusOK, gin.H{"status": "ok"})
}

// readyz answers 200 only when Postgres answers, so load balancers send
// traffic only to a gateway that can commit what it acknowledges.
func (s *Server) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 2*time.Second)
	defer cancel()
	if err := s.deps.DB.Ping(ctx); err != nil {
		c.JSON(http.StatusServiceUnavailable, gin.H{"status": "unavailable", "postgres": err.Error()})
		return
	}
	c.JSON(http.StatusOK, gin.H{"status": "ready"})
}

// ListenAndServe serves until ctx is done, then drains in-flight requests
// (up to the read timeout) so that every acknowledged call is committed.
func (s *Server) ListenAndServe(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway listen on %s: %w", s.cfg.Listen, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is ListenAndServe on an existing listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.engine,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       s.cfg.ReadTimeout,
	}
	s.deps.Logger.Info(msgListening, "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		s.Close()
		return fmt.Errorf("gateway serve: %w", err)
	case <-ctx.Done():
	}
	s.deps.Logger.Info(msgStopping)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ReadTimeout)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	s.Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway shutdown: %w", err)
	}
	return nil
}

// Close commits queued captures and flushes notices. Serve calls it; call
// it yourself when using Handler directly.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.capture.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.notifier.Close(ctx)
	})
}
