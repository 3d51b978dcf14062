package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
)

// offsetClock is the real time moved forward by a test.
type offsetClock struct{ ahead atomic.Int64 }

func (c *offsetClock) Now() time.Time          { return time.Now().Add(time.Duration(c.ahead.Load())) }
func (c *offsetClock) Advance(d time.Duration) { c.ahead.Add(int64(d)) }

// TestTokensPerMinuteLimit: a key's tokens are charged after each call; a
// key that spent its tokens per minute gets 429 rate_limit_exceeded with
// Retry-After and OpenAI's x-ratelimit headers, on both protocols and for
// its session keys, and is served again once the bucket has refilled.
// Each replica enforces its share of the gateway's default; a key's own
// tpm overrides it, 0 lifting it. Bad values are refused.
func TestTokensPerMinuteLimit(t *testing.T) {
	clock := &offsetClock{}
	e := newEnv(t, envOpts{now: clock.Now, cfg: func(c *config.GatewayConfig) {
		c.RateLimitTPM = 100000
		c.Replicas = 2
		c.RateLimitRPS, c.RateLimitBurst = 1000, 2000
	}})
	admin := e.cfg.AdminKey
	chat := func(key string, stream bool) (int, http.Header, []byte) {
		return e.do("POST", "/v1/chat/completions", key, map[string]any{"model": fixtureModel, "max_tokens": 8, "stream": stream,
			"messages": []any{map[string]any{"role": "user", "content": "count these tokens please"}}})
	}

	st, hdr, body := chat(e.keyA, false)
	require.Equal(t, 200, st, string(body))
	require.Equal(t, "50000", hdr.Get("x-ratelimit-limit-tokens"), "each of 2 replicas enforces half the default")
	require.Equal(t, "50000", hdr.Get("x-ratelimit-remaining-tokens"))
	require.Equal(t, "0s", hdr.Get("x-ratelimit-reset-tokens"))
	require.Equal(t, "1000", hdr.Get("x-ratelimit-limit-requests"), "and half the request burst")
	require.Equal(t, "999", hdr.Get("x-ratelimit-remaining-requests"))
	require.NotEmpty(t, hdr.Get("x-ratelimit-reset-requests"))

	st, out := e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "name": "tpm", "tpm": 60})
	require.Equal(t, 201, st, out)
	key := out["api_key"].(string)
	require.EqualValues(t, 60, out["key"].(map[string]any)["tpm"])

	// 60 a minute, 30 on this replica: one call of about 40 tokens is served
	// in full, and overdraws the bucket.
	st, hdr, body = chat(key, false)
	require.Equal(t, 200, st, string(body))
	require.Equal(t, "30", hdr.Get("x-ratelimit-limit-tokens"))
	require.Equal(t, "30", hdr.Get("x-ratelimit-remaining-tokens"))
	var resp struct {
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(body, &resp))
	require.Greater(t, resp.Usage.TotalTokens, 30, "the call must overdraw the bucket for this test")

	st, hdr, body = chat(key, false)
	require.Equal(t, http.StatusTooManyRequests, st, string(body))
	var refusal struct {
		Error struct{ Message, Type, Code string }
	}
	require.NoError(t, json.Unmarshal(body, &refusal))
	require.Equal(t, "rate_limit_exceeded", refusal.Error.Type)
	require.Equal(t, "rate_limit_exceeded", refusal.Error.Code)
	require.Contains(t, refusal.Error.Message, "tokens per min")
	require.Equal(t, "30", hdr.Get("x-ratelimit-limit-tokens"))
	require.Equal(t, "0", hdr.Get("x-ratelimit-remaining-tokens"))
	retry, err := strconv.Atoi(hdr.Get("Retry-After"))
	require.NoError(t, err)
	// Overdrawn by total-30 at half a token a second: one token back in
	// 2*(total-29) seconds.
	require.InDelta(t, 2*(resp.Usage.TotalTokens-29), retry, 1)
	reset, err := time.ParseDuration(hdr.Get("x-ratelimit-reset-tokens"))
	require.NoError(t, err)
	require.Greater(t, reset, time.Duration(retry-1)*time.Second, "full again only after it can serve again")

	st, _, body = chat(key, true)
	require.Equal(t, http.StatusTooManyRequests, st, "a stream is refused before it starts: %s", body)
	st, _, body = e.do("POST", "/v1/messages", key, map[string]any{"model": fixtureModel, "max_tokens": 8,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}}, "anthropic-version", "2023-06-01")
	require.Equal(t, http.StatusTooManyRequests, st, string(body))
	require.Contains(t, string(body), `"rate_limit_error"`, "in Anthropic's shape on Anthropic routes")
	st, out = e.doJSON("POST", "/v1/sessions", key, map[string]any{"model": fixtureModel})
	require.Equal(t, 201, st, "other routes are not token-limited: %v", out)
	st, _, _ = chat(out["api_key"].(string), false)
	require.Equal(t, http.StatusTooManyRequests, st, "a session key spends its parent's tokens per minute")
	st, _, _ = chat(e.keyB, false)
	require.Equal(t, 200, st, "other keys are not affected")

	clock.Advance(time.Duration(retry) * time.Second)
	st, hdr, body = chat(key, false)
	require.Equal(t, 200, st, "served again after Retry-After: %s", body)
	require.Equal(t, "1", hdr.Get("x-ratelimit-remaining-tokens"))

	// tpm 0 lifts the gateway's default for one key.
	st, out = e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "tpm": 0})
	require.Equal(t, 201, st, out)
	st, hdr, _ = chat(out["api_key"].(string), false)
	require.Equal(t, 200, st)
	require.Empty(t, hdr.Get("x-ratelimit-limit-tokens"))

	st, out = e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "tpm": -1})
	require.Equal(t, 422, st, out)
	require.Contains(t, out["error"].(map[string]any)["message"], "tpm: want 0 (no token rate limit) or a positive number")
	st, out = e.doJSON("POST", "/admin/v1/keys", admin, map[string]any{"tenant": "acme", "tpm": "lots"})
	require.Equal(t, 400, st, out)
	require.Contains(t, out["error"].(map[string]any)["message"], "tpm")
}
