package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/statusapi"
	"github.com/flywheel-ai/flywheel/store"
)

// statusFixture gives tenant acme two sessions on the fixture model (one
// rewarded 1 at its end) and the control plane a gated release and a
// decision about that deployment.
type statusFixture struct {
	rewarded, other string
	releaseID       int64
}

func seedStatus(t *testing.T, e *env) statusFixture {
	t.Helper()
	ctx := context.Background()
	var f statusFixture
	st, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel, "task_id": "add"})
	require.Equal(t, 201, st, created)
	f.rewarded = created["id"].(string)
	for _, msg := range []string{"one", "two"} {
		st, out := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("acme secret "+msg))
		require.Equal(t, 200, st, out)
	}
	st, _ = e.doJSON("POST", "/v1/sessions/"+f.rewarded+"/reward", e.keyA, map[string]any{"value": 1})
	require.Equal(t, 201, st)
	f.other = "acme-header-session"
	st, out := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("acme secret three"), "X-Session-Id", f.other)
	require.Equal(t, 200, st, out)

	rel, err := store.BeginRelease(ctx, e.pool, store.Release{Deployment: fixtureModel, Layer: "weights", Candidate: fixtureModel + "@v1", WorkflowID: "rel-status"})
	require.NoError(t, err)
	require.NoError(t, store.RecordGate(ctx, e.pool, rel.ID, "shadow", true, map[string]any{"candidate_error_rate": 0.0, "evaluated": 12.0}))
	require.NoError(t, store.RecordGate(ctx, e.pool, rel.ID, "safety", false, map[string]any{"candidate_pass_rate": 0.5}))
	require.NoError(t, store.FinishRelease(ctx, e.pool, rel.ID, "rolled_back", "safety gate failed"))
	f.releaseID = rel.ID
	_, err = store.RecordDecision(ctx, e.pool, store.DecisionRow{Deployment: fixtureModel, Decision: "weights",
		Evidence: json.RawMessage(`{"sessions": 2, "reward_mean": 1}`), Reason: "enough rewarded sessions", WorkflowID: "evo-status"})
	require.NoError(t, err)
	return f
}

// TestStatusJSONAndCrossTenantProbes reads the status through the API and
// probes it from the other tenant, without a key, with a per-session key
// and with bad input.
func TestStatusJSONAndCrossTenantProbes(t *testing.T) {
	e := newEnv(t, envOpts{})
	f := seedStatus(t, e)

	st, _, raw := e.do("GET", "/v1/status?deployment="+fixtureModel, e.keyA, nil)
	require.Equal(t, 200, st, string(raw))
	var got statusapi.Status
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Equal(t, "acme", got.Tenant)
	require.Len(t, got.Deployments, 1)
	d := got.Deployments[0]
	require.Equal(t, fixtureModel, d.Name)
	require.Len(t, d.Sessions, 2)
	for _, s := range d.Sessions {
		switch s.ID {
		case f.rewarded:
			require.Equal(t, 2, s.Steps)
			require.InDelta(t, 1, *s.Reward, 1e-9)
			require.Equal(t, "add", s.TaskID)
		case f.other:
			require.Equal(t, 1, s.Steps)
			require.Nil(t, s.Reward)
		default:
			t.Fatalf("unexpected session %s", s.ID)
		}
		require.False(t, s.Trained)
		require.Equal(t, store.TrainingSessionOpen, s.Reason)
	}
	require.Len(t, d.Releases, 1)
	r := d.Releases[0]
	require.Equal(t, f.releaseID, r.ID)
	require.Equal(t, "rolled_back", r.Status)
	require.Equal(t, "safety gate failed", r.Reason)
	require.Len(t, r.Gates, 2)
	require.InDelta(t, 12, r.Gates[0].Metrics["evaluated"], 1e-9)
	require.False(t, r.Gates[1].Passed)
	require.Len(t, d.Decisions, 1)
	require.Equal(t, "weights", d.Decisions[0].Decision)
	var rewarded int
	for _, p := range d.Curve.Points {
		rewarded += p.Rewarded
		require.InDelta(t, 1, p.MeanReward, 1e-9)
	}
	require.Equal(t, 2, rewarded, "both steps of the rewarded session score its outcome")
	require.Nil(t, d.Canary)

	st, all := e.doJSON("GET", "/v1/status", e.keyA, nil)
	require.Equal(t, 200, st)
	require.Len(t, all["deployments"], 1)

	// globex has no session on the fixture model: it does not exist for it,
	// through the API or the page, and its own view is empty.
	for _, path := range []string{"/v1/status?deployment=" + fixtureModel, "/status?deployment=" + fixtureModel, "/v1/status?deployment=nope"} {
		st, _, body := e.do("GET", path, e.keyB, nil)
		require.Equal(t, 404, st, "%s → %s", path, body)
		require.NotContains(t, string(body), f.rewarded)
		require.NotContains(t, string(body), "acme")
	}
	st, _, body := e.do("GET", "/v1/status", e.keyB, nil)
	require.Equal(t, 200, st)
	require.NotContains(t, string(body), f.rewarded)
	require.NotContains(t, string(body), "acme secret")
	require.Contains(t, string(body), `"deployments":[]`)

	st, _, _ = e.do("GET", "/v1/status", "", nil)
	require.Equal(t, 401, st)
	_, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{})
	st, _, body = e.do("GET", "/v1/status", created["api_key"].(string), nil)
	require.Equal(t, 403, st, string(body))
	for _, bad := range []string{"soon", "-5m", "100000h"} {
		st, _, body = e.do("GET", "/v1/status?window="+bad, e.keyA, nil)
		require.Equal(t, 400, st, "window=%s → %s", bad, body)
	}
	// A window that ends before the traffic leaves the curve empty.
	st, _, raw = e.do("GET", "/v1/status?window=1ns&deployment="+fixtureModel, e.keyA, nil)
	require.Equal(t, 200, st)
	require.NoError(t, json.Unmarshal(raw, &got))
	require.Empty(t, got.Deployments[0].Curve.Points)
}

// devGateway is a second gateway on e's database that shows tenant acme
// on /status without a key, unless cfg says otherwise.
func devGateway(t *testing.T, e *env, cfg func(*configGateway)) string {
	t.Helper()
	c := e.cfg
	c.StatusDevTenant = "acme"
	if cfg != nil {
		cfg(&c)
	}
	srv, err := gateway.New(c, gateway.Deps{DB: e.pool, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	return ts.URL
}

func getPage(t *testing.T, url, host, key string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}

// TestStatusPageHTML renders the page with a key, keyless on a loopback
// development gateway, and refuses keyless access anywhere else.
func TestStatusPageHTML(t *testing.T) {
	e := newEnv(t, envOpts{})
	f := seedStatus(t, e)
	// A deployment name is whatever a client asked for: it must come out
	// escaped, in the tables and in the chart.
	ctx := context.Background()
	c, err := store.InsertInteraction(ctx, e.pool, &store.NewInteraction{TenantID: "acme", SessionID: "xss", IdentityMode: "header",
		CompletionID: "c-xss", Protocol: "openai", Deployment: "<script>alert(1)</script>", ModelVersion: "<img src=x>",
		Request: json.RawMessage(`{}`), Status: "ok"})
	require.NoError(t, err)
	_, err = store.InsertReward(ctx, e.pool, store.NewReward{TenantID: "acme", SessionID: "xss", InteractionID: c.ID, Value: 0.5, Source: "user"})
	require.NoError(t, err)

	st, ctype, page := getPage(t, e.url+"/status", "", e.keyA)
	require.Equal(t, 200, st, page)
	require.Equal(t, "text/html; charset=utf-8", ctype)
	for _, want := range []string{`<meta http-equiv="refresh" content="5">`, "tenant <b>acme</b>", fixtureModel, "<svg", "mean reward",
		f.rewarded, "✓ shadow", "✗ safety", "rolled_back", "safety gate failed", "enough rewarded sessions", "evaluated=12",
		"session_open", `<span class="rolled_back">rolled_back 1</span>`, "&lt;script&gt;alert(1)&lt;/script&gt;", "&lt;img src=x&gt;"} {
		require.Contains(t, page, want)
	}
	require.NotContains(t, page, "<script")
	require.NotContains(t, page, "<img")
	for _, external := range []string{"<link", `src="`, "@import", "url("} {
		require.NotContains(t, page, external, "the page loads nothing from elsewhere")
	}
	require.Equal(t, 2, strings.Count(page, "<svg"), "one curve per deployment")

	st, _, page = getPage(t, e.url+"/status?deployment="+fixtureModel, "", e.keyA)
	require.Equal(t, 200, st)
	require.Equal(t, 1, strings.Count(page, "<svg"))
	require.NotContains(t, page, "alert(1)")

	// Keyless, a loopback gateway shows its dev tenant ("default" unless
	// configured), never acme's data.
	st, _, page = getPage(t, e.url+"/status", "", "")
	require.Equal(t, 200, st, page)
	require.Contains(t, page, "tenant <b>default</b>")
	require.NotContains(t, page, f.rewarded)
	off := devGateway(t, e, func(c *configGateway) { c.StatusDevTenant = "" })
	st, _, _ = getPage(t, off+"/status", "", "")
	require.Equal(t, 401, st, "no dev tenant: the page needs a key even on loopback")

	dev := devGateway(t, e, nil)
	st, _, page = getPage(t, dev+"/status?deployment="+fixtureModel, "", "")
	require.Equal(t, 200, st, page)
	require.Contains(t, page, f.rewarded)
	st, _, page = getPage(t, dev+"/status", "", e.keyB)
	require.Equal(t, 200, st, "a key still picks its own tenant")
	require.NotContains(t, page, f.rewarded)
	st, _, _ = getPage(t, dev+"/v1/status", "", "")
	require.Equal(t, 401, st, "the JSON API always needs a key")
	st, _, _ = getPage(t, dev+"/status", "flywheel.example.com", "")
	require.Equal(t, 401, st, "a page served under another name (DNS rebinding) gets nothing")

	public := devGateway(t, e, func(c *configGateway) { c.Listen = "0.0.0.0:8080"; c.AdminKey = "a-real-admin-key-for-this-test" })
	st, _, _ = getPage(t, public+"/status", "", "")
	require.Equal(t, 401, st, "a gateway listening beyond loopback never shows a tenant without a key")
	st, _, _ = getPage(t, public+"/status", "", e.keyA)
	require.Equal(t, 200, st)
}
