package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/atdp/atdpparquet"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
)

func chatBody(text string) map[string]any {
	return map[string]any{"model": fixtureModel, "messages": []any{map[string]any{"role": "user", "content": text}}}
}

// TestSessionKeyRewardsFeedbackExport walks a session through the API: a
// per-session key, two steps, a step reward, late feedback from two
// sources, the end, the diagnostics and the ATDP export.
func TestSessionKeyRewardsFeedbackExport(t *testing.T) {
	e := newEnv(t, envOpts{cfg: func(c *configGateway) { c.RewardWeights = map[string]float64{"user": 1, "judge": 3}; c.Discount = 0.5 }})
	st, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel, "task_id": "t1"})
	require.Equal(t, 201, st, created)
	sid, skey := created["id"].(string), created["api_key"].(string)

	st, c1 := e.doJSON("POST", "/v1/chat/completions", skey, chatBody("first"))
	require.Equal(t, 200, st, c1)
	st, c2 := e.doJSON("POST", "/v1/chat/completions", skey, chatBody("mail me at bob@example.com"))
	require.Equal(t, 200, st)
	require.Equal(t, sid, e.captured(c1["id"].(string)).SessionID)
	require.Equal(t, "key", e.captured(c2["id"].(string)).Mode)

	// Validation: not finite / out of range / unknown fields.
	tooLong, _ := json.Marshal(map[string]any{"value": 1, "feedback": strings.Repeat("x", store.MaxFeedback+1)})
	for _, bad := range []string{`{"value": 5}`, `{"value": "NaN"}`, `{}`, `{"vlaue": 1}`, `{"value": 1, "source": "Bad Source"}`, string(tooLong)} {
		st, _, body := e.do("POST", "/v1/sessions/"+sid+"/reward", e.keyA, bad)
		require.Contains(t, []int{400, 422}, st, "%s → %s", bad, body)
	}
	st, _ = e.doJSON("POST", "/v1/sessions/"+sid+"/reward", skey, map[string]any{"value": 0.5, "completion_id": c1["id"]})
	require.Equal(t, 201, st)
	st, _ = e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": c2["id"], "value": 1, "source": "user"})
	require.Equal(t, 201, st)
	st, _ = e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": c2["id"], "value": -1, "source": "judge",
		"feedback": "the answer ignored the question"})
	require.Equal(t, 201, st)
	var why string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT feedback FROM rewards WHERE session_id = $1 AND source = 'judge'`, sid).Scan(&why))
	require.Equal(t, "the answer ignored the question", why, "the feedback text is kept for the reflector")
	st, _ = e.doJSON("POST", "/v1/sessions/"+sid+"/end", e.keyA, nil)
	require.Equal(t, 200, st)
	st, _ = e.doJSON("POST", "/v1/chat/completions", skey, chatBody("after the end"))
	require.Equal(t, 409, st, "an ended session takes no more steps")

	st, view := e.doJSON("GET", "/v1/sessions/"+sid, e.keyA, nil)
	require.Equal(t, 200, st)
	require.Equal(t, "ended", view["status"])
	steps := view["steps"].([]any)
	require.Len(t, steps, 2)
	s0, s1 := steps[0].(map[string]any), steps[1].(map[string]any)
	// Step 2 merged: (1·1 + 3·(-1)) / 4 = -0.5; step 1's return: 0.5 + 0.5·(-0.5).
	require.InDelta(t, -0.5, s1["reward"], 1e-9)
	require.InDelta(t, 0.25, s0["return"], 1e-9)
	require.Equal(t, true, s0["will_train"], s0)
	require.Equal(t, false, s1["will_train"])
	require.Equal(t, atdp.ReasonRedactedPII, s1["reason"], "the email was redacted and this upstream's tokenizer is not held, so its tokens must not train")

	st, _, body := e.do("GET", "/v1/trajectories?session_id="+sid, e.keyA, nil)
	require.Equal(t, 200, st)
	r := atdp.NewReader(bytes.NewReader(body))
	var exported []*atdp.Step
	for {
		s, err := r.Next()
		if err != nil {
			require.ErrorContains(t, err, "EOF")
			break
		}
		exported = append(exported, s)
	}
	require.Len(t, exported, 2, string(body))
	require.Contains(t, exported[1].Observation.Messages[0].Content, "[REDACTED_EMAIL]")
	require.NotContains(t, string(body), "bob@example.com", "PII never leaves in an export")
	require.Equal(t, []atdp.Redaction{{Kind: "email", Field: "observation.messages[0].content", Count: 1}}, exported[1].Metadata.Redactions[:1])
	require.Equal(t, exported[0].Metadata.StepID, exported[1].Metadata.ParentStepID)
	require.Empty(t, exported[1].Action.Tokens.PromptIDs, "ids an unknown tokenizer made still spell the email: none leave")
	require.NotEmpty(t, exported[0].Action.Tokens.CompletionIDs)
	require.Len(t, exported[0].Action.Tokens.Logprobs, len(exported[0].Action.Tokens.CompletionIDs))

	// `flywheel export` writes the same bytes as the HTTP export.
	var cli bytes.Buffer
	rules, err := trajectory.NewRules(e.cfg, nil)
	require.NoError(t, err)
	n, err := gateway.Export(context.Background(), e.pool, rules, gateway.ExportOptions{Filter: store.SessionFilter{TenantID: "acme", SessionID: sid}}, &cli)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, string(body), cli.String())
	n, err = gateway.Export(context.Background(), e.pool, rules, gateway.ExportOptions{Filter: store.SessionFilter{TenantID: "globex"}}, &cli)
	require.NoError(t, err)
	require.Zero(t, n, "another tenant's export is empty")

	// The same steps as Parquet, through the API and `flywheel export`.
	st, hdr, pq := e.do("GET", "/v1/trajectories?format=parquet&session_id="+sid, e.keyA, nil)
	require.Equal(t, 200, st, string(pq))
	require.Equal(t, "application/vnd.apache.parquet", hdr.Get("Content-Type"))
	rows, err := atdpparquet.Read(bytes.NewReader(pq), int64(len(pq)))
	require.NoError(t, err)
	require.Len(t, rows, 2)
	for i, r := range rows {
		require.Equal(t, exported[i].Metadata.StepID, r.StepID)
		require.Equal(t, len(exported[i].Action.Tokens.CompletionIDs), len(r.CompletionIDs))
		require.Equal(t, exported[i].Metadata.Eligibility.Trainable, r.Trainable)
		require.NotContains(t, r.Observation, "bob@example.com", "PII never leaves in an export")
	}
	require.Contains(t, rows[1].Observation, "[REDACTED_EMAIL]")
	var cliPQ bytes.Buffer
	n, err = gateway.Export(context.Background(), e.pool, rules, gateway.ExportOptions{Filter: store.SessionFilter{TenantID: "acme", SessionID: sid},
		Format: gateway.FormatParquet}, &cliPQ)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, pq, cliPQ.Bytes())
	st, _, body = e.do("GET", "/v1/trajectories?format=xml", e.keyA, nil)
	require.Equal(t, 400, st, string(body))
	require.Contains(t, string(body), "want jsonl or parquet")
}

func TestHeaderAndPathIdentityAndDone(t *testing.T) {
	e := newEnv(t, envOpts{})
	st, c1 := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("one"), "X-Session-Id", "agent-run-1")
	require.Equal(t, 200, st, c1)
	row := e.captured(c1["id"].(string))
	require.Equal(t, "agent-run-1", row.SessionID)
	require.Equal(t, "header", row.Mode)
	stream := chatBody("two")
	stream["stream"] = true
	st, hdr, _ := e.do("POST", "/s/agent-run-2/v1/chat/completions", e.keyA, stream)
	require.Equal(t, 200, st)
	require.Equal(t, "agent-run-2", hdr.Get("X-Session-Id"), "streams name their session in the headers too")
	st, c2 := e.doJSON("POST", "/s/agent-run-2/v1/chat/completions", e.keyA, chatBody("two"))
	require.Equal(t, 200, st)
	require.Equal(t, "path", e.captured(c2["id"].(string)).Mode)
	st, _ = e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("last"), "X-Session-Id", "agent-run-1", "X-Session-Done", "true")
	require.Equal(t, 200, st)
	_, view := e.doJSON("GET", "/v1/sessions/agent-run-1", e.keyA, nil)
	require.Equal(t, "ended", view["status"])
	require.Len(t, view["steps"], 2)
	_, view = e.doJSON("GET", "/v1/sessions/agent-run-2", e.keyA, nil)
	require.Len(t, view["steps"], 2)
	st, _ = e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("x"), "X-Session-Id", "bad id with spaces")
	require.Equal(t, 400, st)
}

// TestCrossTenantProbes: tenant B can neither read nor write anything of
// tenant A's, on any endpoint, and cannot tell it exists (404, not 403).
func TestCrossTenantProbes(t *testing.T) {
	e := newEnv(t, envOpts{})
	st, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"model": fixtureModel, "end_user": "alice"})
	require.Equal(t, 201, st)
	sid := created["id"].(string)
	_, c1 := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("secret plans"))
	cid := c1["id"].(string)
	_, hdr := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("hdr"), "X-Session-Id", "shared-name")
	require.NotEmpty(t, hdr["id"])

	probes := []struct {
		method, path string
		body         any
		headers      []string
	}{
		{"GET", "/v1/sessions/" + sid, nil, nil},
		{"POST", "/v1/sessions/" + sid + "/reward", map[string]any{"value": 1}, nil},
		{"POST", "/v1/sessions/" + sid + "/end", nil, nil},
		{"POST", "/v1/sessions/" + sid + "/consent", map[string]any{"opt_out": true}, nil},
		{"POST", "/v1/feedback", map[string]any{"completion_id": cid, "value": 1}, nil},
		{"GET", "/v1/trajectories?session_id=" + sid, nil, nil},
		{"POST", "/v1/forget", map[string]any{"session_id": sid}, nil},
		{"POST", "/v1/forget", map[string]any{"end_user": "alice"}, nil},
	}
	for _, p := range probes {
		st, _, body := e.do(p.method, p.path, e.keyB, p.body, p.headers...)
		require.Equal(t, 404, st, "%s %s → %s", p.method, p.path, body)
		require.NotContains(t, string(body), "secret plans")
	}
	// Session ids are each tenant's own names: B naming A's ids names
	// sessions of B's, which hold none of A's data.
	for _, p := range [][]string{{"/v1/chat/completions", "X-Session-Id", sid}, {"/s/" + sid + "/v1/chat/completions"},
		{"/v1/chat/completions", "X-Session-Id", "shared-name"}} {
		st, _, body := e.do("POST", p[0], e.keyB, chatBody("hijack"), p[1:]...)
		require.Equal(t, 200, st, "%v → %s", p, body)
		require.NotContains(t, string(body), "secret plans")
	}
	_, bView := e.doJSON("GET", "/v1/sessions/"+sid, e.keyB, nil)
	require.Len(t, bView["steps"], 2, "B's session of that name holds B's two calls")
	// B's unscoped export holds B's calls and nothing of A's.
	st, _, body := e.do("GET", "/v1/trajectories", e.keyB, nil)
	require.Equal(t, 200, st)
	require.Contains(t, string(body), "hijack")
	require.NotContains(t, string(body), "secret plans")
	require.NotContains(t, string(body), "hdr")
	// A's data is untouched by B's attempts.
	_, view := e.doJSON("GET", "/v1/sessions/"+sid, e.keyA, nil)
	require.Equal(t, "open", view["status"])
	require.Len(t, view["steps"], 1)
	require.Empty(t, view["steps"].([]any)[0].(map[string]any)["rewards"])
	// A per-session key reaches only its own session.
	_, other := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{})
	st, _, _ = e.do("GET", "/v1/sessions/"+sid, other["api_key"].(string), nil)
	require.Equal(t, 404, st)
}

func TestForgetSessionAndEndUser(t *testing.T) {
	e := newEnv(t, envOpts{})
	var sids []string
	for range 2 {
		_, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"end_user": "carol"})
		sids = append(sids, created["id"].(string))
		st, _ := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("carol's data"))
		require.Equal(t, 200, st)
	}
	// A version trained on carol's first session: forgetting must name it.
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO model_versions (id, deployment) VALUES ('flywheel-policy@v9', 'flywheel-policy')`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO model_version_lineage (version_id, sample_id, tenant_id, session_id) VALUES ('flywheel-policy@v9', 1, 'acme', $1)`, sids[0])
	require.NoError(t, err)
	st, res := e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"end_user": "carol"})
	require.Equal(t, 200, st, res)
	require.ElementsMatch(t, sids, res["sessions"])
	require.Equal(t, []any{"flywheel-policy@v9"}, res["affected_versions"])
	var recorded []string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT affected_versions FROM forget_requests`).Scan(&recorded))
	require.Equal(t, []string{"flywheel-policy@v9"}, recorded, "the request is kept for lineage")
	require.Equal(t, 0, e.countInteractions())
	var subject string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT subject FROM forget_requests`).Scan(&subject))
	require.True(t, strings.HasPrefix(subject, "sha256:"), "the record does not keep the forgotten identifier")
	st, _, _ = e.do("GET", "/v1/sessions/"+sids[0], e.keyA, nil)
	require.Equal(t, 200, st, "the emptied session remains, marked forgotten")
	st, _ = e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"end_user": "carol"})
	require.Equal(t, 404, st, "nothing left to forget")
}

func TestConsentOptOutBlocksTraining(t *testing.T) {
	e := newEnv(t, envOpts{})
	_, created := e.doJSON("POST", "/v1/sessions", e.keyA, map[string]any{"end_user": "dave"})
	sid := created["id"].(string)
	_, c1 := e.doJSON("POST", "/v1/chat/completions", created["api_key"].(string), chatBody("hi"))
	e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": c1["id"], "value": 1})
	_, view := e.doJSON("GET", "/v1/sessions/"+sid, e.keyA, nil)
	require.Equal(t, true, view["steps"].([]any)[0].(map[string]any)["will_train"])
	st, _ := e.doJSON("PUT", "/v1/end_users/dave/consent", e.keyA, map[string]any{"opt_out": true})
	require.Equal(t, 200, st)
	_, view = e.doJSON("GET", "/v1/sessions/"+sid, e.keyA, nil)
	step := view["steps"].([]any)[0].(map[string]any)
	require.Equal(t, false, step["will_train"])
	require.Equal(t, "opted_out", step["reason"])
	require.Equal(t, "end_user", view["consent"].(map[string]any)["basis"])
}

func TestOperationsLimitsAndMetrics(t *testing.T) {
	e := newEnv(t, envOpts{cfg: func(c *configGateway) { c.RateLimitRPS = 1; c.RateLimitBurst = 2; c.MaxBodyBytes = 2048 }})
	st, hdr, body := e.do("POST", "/v1/chat/completions", e.keyA, `{"model":"`+fixtureModel+`","messages":[{"role":"user","content":"`+strings.Repeat("x", 4096)+`"}]}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, st, string(body))
	require.NotEmpty(t, hdr.Get("X-Request-Id"))
	st, _, body = e.do("POST", "/v1/messages", e.keyA, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"`+strings.Repeat("x", 4096)+`"}]}`)
	require.Equal(t, 413, st)
	require.Contains(t, string(body), `"request_too_large"`, "Anthropic routes answer Anthropic errors")

	var limited *http.Header
	for i := 0; i < 5 && limited == nil; i++ {
		st, h, _ := e.do("POST", "/v1/chat/completions", e.keyA, chatBody("x"), "X-Request-Id", fmt.Sprintf("probe-%d", i))
		require.Equal(t, fmt.Sprintf("probe-%d", i), h.Get("X-Request-Id"))
		if st == 429 {
			limited = &h
		}
	}
	require.NotNil(t, limited, "a key over its rate gets 429")
	require.Equal(t, "1", limited.Get("Retry-After"))
	st, _, _ = e.do("GET", "/v1/models", e.keyB, nil)
	require.Equal(t, 200, st, "limits are per key")

	for _, p := range []string{"/healthz", "/readyz"} {
		st, _, _ := e.do("GET", p, "", nil)
		require.Equal(t, 200, st)
	}
	_, _, metrics := e.do("GET", "/metrics", "", nil)
	sc := bufio.NewScanner(bytes.NewReader(metrics))
	seen := map[string]bool{}
	for sc.Scan() {
		for _, name := range []string{"flywheel_gateway_requests_total", "flywheel_gateway_request_duration_seconds_bucket",
			"flywheel_gateway_capture_batch_size_count", "flywheel_gateway_tokens_total"} {
			if strings.HasPrefix(sc.Text(), name) {
				seen[name] = true
			}
		}
	}
	require.Len(t, seen, 4, string(metrics))
}

func TestAdminKeysAndDefaultKeyRefusal(t *testing.T) {
	e := newEnv(t, envOpts{})
	st, _ := e.doJSON("POST", "/admin/v1/keys", e.keyA, map[string]any{"tenant": "initech"})
	require.Equal(t, 401, st, "a tenant key is not the admin key")
	st, out := e.doJSON("POST", "/admin/v1/keys", e.cfg.AdminKey, map[string]any{"tenant": "initech"})
	require.Equal(t, 201, st)
	st, _, _ = e.do("GET", "/v1/models", out["api_key"].(string), nil)
	require.Equal(t, 200, st)

	cfg := e.cfg
	cfg.Listen = "0.0.0.0:8080"
	_, err := newServer(cfg)
	require.ErrorContains(t, err, "default admin key")

	// Without a database there is nothing to commit a 2xx to: an error,
	// not a panic at the first capture.
	_, err = newServer(e.cfg)
	require.ErrorContains(t, err, "a database is required")
}

func TestToolSchemaOverrideApplied(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO artefacts (deployment, kind, version, content, status) VALUES ($1, 'tool_schema', 3,
		'{"tenants":{"acme":{"search":{"description":"Search the web. Quote exact phrases."}}}}', 'serving')`, fixtureModel)
	require.NoError(t, err)
	body := chatBody("find it")
	body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "search", "description": "old",
		"parameters": map[string]any{"type": "object"}}}}
	st, c1 := e.doJSON("POST", "/v1/chat/completions", e.keyA, body, "X-Session-Id", "tools-1")
	require.Equal(t, 200, st, c1)
	sent := e.fixture.LastRequest()["tools"].([]any)[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "Search the web. Quote exact phrases.", sent["description"])
	_, _, out := e.do("GET", "/v1/trajectories?session_id=tools-1", e.keyA, nil)
	step, err := atdp.Decode(bytes.TrimSpace(out))
	require.NoError(t, err)
	require.Equal(t, "3", step.Observation.Tools[0].Version)
	require.Equal(t, map[string]string{"search": "3"}, step.Metadata.ToolVersions)

	// acme's override is acme's: globex's tool of the same name keeps its own description.
	st, c2 := e.doJSON("POST", "/v1/chat/completions", e.keyB, body, "X-Session-Id", "tools-1")
	require.Equal(t, 200, st, c2)
	sent = e.fixture.LastRequest()["tools"].([]any)[0].(map[string]any)["function"].(map[string]any)
	require.Equal(t, "old", sent["description"])
}

func TestModelsCreatedIsTheDeploymentsOwn(t *testing.T) {
	e := newEnv(t, envOpts{})
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err := e.pool.Exec(context.Background(), `UPDATE deployments SET created_at = $2 WHERE name = $1`, fixtureModel, at)
	require.NoError(t, err)
	created := func() map[string]int64 {
		st, out := e.doJSON("GET", "/v1/models", e.keyA, nil)
		require.Equal(t, 200, st)
		m := map[string]int64{}
		for _, d := range out["data"].([]any) {
			d := d.(map[string]any)
			m[d["id"].(string)] = int64(d["created"].(float64))
		}
		return m
	}
	first := created()
	require.Equal(t, at.Unix(), first[fixtureModel], "a registered deployment is as old as its row")
	time.Sleep(1100 * time.Millisecond)
	require.Equal(t, first, created(), "created does not move between calls")
}
