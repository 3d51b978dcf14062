package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/statusapi"
	"github.com/flywheel-ai/flywheel/store"
)

var (
	usageSample = regexp.MustCompile(`(?m)^flywheel_gateway_usage_(requests|prompt_tokens|completion_tokens)_total\{([^}]*)\} (\S+)$`)
	labelPair   = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// TestUsageMetricsAndStatusPerTenant: the usage series count each captured
// call to its tenant, tenant key (by id, a session key's to its parent;
// never a secret) and model, as usage_daily does; the status view sums the
// same usage for the tenant, per deployment and in all.
func TestUsageMetricsAndStatusPerTenant(t *testing.T) {
	e := newEnv(t, envOpts{cfg: func(c *config.GatewayConfig) { c.UpstreamModels = []string{fixtureModel, "other-model"} }})
	ctx := context.Background()
	ownerA, err := store.LookupKey(ctx, e.pool, e.keyA)
	require.NoError(t, err)
	ownerB, err := store.LookupKey(ctx, e.pool, e.keyB)
	require.NoError(t, err)

	st, out := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel})
	require.Equal(t, 201, st, out)
	sessionKey := out["api_key"].(string)
	for _, call := range []struct{ key, model string }{{e.keyA, fixtureModel}, {sessionKey, fixtureModel}, {e.keyA, "other-model"}, {e.keyB, fixtureModel}} {
		body := chatBody("count me")
		body["model"] = call.model
		st, out := e.doJSON("POST", "/v1/chat/completions", call.key, body)
		require.Equal(t, 200, st, out)
	}
	e.fixture.FailNext.Store(1)
	st, _ = e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("this one fails"))
	require.Equal(t, 503, st)

	// What Postgres accounted is what the series say.
	type series struct{ requests, prompt, completion float64 }
	want := map[string]series{}
	rows, err := e.pool.Query(ctx, `SELECT tenant_id, key_id, deployment, requests, prompt_tokens, completion_tokens FROM usage_daily`)
	require.NoError(t, err)
	for rows.Next() {
		var tenant, dep string
		var key, n, p, c int64
		require.NoError(t, rows.Scan(&tenant, &key, &dep, &n, &p, &c))
		want[fmt.Sprintf("%s/%d/%s", tenant, key, dep)] = series{float64(n), float64(p), float64(c)}
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 3, "acme's key on two models, globex's on one")
	require.Equal(t, 3.0, want[fmt.Sprintf("acme/%d/%s", ownerA.KeyID, fixtureModel)].requests, "the session key's call counts to its parent, the failed call too")

	_, _, raw := e.do("GET", "/metrics", "", nil)
	for _, secret := range []string{e.keyA, e.keyB, sessionKey} {
		require.NotContains(t, string(raw), secret[len(store.KeyPrefix):], "no key's secret is a label")
	}
	got := map[string]series{}
	for _, m := range usageSample.FindAllStringSubmatch(string(raw), -1) {
		labels := map[string]string{}
		for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
			labels[l[1]] = l[2]
		}
		require.Len(t, labels, 3, "%s: %v", m[0], labels)
		v, err := strconv.ParseFloat(m[3], 64)
		require.NoError(t, err)
		k := labels["tenant"] + "/" + labels["key"] + "/" + labels["model"]
		s := got[k]
		switch m[1] {
		case "requests":
			s.requests = v
		case "prompt_tokens":
			s.prompt = v
		case "completion_tokens":
			s.completion = v
		}
		got[k] = s
	}
	require.Equal(t, want, got)
	require.Contains(t, got, fmt.Sprintf("globex/%d/%s", ownerB.KeyID, fixtureModel))

	// The status view: acme's usage, in all and per deployment.
	var acme statusapi.Status
	st, _, raw = e.do("GET", "/v1/status", e.keyA, nil)
	require.Equal(t, 200, st, string(raw))
	require.NoError(t, json.Unmarshal(raw, &acme))
	u := acme.Usage
	a, o := want[fmt.Sprintf("acme/%d/%s", ownerA.KeyID, fixtureModel)], want[fmt.Sprintf("acme/%d/other-model", ownerA.KeyID)]
	require.EqualValues(t, a.requests+o.requests, u.Requests)
	require.EqualValues(t, 1, u.Errors)
	require.EqualValues(t, a.prompt+o.prompt, u.PromptTokens)
	require.EqualValues(t, a.completion+o.completion, u.CompletionTokens)
	require.Len(t, u.Deployments, 2)
	require.ElementsMatch(t, []string{fixtureModel, "other-model"}, []string{u.Deployments[0].Deployment, u.Deployments[1].Deployment})
	require.NotEmpty(t, u.Since)

	var only statusapi.Status
	st, _, raw = e.do("GET", "/v1/status?deployment=other-model", e.keyA, nil)
	require.Equal(t, 200, st, string(raw))
	require.NoError(t, json.Unmarshal(raw, &only))
	require.EqualValues(t, o.requests, only.Usage.Requests, "a deployment's view has its usage only")

	var globex statusapi.Status
	st, _, raw = e.do("GET", "/v1/status", e.keyB, nil)
	require.Equal(t, 200, st, string(raw))
	require.NoError(t, json.Unmarshal(raw, &globex))
	require.EqualValues(t, 1, globex.Usage.Requests, "each tenant sees its own usage")

	st, _, raw = e.do("GET", "/status", e.keyA, nil)
	require.Equal(t, 200, st)
	require.Contains(t, string(raw), "<h2>Usage</h2>")
	require.Contains(t, string(raw), fmt.Sprintf(`<th>all</th><th class="n">%d</th>`, u.Requests))
}
