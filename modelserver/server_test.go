package modelserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/upstream"
)

// served is the model name the tests serve, its base at baseVersion.
const (
	served      = "policy"
	baseVersion = 0
)

// smallModel keeps generation fast while being a real transformer.
var smallModel = trainer.ModelConfig{Context: 256, Layers: 1, Heads: 2, DModel: 16, FFN: 32}

// env is a model server over HTTP with a checkpoint directory.
type env struct {
	srv  *modelserver.Server
	http *httptest.Server
	base *trainer.Model
	dir  trainer.CheckpointDir
}

func newEnv(t *testing.T, cfg modelserver.Config) *env {
	t.Helper()
	base := model(t, 1)
	if cfg.Name == "" {
		cfg.Name = served
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := modelserver.New(base, baseVersion, cfg)
	require.NoError(t, err)
	return &env{srv: srv, http: newHTTP(t, srv), base: base, dir: trainer.CheckpointDir{Dir: t.TempDir()}}
}

func newHTTP(t *testing.T, srv *modelserver.Server) *httptest.Server {
	t.Helper()
	h := httptest.NewServer(srv)
	t.Cleanup(h.Close)
	return h
}

func model(t *testing.T, seed uint64) *trainer.Model {
	t.Helper()
	m, err := trainer.NewModel(smallModel, seed)
	require.NoError(t, err)
	return m
}

// checkpoint saves a fresh model (seeded by seed) as version and returns
// it and its path.
func (e *env) checkpoint(t *testing.T, version int64, seed uint64) (*trainer.Model, string) {
	t.Helper()
	m := model(t, seed)
	path, err := e.dir.Save(m, version, nil)
	require.NoError(t, err)
	return m, path
}

// backend is the gateway's production client for this server.
func (e *env) backend(t *testing.T) *upstream.Backend {
	t.Helper()
	b, err := upstream.New(upstream.Config{BaseURL: e.http.URL + "/v1", Model: served, Dialect: deployment.DialectVLLM, VersionsByName: true})
	require.NoError(t, err)
	return b
}

// post sends body to path and returns the status and decoded JSON.
func (e *env) post(t *testing.T, path string, body any) (int, map[string]any) {
	t.Helper()
	raw, ok := body.(string)
	if !ok {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		raw = string(b)
	}
	resp, err := http.Post(e.http.URL+path, "application/json", bytes.NewReader([]byte(raw)))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var m map[string]any
	if json.Unmarshal(out, &m) != nil {
		m = map[string]any{"text": string(out)}
	}
	return resp.StatusCode, m
}

// direct answers req with an engine serving m itself: what the server
// must match when it serves m's weights.
func direct(t *testing.T, m *trainer.Model, req *inference.Request) *inference.Response {
	t.Helper()
	e, err := trainer.NewEngine(m, 1, trainer.EngineConfig{Name: served})
	require.NoError(t, err)
	r := *req
	r.Version = ""
	resp, err := e.Complete(context.Background(), &r)
	require.NoError(t, err)
	return resp
}

// jsonText is s as it comes out of JSON: each byte that is not UTF-8
// becomes U+FFFD (a token's raw bytes are in its "bytes").
func jsonText(s string) string {
	raw, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(raw, &out)
	return out
}

func greedy(content string, version string) *inference.Request {
	zero := 0.0
	return &inference.Request{Messages: []inference.Message{{Role: inference.RoleUser, Content: content}},
		MaxTokens: 16, Temperature: &zero, Version: version}
}

// requireVLLMError checks vLLM's error JSON.
func requireVLLMError(t *testing.T, status int, typ string, body map[string]any) {
	t.Helper()
	require.Equal(t, "error", body["object"], "%v", body)
	require.Equal(t, typ, body["type"], "%v", body)
	require.Equal(t, float64(status), body["code"], "%v", body)
	require.Contains(t, body, "param")
	require.Nil(t, body["param"])
	require.NotEmpty(t, body["message"])
}
