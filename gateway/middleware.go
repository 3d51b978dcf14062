package gateway

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/store"
)

const (
	msgRequest      = "request"
	msgRequestError = "request failed"
)

// Gin context keys.
const (
	ctxRequestID = "flywheel.request_id"
	ctxPrincipal = "flywheel.principal"
)

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:\-]{1,128}$`)

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// requestID gives every request an id (the client's X-Request-Id when it
// is sane), returns it in the headers both SDKs read, and logs the request.
func (s *Server) requestID(c *gin.Context) {
	id := c.GetHeader("X-Request-Id")
	if !requestIDPattern.MatchString(id) {
		id = newID("req_")
	}
	c.Set(ctxRequestID, id)
	c.Header("X-Request-Id", id)
	c.Header("Request-Id", id)
	start := time.Now()
	c.Next()
	attrs := []any{"request_id", id, "method", c.Request.Method, "path", c.Request.URL.Path,
		"status", c.Writer.Status(), "duration", time.Since(start)}
	if len(c.Errors) > 0 {
		s.deps.Logger.Error(msgRequestError, append(attrs, "err", c.Errors.String())...)
		return
	}
	s.deps.Logger.Debug(msgRequest, attrs...)
}

// limitBody rejects bodies over the limit with 413, before reading them
// when Content-Length says so.
func (s *Server) limitBody(c *gin.Context) {
	if c.Request.ContentLength > s.cfg.MaxBodyBytes {
		abort(c, errf(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", s.cfg.MaxBodyBytes))
		return
	}
	c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, s.cfg.MaxBodyBytes)
	c.Next()
}

// readBody reads the (limited) body, mapping an oversize body to 413.
func readBody(c *gin.Context) ([]byte, error) {
	b, err := c.GetRawData()
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errf(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", mbe.Limit)
		}
		return nil, errf(http.StatusBadRequest, "read body: %v", err)
	}
	return b, nil
}

// principal is who is calling: the key's owner and what it may do.
type principal struct {
	store.KeyOwner
	keyHash string
}

// mayUse refuses a model the caller's key is not scoped to.
func (p *principal) mayUse(model string) error {
	if !p.Allows(model) {
		return errf(http.StatusForbidden, "this API key may not use model %q", model)
	}
	return nil
}

func presentedKey(c *gin.Context) string {
	if k := c.GetHeader("X-Api-Key"); k != "" {
		return strings.TrimSpace(k)
	}
	h := c.GetHeader("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// keyCache remembers verified keys for a short time so the request path
// does not read Postgres on every call.
type keyCache struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]keyEntry
}

type keyEntry struct {
	owner store.KeyOwner
	until time.Time
}

func (k *keyCache) get(hash string, now time.Time) (store.KeyOwner, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.m[hash]
	if !ok || now.After(e.until) {
		return store.KeyOwner{}, false
	}
	return e.owner, true
}

func (k *keyCache) put(hash string, o store.KeyOwner, now time.Time) {
	if k.ttl <= 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.m) > 100000 {
		clear(k.m) // crude bound; keys are cheap to re-verify
	}
	until := now.Add(k.ttl)
	if !o.ExpiresAt.IsZero() && o.ExpiresAt.Before(until) {
		until = o.ExpiresAt // an expiring key is not served from the cache past its end
	}
	k.m[hash] = keyEntry{owner: o, until: until}
}

// forget drops every cached key, so a revocation or rotation made through
// this process takes effect here at once (others see it within the ttl).
func (k *keyCache) forget() {
	k.mu.Lock()
	defer k.mu.Unlock()
	clear(k.m)
}

// auth resolves the API key (tenant or per-session) into a principal.
func (s *Server) auth(c *gin.Context) {
	key := presentedKey(c)
	if key == "" {
		abort(c, errf(http.StatusUnauthorized, "missing API key: send Authorization: Bearer KEY or x-api-key"))
		return
	}
	hash := string(store.HashKey(key))
	now := s.now()
	owner, err := s.verifyKeyHash(c.Request.Context(), hash, now)
	if err != nil {
		abort(c, err)
		return
	}
	p := &principal{KeyOwner: owner, keyHash: hash}
	c.Set(ctxPrincipal, p)
	if err := s.limitRequests(c, hash, now); err != nil {
		abort(c, err)
		return
	}
	c.Next()
}

// verifyKeyHash is the owner of the live key with this hash, from the key
// cache or Postgres: a key revoked elsewhere stops working within
// gateway.key_cache_ttl. An unknown, revoked or expired key is a 401.
func (s *Server) verifyKeyHash(ctx context.Context, hash string, now time.Time) (store.KeyOwner, error) {
	if owner, ok := s.keys.get(hash, now); ok {
		return owner, nil
	}
	owner, err := store.LookupKeyHash(ctx, s.deps.DB, []byte(hash))
	if errors.Is(err, store.ErrNotFound) {
		return owner, errf(http.StatusUnauthorized, "invalid API key: unknown, revoked or expired")
	}
	if err != nil {
		return owner, &apiError{Status: http.StatusServiceUnavailable, Message: "cannot verify the API key now", RetryAfter: time.Second}
	}
	s.keys.put(hash, owner, now)
	return owner, nil
}

func principalOf(c *gin.Context) *principal {
	p, _ := c.Get(ctxPrincipal)
	return p.(*principal)
}

// admin lets only the admin key through.
func (s *Server) admin(c *gin.Context) {
	key := presentedKey(c)
	if key == "" || subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.AdminKey)) != 1 {
		abort(c, errf(http.StatusUnauthorized, "admin endpoints need the admin key"))
		return
	}
	c.Next()
}

// withProtocol tags the route's protocol so errors take its shape.
func withProtocol(p string) gin.HandlerFunc {
	return func(c *gin.Context) { c.Set(ctxProtocol, p); c.Next() }
}

func logAttrs(c *gin.Context) []any {
	return []any{slog.String("request_id", c.GetString(ctxRequestID))}
}
