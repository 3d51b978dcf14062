package gateway

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/store"
)

// The admin API of tenant keys: create (optionally limited to models and
// with an expiry), list, revoke and rotate. `flywheel keys` does the same
// from the command line.

type adminKeyRequest struct {
	Tenant string   `json:"tenant"`
	Name   string   `json:"name"`
	Models []string `json:"models"`
	// Labels are free labels for the key's operators (team, environment),
	// listed with it; store.ValidKeyMeta bounds them.
	Labels map[string]string `json:"labels"`
	// ExpiresAt (RFC 3339) or ExpiresIn (a Go duration, "720h") ends the
	// key; neither means it does not expire.
	ExpiresAt *time.Time `json:"expires_at"`
	ExpiresIn string     `json:"expires_in"`
	// TokenBudget caps the key's prompt and completion tokens per
	// BudgetPeriod ("day", the default, or "month"; UTC).
	TokenBudget  int64  `json:"token_budget"`
	BudgetPeriod string `json:"budget_period"`
	// TPM is the key's tokens-per-minute rate limit (0: none); omitted,
	// the gateway's rate_limit_tpm applies.
	TPM *int64 `json:"tpm"`
}

// maxKeyModels bounds a key's model list.
const maxKeyModels = 100

func (r *adminKeyRequest) spec(now time.Time) (store.KeySpec, *apiError) {
	if err := store.ValidTenantName(r.Tenant); err != nil {
		return store.KeySpec{}, errf(422, "%v", err)
	}
	if len(r.Models) > maxKeyModels {
		return store.KeySpec{}, errf(422, "models: at most %d", maxKeyModels)
	}
	for _, m := range r.Models {
		if m == "" || len(m) > deployment.MaxName {
			return store.KeySpec{}, errf(422, "models: a model name has 1..%d characters", deployment.MaxName)
		}
	}
	if err := store.ValidBudget(r.TokenBudget, r.BudgetPeriod); err != nil {
		return store.KeySpec{}, errf(422, "%v", err)
	}
	if err := store.ValidTPM(r.TPM); err != nil {
		return store.KeySpec{}, errf(422, "%v", err)
	}
	if err := store.ValidKeyMeta(r.Name, r.Labels); err != nil {
		return store.KeySpec{}, errf(422, "%v", err)
	}
	spec := store.KeySpec{TenantID: r.Tenant, Name: r.Name, Models: r.Models, TokenBudget: r.TokenBudget, BudgetPeriod: r.BudgetPeriod, TPM: r.TPM,
		Labels: r.Labels}
	switch {
	case r.ExpiresAt != nil && r.ExpiresIn != "":
		return store.KeySpec{}, errf(422, "give expires_at or expires_in, not both")
	case r.ExpiresAt != nil:
		spec.ExpiresAt = *r.ExpiresAt
	case r.ExpiresIn != "":
		d, err := time.ParseDuration(r.ExpiresIn)
		if err != nil || d <= 0 {
			return store.KeySpec{}, errf(422, "expires_in: want a positive duration such as 720h, got %q", r.ExpiresIn)
		}
		spec.ExpiresAt = now.Add(d)
	}
	if !spec.ExpiresAt.IsZero() && !spec.ExpiresAt.After(now) {
		return store.KeySpec{}, errf(422, "expires_at: %s is not in the future", spec.ExpiresAt.Format(time.RFC3339))
	}
	return spec, nil
}

// adminCreateKey is POST /admin/v1/keys {tenant, name, labels, models,
// expires_at | expires_in, token_budget, budget_period, tpm}: the tenant is
// created if new; the key is shown once and stored hashed.
func (s *Server) adminCreateKey(c *gin.Context) {
	var r adminKeyRequest
	if err := bindJSON(c, &r); err != nil {
		abort(c, err)
		return
	}
	spec, aerr := r.spec(time.Now())
	if aerr != nil {
		abort(c, aerr)
		return
	}
	if err := store.EnsureTenant(c.Request.Context(), s.deps.DB, r.Tenant); err != nil {
		abort(c, err)
		return
	}
	key, k, err := store.IssueKey(c.Request.Context(), s.deps.DB, spec)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"tenant": r.Tenant, "api_key": key, "key": k})
}

// adminListKeys is GET /admin/v1/keys?tenant=&all=true&sessions=true:
// live tenant keys, newest first; all adds revoked and expired ones,
// sessions adds per-session keys.
func (s *Server) adminListKeys(c *gin.Context) {
	f := store.KeyFilter{TenantID: c.Query("tenant")}
	for name, dst := range map[string]*bool{"all": &f.All, "sessions": &f.Sessions} {
		if v := c.Query(name); v != "" {
			b, err := strconv.ParseBool(v)
			if err != nil {
				abort(c, errf(http.StatusBadRequest, "%s: want true or false, got %q", name, v))
				return
			}
			*dst = b
		}
	}
	keys, err := store.ListKeys(c.Request.Context(), s.deps.DB, f)
	if err != nil {
		abort(c, err)
		return
	}
	c.JSON(http.StatusOK, gin.H{"object": "list", "data": keys})
}

func keyID(c *gin.Context) (int64, *apiError) {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id <= 0 {
		return 0, errf(http.StatusBadRequest, "key id: want a positive integer, got %q", c.Param("id"))
	}
	return id, nil
}

// adminRevokeKey is POST /admin/v1/keys/{id}/revoke: the key and the
// session keys it issued stop working (at once in this process, within
// gateway.key_cache_ttl in others).
func (s *Server) adminRevokeKey(c *gin.Context) {
	id, aerr := keyID(c)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	k, err := store.RevokeKey(c.Request.Context(), s.deps.DB, id)
	if errors.Is(err, store.ErrNotFound) {
		abort(c, errf(http.StatusNotFound, "no key %d", id))
		return
	}
	if err != nil {
		abort(c, err)
		return
	}
	s.keys.forget()
	c.JSON(http.StatusOK, gin.H{"key": k})
}

type adminRotateRequest struct {
	// Grace is how long the old key keeps working (a Go duration); empty
	// or "0s" revokes it at once.
	Grace string `json:"grace"`
}

// adminRotateKey is POST /admin/v1/keys/{id}/rotate {grace}: a new key
// with the old one's tenant, name, labels, models, expiry and limits, shown
// once.
func (s *Server) adminRotateKey(c *gin.Context) {
	id, aerr := keyID(c)
	if aerr != nil {
		abort(c, aerr)
		return
	}
	var r adminRotateRequest
	if c.Request.ContentLength != 0 {
		if err := bindJSON(c, &r); err != nil {
			abort(c, err)
			return
		}
	}
	var grace time.Duration
	if r.Grace != "" {
		var err error
		if grace, err = time.ParseDuration(r.Grace); err != nil || grace < 0 {
			abort(c, errf(422, "grace: want a duration such as 24h, got %q", r.Grace))
			return
		}
	}
	key, k, err := store.RotateKey(c.Request.Context(), s.deps.DB, id, grace)
	switch {
	case errors.Is(err, store.ErrNotFound):
		abort(c, errf(http.StatusNotFound, "no key %d", id))
		return
	case errors.Is(err, store.ErrKeyNotLive):
		abort(c, errf(http.StatusConflict, "key %d is revoked or expired: create a new key instead", id))
		return
	case err != nil:
		abort(c, err)
		return
	}
	s.keys.forget()
	c.JSON(http.StatusCreated, gin.H{"tenant": k.TenantID, "api_key": key, "key": k})
}
