package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakeopenai"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/statusapi"
	"github.com/flywheel-ai/flywheel/store"
)

// reflectEnv is a real gateway on a real Postgres, routing the deployment
// "reflector" to a fake hosted model (the reflector's role) and the
// evolving deployment "dep" to another (its own engine, which replays
// failed tool calls); the operator's key belongs to tenant "ops".
type reflectEnv struct {
	db               *pgxpool.Pool
	reflector, agent *fakeopenai.Server
	e                *Evolution
	gateway          string
}

var sessionTag = regexp.MustCompile(`\[session ([^\]]+)\]`)

func newReflectEnv(t *testing.T, evo deployment.Evolution) *reflectEnv {
	t.Helper()
	ctx := context.Background()
	db := testenv.Pool(t)
	env := &reflectEnv{db: db, reflector: &fakeopenai.Server{}, agent: &fakeopenai.Server{}}
	for name, fake := range map[string]*fakeopenai.Server{"reflector": env.reflector, "dep": env.agent} {
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		s := deployment.Settings{BaseURL: srv.URL + "/v1", Dialect: deployment.DialectOpenAI}
		if name == "dep" {
			s.Evolution = &evo
		}
		_, err := store.CreateUpstreamDeployment(ctx, db, name, s)
		require.NoError(t, err)
	}
	cfg := config.Default().Gateway
	cfg.RateLimitRPS, cfg.UpstreamRetries = 0, 0
	gw, err := gateway.New(cfg, gateway.Deps{DB: db, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() { ts.Close(); gw.Close() })
	require.NoError(t, store.EnsureTenant(ctx, db, "ops"))
	key, err := store.CreateKey(ctx, db, "ops", "", "operator")
	require.NoError(t, err)
	env.e = &Evolution{DB: db, Redactor: newRedactor(t), Reflector: &GatewayReflector{URL: ts.URL, APIKey: key},
		Backend: &Engines{DB: db}}
	env.gateway = ts.URL
	return env
}

// seedRewarded writes a one-call session of tenant with the user's
// question, the answer, and a session reward with its feedback.
func seedRewarded(t *testing.T, db *pgxpool.Pool, tenant, session, question, answer string, value float64, feedback string, at time.Time) {
	t.Helper()
	seedCall(t, db, tenant, session, "dep", 0, []inference.Message{{Role: "user", Content: question}}, answer, at)
	_, err := db.Exec(context.Background(), `INSERT INTO rewards (tenant_id, session_id, value, final, feedback) VALUES ($1, $2, $3, true, $4)`,
		tenant, session, value, feedback)
	require.NoError(t, err)
}

// TestReflectorProposesPlaybookDeltas: a memory decision asks the
// reflector, through the gateway, once per tenant with failed sessions;
// it reads each tenant's redacted sessions and feedback only, and its
// deltas are curated into the playbook; its calls are the operator's
// opted-out sessions, and the decision says what it spent.
func TestReflectorProposesPlaybookDeltas(t *testing.T) {
	env := newReflectEnv(t, deployment.Evolution{Reflector: "reflector"})
	ctx := context.Background()
	seedTenant(t, env.db, "acme", true)
	seedTenant(t, env.db, "globex", true)
	now := time.Now()
	for i := 0; i < 3; i++ {
		seedRewarded(t, env.db, "acme", fmt.Sprintf("acme-f%d", i), "what's the invoice total for march", "The total is 10.", -1,
			"wrong: the lookup said 12. mail bob@example.com", now.Add(-20*time.Minute))
	}
	seedRewarded(t, env.db, "acme", "acme-ok", "what's the invoice total for may", "The lookup says 7.", 1, "", now.Add(-15*time.Minute))
	seedRewarded(t, env.db, "globex", "globex-f0", "ship to BLUEBIRD-42", "Shipped.", -1, "the address was never confirmed", now.Add(-10*time.Minute))
	seedTenant(t, env.db, "initech", true)
	seedRewarded(t, env.db, "initech", "initech-ok", "hello", "Hi.", 1, "", now.Add(-5*time.Minute))

	env.reflector.Script = func(r fakeopenai.Request) fakeopenai.Reply {
		user := r.Messages[len(r.Messages)-1].Content
		var cite []string
		for _, m := range sessionTag.FindAllStringSubmatch(user, -1) {
			cite = append(cite, m[1])
		}
		lesson := "Confirm the shipping address before shipping."
		if strings.Contains(user, "invoice") {
			lesson = "Quote the total the invoice lookup returned; never estimate it."
		}
		d, _ := json.Marshal(map[string]any{"deltas": []evolution.Delta{
			{Op: evolution.DeltaAdd, Content: lesson, Sessions: cite},
			{Op: evolution.DeltaAdd, Content: "Made up.", Sessions: []string{"sess-not-shown"}},
		}})
		return fakeopenai.Reply{Text: string(d)}
	}
	out, err := env.e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerPlaybook, Window: time.Hour, Key: "k1"})
	require.NoError(t, err)
	require.Equal(t, 1, out.Version, out.Reason)
	require.Equal(t, 2, out.Items)
	require.Contains(t, out.Reason, "tenant acme: 1 added")
	require.Contains(t, out.Reason, "cites none of the sessions it was shown")

	reqs := env.reflector.Requests()
	require.Len(t, reqs, 2, "one reflection per tenant with failed sessions; initech had none")
	first, second := reqs[0].Messages[1].Content, reqs[1].Messages[1].Content
	require.Contains(t, first, "[session acme-f0] outcome -1.00", "acme failed most: it goes first")
	require.Contains(t, first, "[session acme-ok] outcome +1.00", "the reflector sees what went right too")
	require.Contains(t, first, "feedback: wrong: the lookup said 12.")
	require.NotContains(t, first, "bob@example.com", "the evidence is redacted before it leaves")
	require.NotContains(t, first, "globex", "a tenant's reflection reads only its own sessions")
	require.Contains(t, second, "[session globex-f0]")
	require.NotContains(t, second, "acme")
	require.Equal(t, "reflector", reqs[0].Model)

	a, err := store.ArtefactVersion(ctx, env.db, "dep", artefact.LayerPlaybook, "1")
	require.NoError(t, err)
	var set artefact.Set
	require.NoError(t, set.Decode(artefact.LayerPlaybook, a.Content))
	require.Contains(t, set.System("acme"), "Quote the total the invoice lookup returned")
	require.NotContains(t, set.System("globex"), "invoice", "tenant B never sees tenant A's items")
	require.NotContains(t, set.System("acme"), "Made up.")
	for _, it := range set.Playbook.Items {
		if it.Tenant == "acme" {
			require.Equal(t, []string{"acme-f0", "acme-f1", "acme-f2", "acme-ok"}, it.Sessions, "the item cites the sessions it rests on")
		}
	}

	// The reflector's calls are recorded as the operator's sessions,
	// opted out of training, for the reflecting deployment.
	var n, optedOut int
	require.NoError(t, env.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE opt_out) FROM sessions
		WHERE tenant_id = 'ops' AND end_user = $1 AND deployment = 'reflector'`, ReflectorEndUser).Scan(&n, &optedOut))
	require.Equal(t, 2, n)
	require.Equal(t, 2, optedOut)
	var recorded, tokens int
	require.NoError(t, env.db.QueryRow(ctx, `SELECT count(*), COALESCE(sum(prompt_tokens + completion_tokens), 0) FROM interactions
		WHERE tenant_id = 'ops' AND deployment = 'reflector'`).Scan(&recorded, &tokens))
	require.Equal(t, 2, recorded)
	require.Equal(t, tokens, out.ReflectionTokens, "the decision says what it spent: the tokens the gateway metered")
	acme, err := store.ReflectionSpent(ctx, env.db, "acme", now)
	require.NoError(t, err)
	globex, err := store.ReflectionSpent(ctx, env.db, "globex", now)
	require.NoError(t, err)
	require.Equal(t, tokens, acme+globex, "each tenant's reflection is charged to that tenant")

	// Forget removes what a forgotten session taught: acme's item rests
	// on acme-f0 among others, and goes with it.
	forgotten := set
	forgotten.Forget("acme", []string{"acme-f0"})
	require.NotContains(t, forgotten.System("acme"), "invoice")
	require.Contains(t, forgotten.System("globex"), "shipping address")
}

// TestReflectionBudgetHolds: a tenant's daily budget bounds what its
// reflections may cost before they are sent; a decision that cannot
// afford one proposes nothing and says why.
func TestReflectionBudgetHolds(t *testing.T) {
	env := newReflectEnv(t, deployment.Evolution{Reflector: "reflector", DailyTokens: 1500, DecisionTokens: 1500, MaxTokens: 200})
	ctx := context.Background()
	seedTenant(t, env.db, "acme", true)
	now := time.Now()
	seedRewarded(t, env.db, "acme", "acme-f0", "what's the invoice total", "10", -1, "wrong", now.Add(-time.Minute))
	env.reflector.Script = func(r fakeopenai.Request) fakeopenai.Reply {
		return fakeopenai.Reply{Text: `{"deltas": [{"op": "add", "content": "Check the lookup.", "sessions": ["acme-f0"]}]}`}
	}
	out, err := env.e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerPlaybook, Window: time.Hour, Key: "b1"})
	require.NoError(t, err)
	require.Equal(t, 1, out.Version, out.Reason)
	spent, err := store.ReflectionSpent(ctx, env.db, "acme", now)
	require.NoError(t, err)
	require.Equal(t, out.ReflectionTokens, spent)
	require.Positive(t, spent)

	// The next reflection's bound no longer fits the day.
	_, err = env.db.Exec(ctx, `UPDATE reflection_spend SET tokens = 1000 WHERE tenant_id = 'acme'`)
	require.NoError(t, err)
	seedRewarded(t, env.db, "acme", "acme-f1", "and for april", "11", -1, "wrong again", now.Add(-time.Minute))
	out, err = env.e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerPlaybook, Window: time.Hour, Key: "b2"})
	require.NoError(t, err)
	require.Zero(t, out.Version)
	require.Contains(t, out.Reason, "beyond its daily 1500")
	require.Zero(t, out.ReflectionTokens)
	require.Len(t, env.reflector.Requests(), 1, "a reflection the budget cannot cover is never sent")
	spent, err = store.ReflectionSpent(ctx, env.db, "acme", now)
	require.NoError(t, err)
	require.Equal(t, 1000, spent, "a refused reservation leaves the day as it was")

	// No reflector named: nothing reads the sessions.
	_, err = env.db.Exec(ctx, `UPDATE deployments SET config = config - 'evolution' WHERE name = 'dep'`)
	require.NoError(t, err)
	out, err = env.e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerPlaybook, Window: time.Hour, Key: "b3"})
	require.NoError(t, err)
	require.Zero(t, out.Version)
	require.Contains(t, out.Reason, "names no reflector")
}

// TestReflectorRewritesAFailingToolSchema: one tenant's cluster of
// failing tool calls goes to the reflector with the tool's schema and
// errors; the rewrite is proposed only when replaying the failed calls on
// the deployment's engine under it yields arguments the schema accepts
// and the failed calls did not pass.
func TestReflectorRewritesAFailingToolSchema(t *testing.T) {
	env := newReflectEnv(t, deployment.Evolution{Reflector: "reflector"})
	ctx := context.Background()
	seedTenant(t, env.db, "acme", true)
	now := time.Now()
	lookup := inference.Tool{Name: "lookup_invoice", Description: "Looks up an invoice.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"month":{"type":"integer","description":"The month."}},"required":["month"]}`)}
	for i := 0; i < 3; i++ {
		sid := fmt.Sprintf("tool-%d", i)
		ask := []inference.Message{{Role: "user", Content: "invoice total for march? my card is 4111 1111 1111 1111"}}
		call := inference.Message{Role: "assistant", ToolCalls: []inference.ToolCall{{ID: "c1", Name: "lookup_invoice", Arguments: `{"month":"march"}`}}}
		seedToolCall(t, env.db, "acme", sid, 0, ask, []inference.Tool{lookup}, call, now.Add(-10*time.Minute))
		seedToolCall(t, env.db, "acme", sid, 1, append(ask, call, inference.Message{Role: "tool", ToolCallID: "c1", Content: "error: month must be a number"}),
			[]inference.Tool{lookup}, inference.Message{Role: "assistant", Content: "Sorry."}, now.Add(-9*time.Minute))
	}
	ev, err := env.e.ComputeEvidence(ctx, flow.EvidenceInput{Deployment: "dep", Window: time.Hour})
	require.NoError(t, err)
	require.Len(t, ev.ToolFailures, 1)

	// The deployment's model passes a number once the docs say so.
	env.agent.Script = func(r fakeopenai.Request) fakeopenai.Reply {
		args := `{"month":"march"}`
		if len(r.Tools) > 0 && strings.Contains(string(r.Tools[0]), "number 1-12") {
			args = `{"month":3}`
		}
		return fakeopenai.Reply{Calls: [][2]string{{"lookup_invoice", args}}}
	}
	rewrite := `{"description": "Looks up an invoice. month is the month's number 1-12, never its name.", "parameters": {"type":"object","properties":{"month":{"type":"integer","description":"The month as a number 1-12."}},"required":["month"]}}`
	env.reflector.Script = func(fakeopenai.Request) fakeopenai.Reply { return fakeopenai.Reply{Text: rewrite} }
	in := flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerToolSchema, Target: "lookup_invoice", Tenant: "acme", Evidence: ev, Window: time.Hour, Key: "t1"}
	out, err := env.e.ProposeArtefact(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 1, out.Version, out.Reason)
	require.Contains(t, out.Reason, "replayed 3 failed calls of lookup_invoice: 3 valid under the rewrite, 0 under the current schema")
	asked := env.reflector.Requests()[0].Messages[1].Content
	require.Contains(t, asked, `arguments {"month":"march"}`)
	require.Contains(t, asked, "error: month must be a number")
	require.Contains(t, asked, `"type": "integer"`, "the reflector reads the tool's schema")
	require.Equal(t, 1, strings.Count(asked, "error: month must be a number"), "the same failure is shown once")
	a, err := store.ArtefactVersion(ctx, env.db, "dep", artefact.LayerToolSchema, "1")
	require.NoError(t, err)
	var set artefact.Set
	require.NoError(t, set.Decode(artefact.LayerToolSchema, a.Content))
	o := set.ToolSchema.Tenants["acme"]["lookup_invoice"]
	require.Contains(t, o.Description, "never its name")
	require.Equal(t, []string{"tool-0", "tool-1", "tool-2"}, o.Sessions)
	tools, _ := set.Tools("acme", []inference.Tool{lookup})
	require.Contains(t, string(tools[0].Parameters), "number 1-12")
	other, _ := set.Tools("globex", []inference.Tool{lookup})
	require.Equal(t, lookup, other[0], "the override is acme's alone")

	// A rewrite that does not change what the model passes is not proposed.
	env.reflector.Script = func(fakeopenai.Request) fakeopenai.Reply {
		return fakeopenai.Reply{Text: `{"description": "Looks up one invoice."}`}
	}
	in.Key = "t2"
	out, err = env.e.ProposeArtefact(ctx, in)
	require.NoError(t, err)
	require.Zero(t, out.Version)
	require.Contains(t, out.Reason, "0 valid under the rewrite, 0 under the current schema; the rewrite is not proposed")
	// Nor one that changes what the tool accepts.
	env.reflector.Script = func(fakeopenai.Request) fakeopenai.Reply {
		return fakeopenai.Reply{Text: `{"description": "x", "parameters": {"type":"object","properties":{"month":{"type":"string"}}}}`}
	}
	in.Key = "t3"
	out, err = env.e.ProposeArtefact(ctx, in)
	require.NoError(t, err)
	require.Zero(t, out.Version)
	require.Contains(t, out.Reason, "beyond their descriptions")
}

// seedToolCall writes one interaction offering tools whose answer is
// answer (a tool call, or text).
func seedToolCall(t *testing.T, db *pgxpool.Pool, tenant, session string, seq int, msgs []inference.Message, tools []inference.Tool, answer inference.Message, at time.Time) {
	t.Helper()
	ctx := context.Background()
	if seq == 0 {
		_, err := db.Exec(ctx, `INSERT INTO sessions (id, tenant_id, deployment, identity_mode) VALUES ($1, $2, 'dep', 'header')`, session, tenant)
		require.NoError(t, err)
	}
	req, _ := json.Marshal(inference.Request{Model: "dep", Messages: msgs, Tools: tools})
	resp, _ := json.Marshal(inference.Response{Message: answer})
	_, err := db.Exec(ctx, `
INSERT INTO interactions (tenant_id, session_id, seq, completion_id, protocol, deployment, model_version, request, response,
  prompt_tokens, completion_tokens, status, created_at)
VALUES ($1, $2, $3, $4, 'openai', 'dep', '', $5, $6, 10, 5, 'ok', $7)`,
		tenant, session, seq, fmt.Sprintf("c-%s-%d", session, seq), req, resp, at)
	require.NoError(t, err)
}

// TestReflectorSearchesTheHarnessAndTheGatesJudgeIt: the harness search
// reads only the train suite's graded answers (no tenant's sessions, not
// the gates' suites); a child that beats its parent on the minibatch is
// kept and, best on the train suite, proposed. The regression gate then
// passes it on the held-out suite it raises, and refuses a harness that
// lowers it.
func TestReflectorSearchesTheHarnessAndTheGatesJudgeIt(t *testing.T) {
	env := newReflectEnv(t, deployment.Evolution{Reflector: "reflector"})
	ctx := context.Background()
	seedTenant(t, env.db, "acme", true)
	seedRewarded(t, env.db, "acme", "acme-f0", "weigh the PRIVATE-CRATE", "12", -1, "no units", time.Now().Add(-time.Minute))
	suite := func(name, prefix string, n int) {
		var items []store.SuiteItem
		for i := 0; i < n; i++ {
			items = append(items, store.SuiteItem{Prompt: fmt.Sprintf("%s: how heavy is box %d?", prefix, i), Expect: "kg", Match: store.MatchContains})
		}
		prompts, err := store.SuitePrompts(name, items)
		require.NoError(t, err)
		_, err = store.SetEvalSuite(ctx, env.db, "dep", name, prompts)
		require.NoError(t, err)
	}
	// The deployment's model gives units only when its instructions ask.
	env.agent.Script = func(r fakeopenai.Request) fakeopenai.Reply {
		if r.Messages[0].Role == "system" && strings.Contains(r.Messages[0].Content, "units") && !strings.Contains(r.Messages[0].Content, "Never") {
			return fakeopenai.Reply{Text: "12 kg"}
		}
		return fakeopenai.Reply{Text: "12"}
	}
	env.reflector.Script = func(fakeopenai.Request) fakeopenai.Reply {
		return fakeopenai.Reply{Text: `{"harness": "State every quantity with its units."}`}
	}
	in := flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerHarness, Key: "h1"}
	out, err := env.e.ProposeArtefact(ctx, in)
	require.NoError(t, err)
	require.Zero(t, out.Version)
	require.Contains(t, out.Reason, "no train suite")

	suite(store.SuiteTrain, "train", 6)
	suite(store.SuiteRegression, "HELDOUT", 10)
	out, err = env.e.ProposeArtefact(ctx, in)
	require.NoError(t, err)
	require.Equal(t, 1, out.Version, out.Reason)
	require.Contains(t, out.Reason, "children kept; the best scores 1.000 against the serving harness's 0.000 on 6 train prompts")
	reqs := env.reflector.Requests()
	require.NotEmpty(t, reqs)
	first := reqs[0].Messages[1].Content
	require.Contains(t, first, "train: how heavy is box 0?")
	require.Contains(t, first, `grader: FAILED; the answer must contain "kg"`)
	for _, r := range reqs {
		require.NotContains(t, r.Messages[1].Content, "PRIVATE-CRATE", "the harness reads no tenant's text")
		require.NotContains(t, r.Messages[1].Content, "HELDOUT", "nor the gates' suites")
	}
	spent, err := store.ReflectionSpent(ctx, env.db, "*", time.Now())
	require.NoError(t, err)
	require.Equal(t, out.ReflectionTokens, spent, "the harness, no tenant's, is charged to *")

	// The release gates judge it as they judge weights.
	r := &Release{DB: env.db, Backend: env.e.Backend}
	gate := func(candidate int) flow.GateResult {
		begin := beginRelease(t, r, flow.ReleaseInput{Deployment: "dep", Layer: artefact.LayerHarness, Candidate: fmt.Sprint(candidate)})
		res, err := r.EvaluateGate(ctx, flow.GateInput{ReleaseID: begin.ReleaseID, Deployment: "dep", Layer: artefact.LayerHarness,
			Candidate: fmt.Sprint(candidate), Baseline: begin.Baseline, Gate: flow.GateRegression,
			Policy: deployment.ReleasePolicy{MaxRewardDrop: 0.05, AnchorBudget: 0.05, Alpha: 0.05}})
		require.NoError(t, err)
		return res
	}
	res := gate(1)
	require.True(t, res.Passed, res.Reason)
	require.Equal(t, 1.0, res.Metrics["candidate_pass_rate"])
	_, err = env.db.Exec(ctx, `UPDATE artefacts SET status = 'serving' WHERE deployment = 'dep' AND kind = 'harness' AND version = 1`)
	require.NoError(t, err)
	worse, err := store.CreateArtefact(ctx, env.db, "dep", artefact.LayerHarness, []byte(`{"system_prompt":"Never state units."}`), "h-worse")
	require.NoError(t, err)
	res = gate(worse.Version)
	require.False(t, res.Passed, "a harness that lowers the held-out suite is refused: %s", res.Reason)

	// A mutation that does not beat its parent is not kept, and nothing
	// better than what serves is proposed.
	env.reflector.Script = func(fakeopenai.Request) fakeopenai.Reply {
		return fakeopenai.Reply{Text: `{"harness": "Be friendly."}`}
	}
	_, err = env.db.Exec(ctx, `UPDATE artefacts SET status = 'candidate' WHERE deployment = 'dep' AND kind = 'harness'`)
	require.NoError(t, err)
	in.Key = "h2"
	out, err = env.e.ProposeArtefact(ctx, in)
	require.NoError(t, err)
	require.Zero(t, out.Version)
	require.Contains(t, out.Reason, "0 children kept")
}

// TestDecisionsAreHeldToWhatTheyExpected: a decision records its tenant
// and expectation, then how its release ended; once a window has passed
// since the promotion, the next evidence measures what the change did to
// its tenant's reward, and the status shows both, to that tenant only.
func TestDecisionsAreHeldToWhatTheyExpected(t *testing.T) {
	env := newReflectEnv(t, deployment.Evolution{Reflector: "reflector"})
	ctx := context.Background()
	seedTenant(t, env.db, "acme", true)
	seedTenant(t, env.db, "globex", true)
	now := time.Now()
	for i := 0; i < 3; i++ {
		seedRewarded(t, env.db, "acme", fmt.Sprintf("before-%d", i), "q", "a", -1, "", now.Add(-80*time.Minute))
		seedRewarded(t, env.db, "globex", fmt.Sprintf("globex-before-%d", i), "q", "a", 1, "", now.Add(-80*time.Minute))
		seedRewarded(t, env.db, "acme", fmt.Sprintf("after-%d", i), "q", "a", 1, "", now.Add(-40*time.Minute))
	}
	env.e.Now = func() time.Time { return now.Add(-60 * time.Minute) }
	ev, err := env.e.ComputeEvidence(ctx, flow.EvidenceInput{Deployment: "dep", Window: 30 * time.Minute})
	require.NoError(t, err)
	require.Equal(t, []evolution.TenantOutcome{{Tenant: "acme", Sessions: 3, Rewarded: 3, Failed: 3, Mean: -1},
		{Tenant: "globex", Sessions: 3, Rewarded: 3, Mean: 1}}, ev.TenantOutcomes)
	d := evolution.Decide(ev, evolution.Thresholds{MinSessions: 6, MinRewarded: 6})
	require.Equal(t, evolution.DecisionMemory, d.Kind, d.Reason)
	require.Equal(t, "acme", d.Tenant, "only acme fails")
	id, err := env.e.RecordDecision(ctx, flow.RecordDecisionInput{Deployment: "dep", Decision: d, Evidence: ev})
	require.NoError(t, err)
	_, err = env.db.Exec(ctx, `UPDATE evolution_decisions SET created_at = $2 WHERE id = $1`, id, now.Add(-60*time.Minute))
	require.NoError(t, err)
	env.e.Now = func() time.Time { return now.Add(-50 * time.Minute) }
	require.NoError(t, env.e.RecordDecisionRelease(ctx, flow.DecisionReleaseInput{DecisionID: id, Status: flow.ReleasePromoted}))

	env.e.Now = func() time.Time { return now }
	_, err = env.e.ComputeEvidence(ctx, flow.EvidenceInput{Deployment: "dep", Window: 30 * time.Minute})
	require.NoError(t, err)
	rows, err := store.ListDecisions(ctx, env.db, "dep", 5)
	require.NoError(t, err)
	require.Equal(t, "tenant acme's mean session reward rises from -1.000", rows[0].Expected)
	require.Equal(t, flow.ReleasePromoted, rows[0].ReleaseStatus)
	require.NotNil(t, rows[0].Outcome, "a window after the promotion, its outcome is measured")
	o := *rows[0].Outcome
	require.Equal(t, [4]float64{-1, 1, 3, 3}, [4]float64{o.Before, o.After, float64(o.RewardedBefore), float64(o.RewardedAfter)},
		"acme's sessions only: globex's rewards are not its change's")

	status := func(tenant string) statusapi.DecisionStatus {
		st, err := store.LoadStatus(ctx, env.db, store.StatusQuery{TenantID: tenant, Deployment: "dep"})
		require.NoError(t, err)
		return st.Deployments[0].Decisions[0]
	}
	mine := status("acme")
	require.Equal(t, rows[0].Expected, mine.Expected)
	require.Equal(t, rows[0].Outcome, mine.Outcome)
	theirs := status("globex")
	require.Nil(t, theirs.Outcome, "another tenant's change is not globex's to see")
	require.Empty(t, theirs.Expected)
	require.NotContains(t, theirs.Reason, "acme")
	require.NotContains(t, string(theirs.Evidence), `"acme"`)
}

// TestHostedStepsFeedTheCheapLayers: a hosted model's steps carry no
// token ids, yet what the gateway captured of them (the text, the reward
// and its feedback) is what the reflector reads.
func TestHostedStepsFeedTheCheapLayers(t *testing.T) {
	env := newReflectEnv(t, deployment.Evolution{Reflector: "reflector"})
	ctx := context.Background()
	require.NoError(t, store.EnsureTenant(ctx, env.db, "acme"))
	key, err := store.CreateKey(ctx, env.db, "acme", "", "agent")
	require.NoError(t, err)
	env.agent.Script = func(fakeopenai.Request) fakeopenai.Reply { return fakeopenai.Reply{Text: "The total is 10."} }
	agent := &GatewayReflector{URL: env.gateway}
	post := func(path string, body any) {
		t.Helper()
		require.NoError(t, agent.post(ctx, path, key, body, nil), path)
	}
	// Sessions named by the client, in the base URL's path form.
	for i := 0; i < 2; i++ {
		sid := fmt.Sprintf("hosted-%d", i)
		post("/s/"+sid+"/v1/chat/completions", map[string]any{"model": "dep",
			"messages": []map[string]string{{"role": "user", "content": "what's the invoice total for march"}}})
		post("/v1/sessions/"+sid+"/reward", map[string]any{"value": -1, "feedback": "the lookup said 12, not 10"})
	}
	var ids int
	require.NoError(t, env.db.QueryRow(ctx, `SELECT count(*) FROM interactions WHERE deployment = 'dep' AND tenant_id = 'acme'
		AND coalesce(cardinality(completion_token_ids), 0) = 0`).Scan(&ids))
	require.Equal(t, 2, ids, "the hosted model's steps were captured without token ids")

	env.reflector.Script = func(fakeopenai.Request) fakeopenai.Reply {
		return fakeopenai.Reply{Text: `{"deltas": [{"op": "add", "content": "Quote the looked-up total.", "sessions": ["hosted-0", "hosted-1"]}]}`}
	}
	out, err := env.e.ProposeArtefact(ctx, flow.ProposeArtefactInput{Deployment: "dep", Kind: artefact.LayerPlaybook, Window: time.Hour, Key: "hosted"})
	require.NoError(t, err)
	require.Equal(t, 1, out.Version, out.Reason)
	asked := env.reflector.Requests()[0].Messages[1].Content
	require.Contains(t, asked, "[session hosted-0] outcome -1.00\nuser: what's the invoice total for march\nagent: The total is 10.")
	require.Contains(t, asked, "feedback: the lookup said 12, not 10")
}
