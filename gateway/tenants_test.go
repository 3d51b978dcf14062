package gateway_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/testenv"
)

// TestTenantsShareSessionIDs: two tenants both name a session "task-42".
// Each gets its own session, steps, rewards, end, export, forget and
// session workflow, and never sees the other's.
func TestTenantsShareSessionIDs(t *testing.T) {
	tc := testenv.Temporal(t)
	n := gateway.NewTemporalNotifier(tc, 50*time.Millisecond, slog.New(slog.DiscardHandler))
	e := newEnv(t, envOpts{notifier: n})
	const sid = "task-42"
	keys := map[string]string{"acme": e.keyA, "globex": e.keyB}
	text := map[string]string{"acme": "acme's private notes", "globex": "globex's private notes"}
	value := map[string]float64{"acme": 1, "globex": -1}
	for _, tenant := range []string{"acme", "globex"} {
		for range map[string]int{"acme": 2, "globex": 1}[tenant] {
			st, body := e.doJSON("POST", "/v1/chat/completions", keys[tenant], chatBody(text[tenant]), "X-Session-Id", sid)
			require.Equal(t, 200, st, "%s: %v", tenant, body)
		}
		st, body := e.doJSON("POST", "/v1/sessions/"+sid+"/reward", keys[tenant], map[string]any{"value": value[tenant]})
		require.Equal(t, 201, st, "%s: %v", tenant, body)
	}
	for tenant, other := range map[string]string{"acme": "globex", "globex": "acme"} {
		st, view := e.doJSON("GET", "/v1/sessions/"+sid, keys[tenant], nil)
		require.Equal(t, 200, st)
		steps := view["steps"].([]any)
		require.Len(t, steps, map[string]int{"acme": 2, "globex": 1}[tenant], tenant)
		last := steps[len(steps)-1].(map[string]any)
		require.Equal(t, value[tenant], last["reward"], "%s's outcome reward binds to its own last step", tenant)
		_, _, export := e.do("GET", "/v1/trajectories?session_id="+sid, keys[tenant], nil)
		require.Contains(t, string(export), text[tenant])
		require.NotContains(t, string(export), text[other])
	}
	for _, tenant := range []string{"acme", "globex"} {
		st, _ := e.doJSON("POST", "/v1/sessions/"+sid+"/end", keys[tenant], nil)
		require.Equal(t, 200, st, tenant)
	}

	// One workflow each, under its tenant, with its own events.
	for tenant, steps := range map[string]int{"acme": 2, "globex": 1} {
		id := flow.SessionWorkflowID(tenant, sid)
		var got []flow.SessionEvent
		eventually(t, func() bool {
			got = got[:0]
			for _, s := range signals(t, tc, id) {
				got = append(got, s.Events...)
			}
			return len(got) == steps+2
		}, tenant+"'s steps, reward and end reach its own workflow")
		hist := tc.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		first, err := hist.Next()
		require.NoError(t, err)
		var input flow.SessionInput
		require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(first.GetWorkflowExecutionStartedEventAttributes().Input, &input))
		require.Equal(t, tenant, input.TenantID)
		require.Equal(t, sid, input.SessionID)
	}

	// Forgetting acme's task-42 leaves globex's whole.
	st, res := e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"session_id": sid})
	require.Equal(t, 200, st, res)
	require.Equal(t, []any{sid}, res["sessions"])
	_, view := e.doJSON("GET", "/v1/sessions/"+sid, e.keyA, nil)
	require.Equal(t, "forgotten", view["status"])
	_, view = e.doJSON("GET", "/v1/sessions/"+sid, e.keyB, nil)
	require.Equal(t, "ended", view["status"])
	steps := view["steps"].([]any)
	require.Len(t, steps, 1)
	require.Equal(t, value["globex"], steps[0].(map[string]any)["reward"], "globex's reward survives acme's forget")
	_, _, export := e.do("GET", "/v1/trajectories?session_id="+sid, e.keyB, nil)
	require.Contains(t, string(export), text["globex"])
}

// TestForgetCleansArtefacts: forgetting a session removes the playbook
// lessons and tool overrides it taught from every version, and a clean
// version serves at once; other sessions' and other tenants' lessons stay,
// and no other tenant's lesson ever reaches a prompt.
func TestForgetCleansArtefacts(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	for _, sid := range []string{"taught-1", "taught-2"} {
		st, _ := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("hi"), "X-Session-Id", sid)
		require.Equal(t, 200, st)
	}
	_, err := e.pool.Exec(ctx, `INSERT INTO artefacts (deployment, kind, version, content, status) VALUES
		($1, 'playbook', 1, '{"items":[{"id":"p1","content":"forgotten lesson","tenant":"acme","sessions":["taught-1"]}]}', 'superseded'),
		($1, 'playbook', 2, '{"items":[{"id":"p1","content":"forgotten lesson","tenant":"acme","sessions":["taught-1","x"]},
			{"id":"p2","content":"kept lesson","tenant":"acme","sessions":["taught-2"]},
			{"id":"p3","content":"globex lesson","tenant":"globex","sessions":["taught-1"]}]}', 'serving'),
		($1, 'tool_schema', 1, '{"tenants":{"acme":{"search":{"description":"forgotten tool text","sessions":["taught-1"]}}}}', 'serving')`, fixtureModel)
	require.NoError(t, err)
	injected := func(key string) string {
		_, c := e.doJSON("POST", "/v1/chat/completions", key, chatBody("q"))
		var req struct {
			Injected string `json:"injected_system"`
		}
		require.NoError(t, json.Unmarshal(e.captured(c["id"].(string)).Request, &req))
		return req.Injected
	}
	eventually(t, func() bool { return strings.Contains(injected(e.keyA), "forgotten lesson") }, "the serving playbook applies")
	require.NotContains(t, injected(e.keyA), "globex lesson")

	st, res := e.doJSON("POST", "/v1/forget", e.keyA, map[string]any{"session_id": "taught-1"})
	require.Equal(t, 200, st, res)
	require.ElementsMatch(t, []any{fixtureModel + "/playbook:3", fixtureModel + "/tool_schema:2"}, res["clean_artefacts"])
	var leftovers int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM artefacts WHERE content::text LIKE '%forgotten%'`).Scan(&leftovers))
	require.Zero(t, leftovers, "no version, serving or not, keeps what the session taught")
	var serving []string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT array_agg(kind || ':' || version ORDER BY kind) FROM artefacts WHERE status = 'serving'`).Scan(&serving))
	require.Equal(t, []string{"playbook:3", "tool_schema:2"}, serving)

	eventually(t, func() bool { return !strings.Contains(injected(e.keyA), "forgotten lesson") }, "the clean version serves")
	got := injected(e.keyA)
	require.Contains(t, got, "kept lesson")
	require.NotContains(t, got, "globex lesson")
	require.Contains(t, injected(e.keyB), "globex lesson", "globex's lesson from its own session of that name stays")
}

// TestArtefactCanaryRouting: while an artefact release is in its canary,
// its share of sessions is served under the candidate artefact (sticky per
// session), and every call records which artefact versions served it.
func TestArtefactCanaryRouting(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `INSERT INTO artefacts (deployment, kind, version, content, status) VALUES
		($1, 'harness', 1, '{"system_prompt":"serving harness"}', 'serving'), ($1, 'harness', 2, '{"system_prompt":"candidate harness"}', 'candidate')`, fixtureModel)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, `INSERT INTO releases (deployment, layer, candidate, canary_share) VALUES ($1, 'harness', '2', 0.5)`, fixtureModel)
	require.NoError(t, err)
	served := func(session string) (key, injected string) {
		_, c := e.doJSON("POST", "/v1/chat/completions", e.keyA, chatBody("q"), "X-Session-Id", session)
		var req struct {
			Artefacts string `json:"artefacts"`
			Injected  string `json:"injected_system"`
		}
		require.NoError(t, json.Unmarshal(e.captured(c["id"].(string)).Request, &req))
		return req.Artefacts, req.Injected
	}
	seen := map[string]int{}
	for i := range 40 {
		session := "canary-" + strconv.Itoa(i)
		key, injected := served(session)
		seen[key]++
		require.Equal(t, map[string]string{"+harness:1": "serving harness", "+harness:2": "candidate harness"}[key], injected, "%s: the recorded key names what served", session)
		again, _ := served(session)
		require.Equal(t, key, again, "a session stays on its side")
	}
	require.Positive(t, seen["+harness:1"])
	require.Positive(t, seen["+harness:2"])
	require.Equal(t, 40, seen["+harness:1"]+seen["+harness:2"])
}
