package gateway_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/store"
)

// TestUpstreamDeploymentsThroughTheAdminAPI: an upstream registered
// through the admin API serves under its name within a second, captures
// like a configured one, and moves when its config changes.
func TestUpstreamDeploymentsThroughTheAdminAPI(t *testing.T) {
	e := newEnv(t, envOpts{})
	admin := e.cfg.AdminKey
	first, second := &fakevllm.Fixture{Model: "served-a"}, &fakevllm.Fixture{Model: "served-b"}
	srvA, srvB := httptest.NewServer(first), httptest.NewServer(second)
	t.Cleanup(srvA.Close)
	t.Cleanup(srvB.Close)
	urlA := srvA.URL

	st, out := e.doJSON("POST", "/admin/v1/deployments", admin, map[string]any{"name": "team-model",
		"upstream": map[string]any{"base_url": urlA + "/v1", "model": "served-a", "timeout": "5s", "retries": 1}})
	require.Equal(t, 201, st, out)
	require.Equal(t, "upstream", out["backend"])
	require.Equal(t, "served-a", out["config"].(map[string]any)["model"])

	chat := func() (int, map[string]any) {
		return e.doJSON("POST", "/v1/chat/completions", e.keyA, map[string]any{"model": "team-model",
			"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	}
	st, resp := chat()
	require.Equal(t, 200, st, resp)
	require.Equal(t, "served-a", first.LastRequest()["model"], "the server is asked for its own model name")
	row := e.captured(resp["id"].(string))
	require.Equal(t, "ok", row.Status)
	require.NotEmpty(t, row.CompletionIDs, "token ids are captured as for a configured upstream")
	_, models := e.doJSON("GET", "/v1/models", e.keyA, nil)
	require.Contains(t, modelIDs(models), "team-model")

	// Refusals.
	for _, c := range []struct {
		body   map[string]any
		status int
	}{
		{map[string]any{"name": "team-model", "upstream": map[string]any{"base_url": urlA + "/v1"}}, 409},
		{map[string]any{"name": fixtureModel, "upstream": map[string]any{"base_url": urlA + "/v1"}}, 409},
		{map[string]any{"name": "x", "upstream": map[string]any{"base_url": "ftp://nowhere"}}, 422},
		{map[string]any{"name": "x", "upstream": map[string]any{"base_url": urlA, "timeout": "soon"}}, 422},
		{map[string]any{"name": "x", "upstream": map[string]any{"base_url": urlA, "retries": 99}}, 422},
		{map[string]any{"name": "x", "upstream": map[string]any{"base_url": urlA, "api_key_env": "not an env"}}, 422},
		{map[string]any{"name": "x", "upstream": map[string]any{"base_url": urlA, "base_ulr": "typo"}}, 400},
		{map[string]any{"name": "has space", "upstream": map[string]any{"base_url": urlA}}, 422},
		{map[string]any{"name": "a@v1", "upstream": map[string]any{"base_url": urlA}}, 422},
		{map[string]any{"name": "x"}, 422},
	} {
		st, out := e.doJSON("POST", "/admin/v1/deployments", admin, c.body)
		require.Equal(t, c.status, st, "%v: %v", c.body, out)
	}
	st, _ = e.doJSON("POST", "/admin/v1/deployments", e.keyA, map[string]any{"name": "y", "upstream": map[string]any{"base_url": urlA}})
	require.Equal(t, 401, st, "registering needs the admin key")

	// List and show.
	st, out = e.doJSON("GET", "/admin/v1/deployments", admin, nil)
	require.Equal(t, 200, st)
	var names []string
	for _, d := range out["data"].([]any) {
		names = append(names, d.(map[string]any)["name"].(string))
	}
	require.Contains(t, names, "team-model")
	st, out = e.doJSON("GET", "/admin/v1/deployments/team-model", admin, nil)
	require.Equal(t, 200, st)
	require.Equal(t, urlA+"/v1", out["config"].(map[string]any)["base_url"])
	st, out = e.doJSON("GET", "/admin/v1/deployments/"+fixtureModel, admin, nil)
	require.Equal(t, 200, st, "a configured upstream model is a deployment too")
	require.Equal(t, "upstream", out["backend"])
	require.Equal(t, e.cfg.UpstreamURL, out["config"].(map[string]any)["base_url"])
	require.Equal(t, fixtureModel, out["config"].(map[string]any)["model"])
	st, _ = e.doJSON("GET", "/admin/v1/deployments/nope", admin, nil)
	require.Equal(t, 404, st)

	// Update: the route moves to the other server within the route TTL.
	st, out = e.doJSON("PUT", "/admin/v1/deployments/team-model", admin, map[string]any{
		"upstream": map[string]any{"base_url": srvB.URL + "/v1", "model": "served-b"}})
	require.Equal(t, 200, st, out)
	require.Eventually(t, func() bool {
		st, _ := chat()
		return st == 200 && second.Requests.Load() > 0
	}, 10*time.Second, 100*time.Millisecond, "requests reach the new upstream")
	require.Equal(t, "served-b", second.LastRequest()["model"])
	st, _ = e.doJSON("PUT", "/admin/v1/deployments/nope", admin, map[string]any{"upstream": map[string]any{"base_url": urlA}})
	require.Equal(t, 404, st)
	st, _ = e.doJSON("PUT", "/admin/v1/deployments/team-model", admin, map[string]any{"name": "renamed",
		"upstream": map[string]any{"base_url": urlA}})
	require.Equal(t, 422, st)
	require.NoError(t, store.UpsertDeployment(context.Background(), e.pool, "local-policy", deployment.BackendPolicy, nil, ""))
	st, _ = e.doJSON("PUT", "/admin/v1/deployments/local-policy", admin, map[string]any{"upstream": map[string]any{"base_url": urlA}})
	require.Equal(t, 409, st, "the in-process policy has no upstream to change")
}
