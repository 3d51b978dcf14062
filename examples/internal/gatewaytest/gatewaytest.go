// Package gatewaytest runs a real Flywheel gateway in the examples' tests:
// the gateway package's server on a fresh Postgres database (testenv), in
// front of the fake vLLM upstream (fakevllm), with one tenant key. The
// examples talk to it over HTTP exactly as they talk to `flywheel up`. It
// is test support: nothing but the examples' tests imports it.
package gatewaytest

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// Model is the model the fake upstream serves. It answers a user message
// with a call to the first tool offered, its argument {"query": the
// message}, and anything else with "echo: " and the last message.
const Model = "fixture-model"

// Tenant owns Gateway.Key.
const Tenant = "examples"

// Gateway is a running gateway.
type Gateway struct {
	// URL is the gateway's root, without /v1: http://127.0.0.1:PORT.
	URL string
	// Key is a tenant API key.
	Key  string
	Pool *pgxpool.Pool
}

// Start runs a gateway until t ends; it skips t (or fails it, under
// FLYWHEEL_REQUIRE_SERVICES=1) without a test Postgres.
func Start(t testing.TB) *Gateway {
	t.Helper()
	pool := testenv.Pool(t)
	up := httptest.NewServer(&fakevllm.Fixture{})
	t.Cleanup(up.Close)
	cfg := config.Default().Gateway
	cfg.UpstreamURL = up.URL + "/v1"
	cfg.UpstreamModels = []string{Model}
	cfg.UpstreamRetries = 0
	srv, err := gateway.New(cfg, gateway.Deps{DB: pool, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.Close(); srv.Close() })
	ctx := context.Background()
	require.NoError(t, store.EnsureTenant(ctx, pool, Tenant))
	key, err := store.CreateKey(ctx, pool, Tenant, "", "examples")
	require.NoError(t, err)
	return &Gateway{URL: ts.URL, Key: key, Pool: pool}
}

// Steps is how many model calls the gateway captured in the session.
func (g *Gateway) Steps(t testing.TB, sessionID string) int {
	t.Helper()
	var n int
	require.NoError(t, g.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM interactions WHERE tenant_id = $1 AND session_id = $2 AND status = 'ok'`, Tenant, sessionID).Scan(&n))
	return n
}

// Rewards is how many rewards the session received.
func (g *Gateway) Rewards(t testing.TB, sessionID string) int {
	t.Helper()
	var n int
	require.NoError(t, g.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM rewards WHERE tenant_id = $1 AND session_id = $2`, Tenant, sessionID).Scan(&n))
	return n
}
