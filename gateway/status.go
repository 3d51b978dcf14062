package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/internal/statuspage"
	"github.com/flywheel-ai/flywheel/statusapi"
	"github.com/flywheel-ai/flywheel/store"
)

// Status view limits.
const (
	// statusListLimit caps each list of the view (versions, releases, …).
	statusListLimit = 20
	// statusWindow is how far back the curve reaches unless ?window= says.
	statusWindow    = 24 * time.Hour
	statusMaxWindow = 90 * 24 * time.Hour
	// statusRefresh is how often the HTML page reloads itself.
	statusRefresh = 5 * time.Second
)

// status is GET /v1/status?deployment=&window=: the tenant's view of its
// deployments (all of them, or the one named) as JSON.
func (s *Server) status(c *gin.Context) {
	st, err := s.loadStatus(c)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, st)
}

// statusPage is GET /status: the same view as a self-refreshing HTML page
// with the curve inline, for a browser.
func (s *Server) statusPage(c *gin.Context) {
	st, err := s.loadStatus(c)
	if err != nil {
		abort(c, err)
		return
	}
	html, err := statuspage.Render(st, statuspage.Page{Selected: c.Query("deployment"), Refresh: statusRefresh,
		Logout: c.GetBool(ctxStatusLogin)})
	if err != nil {
		abort(c, err)
		return
	}
	c.Header("Cache-Control", "no-store")
	c.Data(http.StatusOK, "text/html; charset=utf-8", html)
}

func (s *Server) loadStatus(c *gin.Context) (*statusapi.Status, error) {
	p := principalOf(c)
	if p.SessionID != "" {
		return nil, errf(http.StatusForbidden, "the status view needs a tenant API key, not a per-session key")
	}
	window := statusWindow
	if v := c.Query("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > statusMaxWindow {
			return nil, errf(http.StatusBadRequest, "window: want a duration such as 30m or 6h, at most %s", statusMaxWindow)
		}
		window = d
	}
	now := time.Now()
	dep := c.Query("deployment")
	st, err := store.LoadStatus(c.Request.Context(), s.deps.DB, store.StatusQuery{
		TenantID: p.TenantID, Deployment: dep, CurveSince: now.Add(-window), Limit: statusListLimit, Now: now})
	if errors.Is(err, store.ErrNotFound) {
		return nil, errf(http.StatusNotFound, "deployment %q not found", dep)
	}
	if err != nil {
		return nil, fmt.Errorf("load status: %w", err)
	}
	return st, nil
}

// devRequest says whether r may see the status dev tenant's page without
// a key (see statusAuth).
func (s *Server) devRequest(r *http.Request) bool {
	listen, _, err := net.SplitHostPort(s.cfg.Listen)
	if err != nil || !config.IsLoopback(listen) {
		return false
	}
	remote, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil || !config.IsLoopback(remote) {
		return false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return config.IsLoopback(strings.Trim(host, "[]"))
}

// backlog is GET /v1/backlog: what the control plane has yet to absorb
// from this tenant (sessions ended but not yet assembled), so a load
// generator, or an operator, can see the pipeline keep up.
func (s *Server) backlog(c *gin.Context) {
	p := principalOf(c)
	if p.SessionID != "" {
		abort(c, errf(http.StatusForbidden, "the backlog view needs a tenant API key, not a per-session key"))
		return
	}
	b, err := store.TenantBacklog(c.Request.Context(), s.deps.DB, p.TenantID)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, b)
}
