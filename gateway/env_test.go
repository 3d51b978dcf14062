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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/internal/policytest"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

const fixtureModel = "fixture-model"

// env is a real gateway on a real Postgres, in front of the vLLM-like
// fixture upstream, with two tenants.
type env struct {
	t       testing.TB
	pool    *pgxpool.Pool
	fixture *fakevllm.Fixture
	srv     *gateway.Server
	url     string
	keyA    string
	keyB    string
	cfg     config.GatewayConfig
	// policy is the built-in policy on its model server (envOpts.policy).
	policy *policytest.Policy
}

type envOpts struct {
	cfg func(*config.GatewayConfig)
	// policy serves the built-in policy as `flywheel up` does: its model
	// server, an upstream deployment under policyModel (see withPolicy).
	policy   bool
	notifier gateway.Notifier
	forgets  gateway.ForgetStarter
	tracer   trace.TracerProvider
	now      func() time.Time
}

func newEnv(t *testing.T, o envOpts) *env { return newEnvTB(t, o) }

func newEnvB(b *testing.B) *env { return newEnvTB(b, envOpts{}) }

func newEnvTB(t testing.TB, o envOpts) *env {
	t.Helper()
	pool := testenv.Pool(t)
	fx := &fakevllm.Fixture{}
	up := httptest.NewServer(fx)
	t.Cleanup(up.Close)
	cfg := config.Default().Gateway
	cfg.UpstreamURL = up.URL + "/v1"
	cfg.UpstreamModels = []string{fixtureModel}
	cfg.UpstreamRetries = 0
	cfg.RateLimitRPS = 0
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	var policy *policytest.Policy
	if o.policy {
		policy = withPolicy(t, pool)
	}
	srv, err := gateway.New(cfg, gateway.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler), Notifier: o.notifier, Forgets: o.forgets,
		TracerProvider: o.tracer, Now: o.now})
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	ctx := context.Background()
	e := &env{t: t, pool: pool, fixture: fx, srv: srv, url: ts.URL, cfg: cfg, policy: policy}
	for _, tenant := range []string{"acme", "globex"} {
		require.NoError(t, store.EnsureTenant(ctx, pool, tenant))
		key, err := store.CreateKey(ctx, pool, tenant, "", "test")
		require.NoError(t, err)
		if tenant == "acme" {
			e.keyA = key
		} else {
			e.keyB = key
		}
	}
	return e
}

// do sends a JSON request and returns the status, headers and body.
func (e *env) do(method, path, key string, body any, headers ...string) (int, http.Header, []byte) {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		require.NoError(e.t, err)
		r = strings.NewReader(string(raw))
	}
	req, err := http.NewRequest(method, e.url+path, r)
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, resp.Header, out
}

func (e *env) doJSON(method, path, key string, body any, headers ...string) (int, map[string]any) {
	e.t.Helper()
	st, _, raw := e.do(method, path, key, body, headers...)
	var m map[string]any
	require.NoError(e.t, json.Unmarshal(raw, &m), string(raw))
	return st, m
}

// interaction reads a captured row straight from Postgres.
type capturedRow struct {
	SessionID, Mode, Version, Status, Protocol string
	Stream                                     bool
	PromptIDs, CompletionIDs                   []int32
	Logprobs                                   []float32
	Request, Response                          []byte
}

func (e *env) captured(completionID string) capturedRow {
	e.t.Helper()
	var r capturedRow
	var tenant string
	err := e.pool.QueryRow(context.Background(), `SELECT i.tenant_id, s.identity_mode FROM interactions i
		JOIN sessions s ON s.tenant_id = i.tenant_id AND s.id = i.session_id
		WHERE i.completion_id = $1`, completionID).Scan(&tenant, &r.Mode)
	require.NoError(e.t, err, "interaction %s must be in Postgres", completionID)
	// Read whole, as every reader does (a later turn is stored as a suffix).
	it, err := store.InteractionByCompletion(context.Background(), e.pool, tenant, completionID)
	require.NoError(e.t, err)
	r.SessionID, r.Version, r.Status, r.Protocol, r.Stream = it.SessionID, it.ModelVersion, it.Status, it.Protocol, it.Stream
	r.PromptIDs, r.CompletionIDs, r.Logprobs, r.Request, r.Response = it.PromptTokenIDs, it.CompletionTokenIDs, it.Logprobs, it.Request, it.Response
	return r
}

func (e *env) countInteractions() int {
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM interactions`).Scan(&n))
	return n
}

func eventually(t *testing.T, f func() bool, msg string) {
	t.Helper()
	require.Eventually(t, f, 10*time.Second, 20*time.Millisecond, msg)
}

type configGateway = config.GatewayConfig

func newServer(cfg config.GatewayConfig) (*gateway.Server, error) {
	return gateway.New(cfg, gateway.Deps{Logger: slog.New(slog.DiscardHandler)})
}
