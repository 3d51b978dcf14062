package gateway

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/store"
)

// The status page's login, for a browser, which cannot send a bearer
// header: GET /status without credentials shows a form for the API key;
// POST /status/login verifies the key as the auth middleware does and sets
// a cookie holding a random token, never the key; POST /status/logout ends
// the login.
//
// Logins live in this gateway's memory: one holds on the replica that
// issued it only (behind a load balancer without sticky sessions a reader
// logs in again), and a restart logs every reader out. A login keeps the
// key's hash and every use re-verifies it through the key cache, so a
// revoked or expired key's login stops within gateway.key_cache_ttl, as
// the key itself does.
//
// Cross-site requests: the cookie is SameSite=Strict, and a login or
// logout form must come from this host (Origin, else Referer), so another
// site can neither log a reader in under its own key nor out.

const (
	// statusCookie names the login cookie; its path is statusPath.
	statusCookie = "flywheel_status"
	statusPath   = "/status"
	// statusLoginTTL bounds a login's life, whatever the key's.
	statusLoginTTL = 12 * time.Hour
	// maxStatusLogins bounds the logins one gateway holds.
	maxStatusLogins = 10000
	// loginFailureRate and loginFailureBurst bound failed logins per
	// client address: 5 at once, then one every 12 s.
	loginFailureRate  = 1.0 / 12
	loginFailureBurst = 5
)

// ctxStatusLogin marks a request whose principal came from a login.
const ctxStatusLogin = "flywheel.status_login"

// statusLogin is one browser's login.
type statusLogin struct {
	keyHash string
	until   time.Time
}

// statusLogins are the logins this gateway issued, by token.
type statusLogins struct {
	mu sync.Mutex
	m  map[string]statusLogin
}

var errTooManyLogins = &apiError{Status: http.StatusServiceUnavailable, Message: "too many status page logins on this gateway; try again later", RetryAfter: time.Minute}

// add issues a token for the key's hash, valid until until.
func (l *statusLogins) add(keyHash string, until, now time.Time) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("status login token: %w", err)
	}
	token := hex.EncodeToString(b)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) >= maxStatusLogins {
		for t, in := range l.m {
			if !now.Before(in.until) {
				delete(l.m, t)
			}
		}
		if len(l.m) >= maxStatusLogins {
			return "", errTooManyLogins
		}
	}
	l.m[token] = statusLogin{keyHash: keyHash, until: until}
	return token, nil
}

// get is the live login of token; an expired one is dropped.
func (l *statusLogins) get(token string, now time.Time) (statusLogin, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	in, ok := l.m[token]
	if ok && !now.Before(in.until) {
		delete(l.m, token)
		return statusLogin{}, false
	}
	return in, ok
}

func (l *statusLogins) remove(token string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, token)
}

// statusAuth lets a reader see the page, by the first of: an API key in
// the headers; a login (the cookie POST /status/login set); on a
// development gateway, the status dev tenant (the one `flywheel up` prints
// a key for). "Development" means all of: a status dev tenant is
// configured, the gateway listens on a loopback address only, the request
// came over loopback, and it names a loopback host (which a DNS-rebinding
// page cannot). Else a browser gets the login form, and others the usual
// 401.
func (s *Server) statusAuth(c *gin.Context) {
	if presentedKey(c) != "" {
		s.auth(c)
		return
	}
	p, err := s.loginPrincipal(c)
	if err != nil {
		abort(c, err)
		return
	}
	switch {
	case p != nil:
		c.Set(ctxStatusLogin, true)
		if err := s.limitRequests(c, p.keyHash, s.now()); err != nil {
			abort(c, err)
			return
		}
	case s.cfg.StatusDevTenant != "" && s.devRequest(c.Request):
		p = &principal{KeyOwner: store.KeyOwner{TenantID: s.cfg.StatusDevTenant}}
	case strings.Contains(c.GetHeader("Accept"), "text/html"):
		s.loginForm(c, http.StatusUnauthorized, "")
		c.Abort()
		return
	default:
		s.auth(c)
		return
	}
	c.Set(ctxPrincipal, p)
	c.Next()
}

// loginPrincipal is the principal of the request's login, nil when it has
// none that still holds (no cookie, an unknown or expired token, a key
// revoked since).
func (s *Server) loginPrincipal(c *gin.Context) (*principal, error) {
	token, err := c.Cookie(statusCookie)
	if err != nil || token == "" {
		return nil, nil
	}
	now := s.now()
	in, ok := s.logins.get(token, now)
	if !ok {
		return nil, nil
	}
	owner, err := s.verifyKeyHash(c.Request.Context(), in.keyHash, now)
	var apiErr *apiError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized {
		s.logins.remove(token)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &principal{KeyOwner: owner, keyHash: in.keyHash}, nil
}

// statusLoginPost is POST /status/login (form field api_key, optional
// deployment): a tenant key logs the browser in and goes to its page; a
// bad one gets the form again with 401.
func (s *Server) statusLoginPost(c *gin.Context) {
	if err := sameOrigin(c.Request); err != nil {
		abort(c, err)
		return
	}
	now := s.now()
	addr := c.RemoteIP()
	if retry, refused := s.loginFailures.refused(addr, now); refused {
		c.Header("Retry-After", fmt.Sprint(int(retry.Seconds())+1))
		s.loginForm(c, http.StatusTooManyRequests, fmt.Sprintf("Too many failed logins from your address: try again in %d s.", int(retry.Seconds())+1))
		return
	}
	key := strings.TrimSpace(c.PostForm("api_key"))
	hash := string(store.HashKey(key))
	owner, err := s.verifyKeyHash(c.Request.Context(), hash, now)
	if err == nil && owner.SessionID != "" {
		err = errf(http.StatusUnauthorized, "the status page needs a tenant API key, not a per-session key")
	}
	if key == "" {
		err = errf(http.StatusUnauthorized, "paste an API key")
	}
	if err != nil {
		e := asAPIError(err)
		if e.Status == http.StatusUnauthorized {
			s.loginFailures.allow(addr, now)
		}
		s.loginForm(c, e.Status, e.Message)
		return
	}
	until := now.Add(statusLoginTTL)
	if !owner.ExpiresAt.IsZero() && owner.ExpiresAt.Before(until) {
		until = owner.ExpiresAt
	}
	token, err := s.logins.add(hash, until, now)
	if err != nil {
		abort(c, err)
		return
	}
	http.SetCookie(c.Writer, s.loginCookie(c.Request, token, int(until.Sub(now).Seconds())))
	target := statusPath
	if dep := c.PostForm("deployment"); dep != "" {
		target += "?deployment=" + url.QueryEscape(dep)
	}
	c.Redirect(http.StatusSeeOther, target)
}

// statusLogoutPost is POST /status/logout: the login ends on this gateway
// and its cookie is cleared.
func (s *Server) statusLogoutPost(c *gin.Context) {
	if err := sameOrigin(c.Request); err != nil {
		abort(c, err)
		return
	}
	if token, err := c.Cookie(statusCookie); err == nil {
		s.logins.remove(token)
	}
	http.SetCookie(c.Writer, s.loginCookie(c.Request, "", -1))
	c.Redirect(http.StatusSeeOther, statusPath)
}

// loginCookie carries token for maxAge seconds (< 0: clears it). Secure
// when the browser reached us over TLS, directly or through a proxy that
// says so.
func (s *Server) loginCookie(r *http.Request, token string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: statusCookie, Value: token, Path: statusPath, MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")}
}

// sameOrigin refuses a form posted from another site: the Origin browsers
// send with a POST, else the Referer, must name the host the request was
// sent to.
func sameOrigin(r *http.Request) error {
	from := r.Header.Get("Origin")
	if from == "" || from == "null" {
		from = r.Header.Get("Referer")
	}
	u, err := url.Parse(from)
	if from == "" || err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return errf(http.StatusForbidden, "cross-origin form refused: log in from this gateway's own /status page")
	}
	return nil
}

// loginForm answers the login form with status and a message.
func (s *Server) loginForm(c *gin.Context, status int, message string) {
	var buf bytes.Buffer
	data := struct {
		Message, Deployment string
		Hours               int
	}{message, c.Query("deployment"), int(statusLoginTTL.Hours())}
	if c.Request.Method == http.MethodPost {
		data.Deployment = c.PostForm("deployment")
	}
	if err := loginTmpl.Execute(&buf, data); err != nil {
		abort(c, fmt.Errorf("render login form: %w", err))
		return
	}
	c.Header("Cache-Control", "no-store")
	c.Header("X-Frame-Options", "DENY")
	c.Header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	c.Data(status, "text/html; charset=utf-8", buf.Bytes())
}

var loginTmpl = template.Must(template.New("login").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Flywheel status: log in</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:3em auto;max-width:32em;padding:0 1em;color:#222}
input{width:100%;box-sizing:border-box;padding:.4em;font-family:monospace}button{margin-top:.8em;padding:.4em 1.2em}
.bad{color:#b3261e}.small{font-size:.85em;color:#555}
</style></head><body>
<h1>Flywheel status</h1>
{{with .Message}}<p class="bad">{{.}}</p>{{end}}
<form method="post" action="/status/login">
<label for="api_key">Your tenant API key</label>
<input id="api_key" name="api_key" type="password" autocomplete="off" required autofocus>
{{with .Deployment}}<input type="hidden" name="deployment" value="{{.}}">{{end}}
<button type="submit">Log in</button>
</form>
<p class="small">The key is checked once and is not stored in your browser: a cookie holds a random token for this gateway instead,
for at most {{.Hours}} hours, and ends when the key is revoked or you log out.</p>
</body></html>
`))
