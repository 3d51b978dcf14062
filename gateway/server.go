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
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flywheel-ai/flywheel/config"
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
}

// Server is the HTTP gateway.
type Server struct {
	cfg    config.GatewayConfig
	deps   Deps
	engine *gin.Engine
}

// New builds the gateway's routes.
func New(cfg config.GatewayConfig, deps Deps) *Server {
	gin.SetMode(gin.ReleaseMode)
	s := &Server{cfg: cfg, deps: deps, engine: gin.New()}
	s.engine.Use(gin.Recovery())
	s.engine.GET("/healthz", s.healthz)
	s.engine.GET("/readyz", s.readyz)
	return s
}

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
		return fmt.Errorf("gateway serve: %w", err)
	case <-ctx.Done():
	}
	s.deps.Logger.Info(msgStopping)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.ReadTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("gateway shutdown: %w", err)
	}
	return nil
}
