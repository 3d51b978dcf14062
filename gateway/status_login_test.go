package gateway_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/store"
)

// browser is a bare browser against one gateway: it keeps the status
// cookie, sends the Origin a same-site form post carries, and does not
// follow redirects.
type browser struct {
	t      *testing.T
	base   string
	origin string
	cookie *http.Cookie
}

func (b *browser) page(path string) (int, string) {
	b.t.Helper()
	req, err := http.NewRequest("GET", b.base+path, nil)
	require.NoError(b.t, err)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	if b.cookie != nil {
		req.AddCookie(b.cookie)
	}
	st, _, body := b.send(req)
	return st, body
}

// post posts a form; headers are extra name, value pairs.
func (b *browser) post(path string, form url.Values, headers ...string) (int, http.Header, string) {
	b.t.Helper()
	req, err := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if b.origin != "" {
		req.Header.Set("Origin", b.origin)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if b.cookie != nil {
		req.AddCookie(b.cookie)
	}
	return b.send(req)
}

func (b *browser) send(req *http.Request) (int, http.Header, string) {
	b.t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	for _, c := range resp.Cookies() {
		if c.Name == "flywheel_status" {
			b.cookie = c
			if c.MaxAge < 0 {
				b.cookie = nil
			}
		}
	}
	return resp.StatusCode, resp.Header, string(body)
}

func (b *browser) login(key string) (int, string) {
	b.t.Helper()
	st, h, body := b.post("/status/login", url.Values{"api_key": {key}, "deployment": {fixtureModel}})
	if st == http.StatusSeeOther {
		require.Equal(b.t, "/status?deployment="+fixtureModel, h.Get("Location"))
	}
	return st, body
}

// TestStatusLoginFromAnotherMachine logs a browser in to a gateway that
// listens beyond loopback (so no dev tenant): the form, a good and a bad
// key, the cookie's attributes, one tenant's page only, logout, a revoked
// key, cross-site posts and the limit on failed logins.
func TestStatusLoginFromAnotherMachine(t *testing.T) {
	e := newEnv(t, envOpts{})
	f := seedStatus(t, e)
	base := devGateway(t, e, func(c *configGateway) {
		c.Listen, c.AdminKey = "0.0.0.0:8080", "a-real-admin-key-for-this-test"
		c.KeyCacheTTL = 50 * time.Millisecond
	})
	u, err := url.Parse(base)
	require.NoError(t, err)
	b := &browser{t: t, base: base, origin: "http://" + u.Host}

	st, form := b.page("/status?deployment=" + fixtureModel)
	require.Equal(t, 401, st)
	for _, want := range []string{`<form method="post" action="/status/login">`, `name="api_key" type="password"`, `value="` + fixtureModel + `"`} {
		require.Contains(t, form, want)
	}
	for _, external := range []string{"<link", "<script", `src="`, "@import", "url("} {
		require.NotContains(t, form, external, "the form loads nothing from elsewhere")
	}
	st, ctype, body := getPage(t, base+"/status", "", "")
	require.Equal(t, 401, st)
	require.Contains(t, ctype, "application/json", "a client that is no browser gets the API's error: %s", body)

	st, body2 := b.login("fw-not-a-key")
	require.Equal(t, 401, st)
	require.Contains(t, body2, "invalid API key")
	require.Contains(t, body2, `action="/status/login"`, "the form again")
	require.Nil(t, b.cookie)

	st, _ = b.login(e.keyA)
	require.Equal(t, http.StatusSeeOther, st)
	require.NotNil(t, b.cookie)
	c := b.cookie
	require.NotContains(t, c.Value, e.keyA)
	require.NotContains(t, e.keyA, c.Value)
	require.True(t, c.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, c.SameSite)
	require.Equal(t, "/status", c.Path)
	require.False(t, c.Secure, "plain HTTP")
	require.Positive(t, c.MaxAge)
	require.LessOrEqual(t, c.MaxAge, 12*3600)

	st, page := b.page("/status?deployment=" + fixtureModel)
	require.Equal(t, 200, st, page)
	require.Contains(t, page, "tenant <b>acme</b>")
	require.Contains(t, page, f.rewarded)
	require.Contains(t, page, `action="/status/logout"`)
	st, _, _ = getPage(t, base+"/v1/status", "", "")
	require.Equal(t, 401, st, "the cookie is for the page, not the API")

	other := &browser{t: t, base: base, origin: b.origin}
	st, _ = other.login(e.keyB)
	require.Equal(t, http.StatusSeeOther, st)
	st, page = other.page("/status")
	require.Equal(t, 200, st)
	require.NotContains(t, page, f.rewarded, "globex's login shows globex only")
	require.NotContains(t, page, "acme")

	// Cross-site: another origin, none at all, or a session key.
	for _, h := range [][]string{{"Origin", "http://evil.example"}, {"Origin", "null", "Referer", "http://evil.example/x"}} {
		evil := &browser{t: t, base: base}
		st, _, _ := evil.post("/status/login", url.Values{"api_key": {e.keyA}}, h...)
		require.Equal(t, 403, st, "%v", h)
		require.Nil(t, evil.cookie)
	}
	bare := &browser{t: t, base: base}
	st, _, _ = bare.post("/status/login", url.Values{"api_key": {e.keyA}})
	require.Equal(t, 403, st, "no Origin or Referer")
	st, _, _ = bare.post("/status/login", url.Values{"api_key": {e.keyA}}, "Referer", base+"/status")
	require.Equal(t, http.StatusSeeOther, st, "a same-site Referer will do")
	st, _, _ = b.post("/status/logout", nil, "Origin", "http://evil.example")
	require.Equal(t, 403, st, "another site cannot log the reader out")
	_, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{})
	sessionKey := &browser{t: t, base: base, origin: b.origin}
	st, _ = sessionKey.login(created["api_key"].(string))
	require.Equal(t, 401, st)
	require.Nil(t, sessionKey.cookie)

	// Behind a TLS proxy the cookie is Secure.
	tls := &browser{t: t, base: base, origin: b.origin}
	st, _, _ = tls.post("/status/login", url.Values{"api_key": {e.keyA}}, "X-Forwarded-Proto", "https")
	require.Equal(t, http.StatusSeeOther, st)
	require.True(t, tls.cookie.Secure)

	// Logout ends the login here: the old cookie is worth nothing.
	stolen := *b.cookie
	st, _, _ = b.post("/status/logout", nil)
	require.Equal(t, http.StatusSeeOther, st)
	require.Nil(t, b.cookie, "the cookie is cleared")
	b.cookie = &stolen
	st, _ = b.page("/status")
	require.Equal(t, 401, st)

	// A revoked key's login stops within the key cache's ttl.
	ctx := context.Background()
	key, err := store.CreateKey(ctx, e.pool, "acme", "", "browser")
	require.NoError(t, err)
	owner, err := store.LookupKey(ctx, e.pool, key)
	require.NoError(t, err)
	revoked := &browser{t: t, base: base, origin: b.origin}
	st, _ = revoked.login(key)
	require.Equal(t, http.StatusSeeOther, st)
	st, _ = revoked.page("/status")
	require.Equal(t, 200, st)
	_, err = store.RevokeKey(ctx, e.pool, owner.KeyID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { st, _ := revoked.page("/status"); return st == 401 }, 5*time.Second, 20*time.Millisecond)

	// Failed logins from one address are limited; the limit holds a good
	// key back too until it refills. Two failed above (a wrong key, a
	// session key): three more fill the five allowed at once.
	for range 3 {
		st, _ = other.login("fw-wrong")
		require.Equal(t, 401, st)
	}
	st, _, body3 := other.post("/status/login", url.Values{"api_key": {e.keyB}})
	require.Equal(t, 429, st, body3)
	require.Contains(t, body3, "Too many failed logins")
}
