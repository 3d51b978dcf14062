package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
)

// TestKeyLifecycle: keys are limited to models, listed, rotated with a
// grace, revoked with the session keys they issued, and expire; the
// gateway's key cache does not outlive any of that.
func TestKeyLifecycle(t *testing.T) {
	e := newEnv(t, envOpts{cfg: func(c *config.GatewayConfig) {
		c.UpstreamModels = []string{fixtureModel, "other-model"}
		c.KeyCacheTTL = time.Minute // long: revocation must not wait for it
	}})
	admin := e.cfg.AdminKey
	chat := func(key, model string) int {
		st, _, _ := e.do("POST", "/v1/chat/completions", key, map[string]any{"model": model,
			"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		return st
	}

	// A key limited to one model.
	st, out := e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "name": "scoped",
		"models": []string{fixtureModel}, "expires_in": "1h"})
	require.Equal(t, 201, st, out)
	scoped := out["api_key"].(string)
	meta := out["key"].(map[string]any)
	scopedID := int64(meta["id"].(float64))
	require.Equal(t, []any{fixtureModel}, meta["models"])
	require.NotEmpty(t, meta["expires_at"])
	require.Equal(t, 200, chat(scoped, fixtureModel))
	st, _, body := e.do("POST", "/v1/chat/completions", scoped, map[string]any{"model": "other-model",
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, 403, st)
	require.Contains(t, string(body), `may not use model \"other-model\"`)
	require.Equal(t, 200, chat(e.keyA, "other-model"), "an unscoped key uses every model")
	_, models := e.doJSON("GET", "/v1/models", scoped, nil)
	require.Equal(t, []string{fixtureModel}, modelIDs(models), "/v1/models lists what the key may use")
	_, models = e.doJSON("GET", "/v1/models", e.keyA, nil)
	require.ElementsMatch(t, []string{fixtureModel, "other-model"}, modelIDs(models))
	st, _ = e.doJSON("POST", "/v1/sessions", scoped, map[string]any{"model": "other-model"})
	require.Equal(t, 403, st, "nor may it open a session on another model")

	// Session keys inherit the scope and die with their parent.
	st, out = e.doJSON("POST", "/v1/sessions", scoped, map[string]any{"model": fixtureModel})
	require.Equal(t, 201, st, out)
	sessionKey := out["api_key"].(string)
	require.Equal(t, 200, chat(sessionKey, fixtureModel))
	require.Equal(t, 403, chat(sessionKey, "other-model"))

	// Bad requests.
	for _, bad := range []map[string]any{
		{"tenant": "acme", "expires_in": "soon"},
		{"tenant": "acme", "expires_in": "-1h"},
		{"tenant": "acme", "expires_at": "2001-01-01T00:00:00Z"},
		{"tenant": "acme", "expires_at": "2101-01-01T00:00:00Z", "expires_in": "1h"},
		{"tenant": "acme", "models": []string{""}},
		{"tenant": "Not A Tenant"},
	} {
		st, out := e.doJSON("POST", "/admin/v1/keys", admin, bad)
		require.Equal(t, 422, st, "%v: %v", bad, out)
	}

	// Listing.
	st, out = e.doJSON("GET", "/admin/v1/keys?tenant=acme", admin, nil)
	require.Equal(t, 200, st)
	ids := listedIDs(out)
	require.Contains(t, ids, scopedID)
	st, out = e.doJSON("GET", "/admin/v1/keys?tenant=acme&sessions=true", admin, nil)
	require.Equal(t, 200, st)
	require.Greater(t, len(listedIDs(out)), len(ids), "sessions=true adds the session keys")
	st, _ = e.doJSON("GET", "/admin/v1/keys?all=maybe", admin, nil)
	require.Equal(t, 400, st)
	st, _ = e.doJSON("GET", "/admin/v1/keys", e.keyA, nil)
	require.Equal(t, 401, st, "listing keys needs the admin key")

	// Rotation with a grace: both keys work, the new one keeps the scope.
	st, out = e.doJSON("POST", fmt.Sprintf("/admin/v1/keys/%d/rotate", scopedID), admin, map[string]any{"grace": "1h"})
	require.Equal(t, 201, st, out)
	rotated := out["api_key"].(string)
	rotatedID := int64(out["key"].(map[string]any)["id"].(float64))
	require.Equal(t, float64(scopedID), out["key"].(map[string]any)["rotated_from"])
	require.Equal(t, 200, chat(scoped, fixtureModel), "the old key works during the grace")
	require.Equal(t, 200, chat(rotated, fixtureModel))
	require.Equal(t, 403, chat(rotated, "other-model"))
	st, _ = e.doJSON("POST", "/admin/v1/keys/bogus/rotate", admin, nil)
	require.Equal(t, 400, st)
	st, _ = e.doJSON("POST", "/admin/v1/keys/999999999/rotate", admin, nil)
	require.Equal(t, 404, st)
	st, _ = e.doJSON("POST", fmt.Sprintf("/admin/v1/keys/%d/rotate", scopedID), admin, map[string]any{"grace": "a while"})
	require.Equal(t, 422, st)

	// Revocation takes effect at once, despite the minute-long key cache,
	// and reaches the session keys the key issued.
	st, out = e.doJSON("POST", fmt.Sprintf("/admin/v1/keys/%d/revoke", scopedID), admin, nil)
	require.Equal(t, 200, st, out)
	require.NotEmpty(t, out["key"].(map[string]any)["revoked_at"])
	st, _, body = e.do("POST", "/v1/chat/completions", scoped, map[string]any{"model": fixtureModel,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, 401, st)
	require.Contains(t, string(body), "revoked or expired")
	require.Equal(t, 401, chat(sessionKey, fixtureModel), "the session key went with its parent")
	require.Equal(t, 200, chat(rotated, fixtureModel), "the rotated key is a key of its own")
	st, _ = e.doJSON("POST", fmt.Sprintf("/admin/v1/keys/%d/rotate", scopedID), admin, nil)
	require.Equal(t, 409, st, "a revoked key cannot rotate")
	st, _ = e.doJSON("POST", "/admin/v1/keys/999999999/revoke", admin, nil)
	require.Equal(t, 404, st)
	st, out = e.doJSON("GET", "/admin/v1/keys?tenant=acme", admin, nil)
	require.Equal(t, 200, st)
	require.NotContains(t, listedIDs(out), scopedID, "revoked keys are listed only with all=true")
	require.Contains(t, listedIDs(out), rotatedID)

	// Rotation without grace ends the old key at once.
	st, out = e.doJSON("POST", fmt.Sprintf("/admin/v1/keys/%d/rotate", rotatedID), admin, nil)
	require.Equal(t, 201, st, out)
	require.Equal(t, 401, chat(rotated, fixtureModel))
	require.Equal(t, 200, chat(out["api_key"].(string), fixtureModel))

	// Expiry: a key ends at its time even when it sits in the cache.
	st, out = e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme",
		"expires_at": time.Now().Add(1500 * time.Millisecond).Format(time.RFC3339Nano)})
	require.Equal(t, 201, st, out)
	short := out["api_key"].(string)
	require.Equal(t, 200, chat(short, fixtureModel))
	require.Eventually(t, func() bool { return chat(short, fixtureModel) == 401 }, 10*time.Second, 100*time.Millisecond)
}

func modelIDs(list map[string]any) []string {
	var out []string
	for _, m := range list["data"].([]any) {
		out = append(out, m.(map[string]any)["id"].(string))
	}
	return out
}

func listedIDs(list map[string]any) []int64 {
	var out []int64
	for _, k := range list["data"].([]any) {
		out = append(out, int64(k.(map[string]any)["id"].(float64)))
	}
	return out
}

// TestTokenBudgetIsEnforced: a key with a token budget is served until its
// accounted tokens reach the budget, then gets 429 insufficient_quota with
// Retry-After until the period renews; its session keys spend the same
// budget, and other keys are not affected. A bad budget is a 422.
func TestTokenBudgetIsEnforced(t *testing.T) {
	e := newEnv(t, envOpts{})
	admin := e.cfg.AdminKey
	st, out := e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "name": "budgeted", "token_budget": 60})
	require.Equal(t, 201, st, out)
	key := out["api_key"].(string)
	meta := out["key"].(map[string]any)
	require.EqualValues(t, 60, meta["token_budget"])
	require.Equal(t, "day", meta["budget_period"])

	chat := func(k string) (int, http.Header, []byte) {
		return e.do("POST", "/v1/chat/completions", k, map[string]any{"model": fixtureModel, "max_tokens": 8,
			"messages": []any{map[string]any{"role": "user", "content": "count these tokens please"}}})
	}
	served := 0
	var status int
	var hdr http.Header
	var body []byte
	for range 40 {
		status, hdr, body = chat(key)
		if status != 200 {
			break
		}
		served++
		time.Sleep(1100 * time.Millisecond / 10) // the budget is read at most once a second
	}
	require.Positive(t, served, "served while under budget")
	require.Equal(t, 429, status, string(body))
	require.Contains(t, string(body), "insufficient_quota")
	require.Contains(t, string(body), "may use 60 tokens per day")
	require.NotEmpty(t, hdr.Get("Retry-After"))
	secs, _ := strconv.Atoi(hdr.Get("Retry-After"))
	require.LessOrEqual(t, secs, 86400, "it renews within the day")

	st, out = e.doJSON("POST", "/v1/sessions", key, map[string]any{"model": fixtureModel})
	require.Equal(t, 201, st, out)
	status, _, _ = chat(out["api_key"].(string))
	require.Equal(t, 429, status, "a session key spends its parent's budget")
	status, _, _ = chat(e.keyA)
	require.Equal(t, 200, status, "other keys are not affected")

	for _, bad := range []map[string]any{
		{"tenant": "acme", "token_budget": -1},
		{"tenant": "acme", "token_budget": 10, "budget_period": "week"},
	} {
		st, out := e.doJSON("POST", "/admin/v1/keys", admin, bad)
		require.Equal(t, 422, st, "%v: %v", bad, out)
	}
}

// TestKeyMetadata: a key's name and labels are set when it is created,
// listed with it (never its secret), kept by a rotation, and bounded with
// clear errors.
func TestKeyMetadata(t *testing.T) {
	e := newEnv(t, envOpts{})
	admin := e.cfg.AdminKey
	labels := map[string]any{"team": "search", "env": "prod", "cost-centre": ""}
	st, out := e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "name": "search backend", "labels": labels})
	require.Equal(t, 201, st, out)
	secret := out["api_key"].(string)
	created := out["key"].(map[string]any)
	require.Equal(t, "search backend", created["name"])
	require.Equal(t, labels, created["labels"])
	id := int64(created["id"].(float64))

	st, _, raw := e.do("GET", "/admin/v1/keys?tenant=acme", admin, nil)
	require.Equal(t, 200, st)
	require.NotContains(t, string(raw), secret[len("fw-"):], "a listing never holds a secret")
	var list struct {
		Data []map[string]any `json:"data"`
	}
	require.NoError(t, json.Unmarshal(raw, &list))
	byID := map[int64]map[string]any{}
	for _, k := range list.Data {
		byID[int64(k["id"].(float64))] = k
	}
	require.Equal(t, labels, byID[id]["labels"])
	require.Equal(t, "search backend", byID[id]["name"])
	for kid, k := range byID {
		if kid != id {
			require.Equal(t, map[string]any{}, k["labels"], "a key without labels lists {}")
		}
	}

	st, out = e.doJSON("POST", fmt.Sprintf("/admin/v1/keys/%d/rotate", id), admin, nil)
	require.Equal(t, 201, st, out)
	require.Equal(t, labels, out["key"].(map[string]any)["labels"], "a rotated key keeps its labels")
	require.Equal(t, "search backend", out["key"].(map[string]any)["name"])

	many := map[string]string{}
	for i := range 17 {
		many[fmt.Sprint("l", i)] = "v"
	}
	for want, bad := range map[string]map[string]any{
		"labels: at most 16 labels, got 17":     {"labels": many},
		"label key \"\": want 1..64 characters": {"labels": map[string]string{"": "x"}},
		"want 1..64 characters, got 65":         {"labels": map[string]string{strings.Repeat("k", 65): "x"}},
		"label \"team\"":                        {"labels": map[string]string{"team": strings.Repeat("v", 257)}},
		"want 0..256 characters, got 257":       {"labels": map[string]string{"team": strings.Repeat("v", 257)}},
		"control characters are not allowed":    {"labels": map[string]string{"team": "a\nb"}},
		"want 0..128 characters, got 129":       {"name": strings.Repeat("n", 129)},
	} {
		bad["tenant"] = "acme"
		st, out := e.doJSON("POST", "/admin/v1/keys", admin, bad)
		require.Equal(t, 422, st, "%s: %v", want, out)
		require.Contains(t, out["error"].(map[string]any)["message"], want)
	}
	st, out = e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "labels": map[string]any{"team": 1}})
	require.Equal(t, 400, st, "a label value that is not a string is not JSON this API reads: %v", out)
	st, out = e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "labels": []string{"team"}})
	require.Equal(t, 400, st, out)
}
