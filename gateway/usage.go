package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/store"
)

// usageFilter reads ?key_id=&since=&until=&by=day (days as YYYY-MM-DD,
// UTC; until exclusive).
func usageFilter(c *gin.Context) (store.UsageFilter, *apiError) {
	var f store.UsageFilter
	if v := c.Query("key_id"); v != "" {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return f, errf(http.StatusBadRequest, "key_id: want a positive integer, got %q", v)
		}
		f.KeyID = id
	}
	for name, dst := range map[string]*time.Time{"since": &f.Since, "until": &f.Until} {
		if v := c.Query(name); v != "" {
			d, err := time.Parse(time.DateOnly, v)
			if err != nil {
				return f, errf(http.StatusBadRequest, "%s: want a day such as 2026-12-01, got %q", name, v)
			}
			*dst = d
		}
	}
	switch c.Query("by") {
	case "":
	case "day":
		f.ByDay = true
	default:
		return f, errf(http.StatusBadRequest, "by: only \"day\" is supported")
	}
	return f, nil
}

// usage is GET /v1/usage: what the tenant's keys spent, per key and
// deployment (by=day: per day too), as accounted when each call was
// captured. Forgetting data does not erase what it cost.
func (s *Server) usage(c *gin.Context) {
	p := principalOf(c)
	if p.SessionID != "" {
		abort(c, errf(http.StatusForbidden, "a per-session key cannot read the tenant's usage"))
		return
	}
	f, aerr := usageFilter(c)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	f.TenantID = p.TenantID
	s.writeUsage(c, f)
}

// adminUsage is GET /admin/v1/usage?tenant=: every tenant's, or one's.
func (s *Server) adminUsage(c *gin.Context) {
	f, aerr := usageFilter(c)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	f.TenantID = c.Query("tenant")
	s.writeUsage(c, f)
}

func (s *Server) writeUsage(c *gin.Context, f store.UsageFilter) {
	rows, err := store.Usage(c.Request.Context(), s.deps.DB, f)
	if err != nil {
		abort(c, err)
		return
	}
	var total store.UsageRow
	for _, r := range rows {
		total.Requests += r.Requests
		total.Errors += r.Errors
		total.PromptTokens += r.PromptTokens
		total.CompletionTokens += r.CompletionTokens
	}
	c.JSON(http.StatusOK, gin.H{"object": "list", "data": rows, "total": gin.H{"requests": total.Requests, "errors": total.Errors,
		"prompt_tokens": total.PromptTokens, "completion_tokens": total.CompletionTokens}})
}
