package gateway_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/store"
)

// TestUsageIsAccountedAtCapture: every acknowledged call is counted once,
// to the tenant key that made it (a session key's parent), in the capture's
// own commit, batched or not; errors count as requests without tokens;
// forgetting the data does not erase what it cost; each tenant sees its
// own.
func TestUsageIsAccountedAtCapture(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	ownerA, err := store.LookupKey(ctx, e.pool, e.keyA)
	require.NoError(t, err)

	st, out := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel})
	require.Equal(t, 201, st, out)
	sessionKey, sessionID := out["api_key"].(string), out["id"].(string)
	for _, key := range []string{e.keyA, e.keyA, sessionKey} {
		st, _ := e.doJSON("POST", "/v1/chat/completions", key, chatBody("count this call"))
		require.Equal(t, 200, st)
	}
	e.fixture.FailNext.Store(1)
	st, _ = e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("this one fails"))
	require.Equal(t, 503, st)
	// Concurrent calls commit in shared batches.
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, _ := e.doJSON("POST", "/v1/chat/completions", e.keyB, chatBody(fmt.Sprint("batched ", i)), "X-Session-Id", fmt.Sprint("b-", i))
			require.Equal(t, 200, st)
		}()
	}
	wg.Wait()

	var wantPrompt, wantCompletion int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT sum(prompt_tokens), sum(completion_tokens) FROM interactions WHERE tenant_id = 'acme'`).
		Scan(&wantPrompt, &wantCompletion))
	require.Positive(t, wantPrompt)
	st, out = e.doJSON("GET", "/v1/usage", e.keyA, nil)
	require.Equal(t, 200, st, out)
	rows := out["data"].([]any)
	require.Len(t, rows, 1, "one key, one deployment: %v", rows)
	row := rows[0].(map[string]any)
	require.Equal(t, "acme", row["tenant"])
	require.Equal(t, float64(ownerA.KeyID), row["key_id"], "the session key's calls count to the key that made the session")
	require.Equal(t, fixtureModel, row["deployment"])
	require.Equal(t, 4.0, row["requests"])
	require.Equal(t, 1.0, row["errors"])
	require.Equal(t, float64(wantPrompt), row["prompt_tokens"])
	require.Equal(t, float64(wantCompletion), row["completion_tokens"])

	_, outB := e.doJSON("GET", "/v1/usage", e.keyB, nil)
	require.Equal(t, 24.0, outB["total"].(map[string]any)["requests"], "every batched call counted once")
	_, all := e.doJSON("GET", "/admin/v1/usage", e.cfg.AdminKey, nil)
	require.Equal(t, 28.0, all["total"].(map[string]any)["requests"])

	// Forgetting the session leaves its cost.
	st, out = e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"session_id": sessionID})
	require.Equal(t, 200, st, out)
	require.Equal(t, 1.0, out["deleted"].(map[string]any)["interactions"])
	_, again := e.doJSON("GET", "/v1/usage", e.keyA, nil)
	require.Equal(t, 4.0, again["total"].(map[string]any)["requests"])

	today := time.Now().UTC().Format(time.DateOnly)
	_, byDay := e.doJSON("GET", "/v1/usage?by=day&since="+today, e.keyA, nil)
	require.Equal(t, today, byDay["data"].([]any)[0].(map[string]any)["day"])
	_, none := e.doJSON("GET", "/v1/usage?until="+today, e.keyA, nil)
	require.Empty(t, none["data"], "until is exclusive")
	for _, bad := range []string{"?by=week", "?since=yesterday", "?key_id=x"} {
		st, _ := e.doJSON("GET", "/v1/usage"+bad, e.keyA, nil)
		require.Equal(t, 400, st, bad)
	}
	st, _ = e.doJSON("GET", "/v1/usage", sessionKey, nil)
	require.Equal(t, 403, st, "a per-session key does not see the tenant's usage")
}
