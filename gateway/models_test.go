package gateway_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/config"
)

// TestOpenAISDKRetrievesAModel: GET /v1/models/{model} answers what the
// list says of a model the key may use, and OpenAI's 404 model_not_found
// for any other, whether it does not exist or the key may not use it.
func TestOpenAISDKRetrievesAModel(t *testing.T) {
	e := newEnv(t, envOpts{cfg: func(c *config.GatewayConfig) { c.UpstreamModels = []string{fixtureModel, "other-model"} }})
	ctx := context.Background()
	c := e.openai(e.keyA)

	m, err := c.Models.Get(ctx, fixtureModel)
	require.NoError(t, err)
	require.Equal(t, fixtureModel, m.ID)
	require.EqualValues(t, "model", m.Object)
	require.Equal(t, "flywheel", m.OwnedBy)
	list, err := c.Models.List(ctx)
	require.NoError(t, err)
	var listed *openai.Model
	for i := range list.Data {
		if list.Data[i].ID == fixtureModel {
			listed = &list.Data[i]
		}
	}
	require.NotNil(t, listed)
	require.Equal(t, listed.Created, m.Created, "the same model as the list's")
	require.Positive(t, m.Created)

	requireModelNotFound := func(c openai.Client, name string) {
		t.Helper()
		_, err := c.Models.Get(ctx, name)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, 404, apiErr.StatusCode)
		require.Equal(t, "model_not_found", apiErr.Code)
		require.Equal(t, "invalid_request_error", apiErr.Type)
		require.Contains(t, apiErr.Message, name)
	}
	requireModelNotFound(c, "no-such-model")

	// A key scoped to one model finds no other.
	st, out := e.doJSON("POST", "/admin/v1/keys", e.cfg.AdminKey, map[string]any{"tenant": "acme", "models": []string{fixtureModel}})
	require.Equal(t, 201, st, out)
	scoped := e.openai(out["api_key"].(string))
	_, err = scoped.Models.Get(ctx, fixtureModel)
	require.NoError(t, err)
	requireModelNotFound(scoped, "other-model")
	_, err = c.Models.Get(ctx, "other-model")
	require.NoError(t, err, "which an unscoped key of the same tenant uses")

	// The body is OpenAI's error object, param and all; the session path
	// serves the same route.
	st, _, raw := e.do("GET", "/v1/models/no-such-model", e.keyA, nil)
	require.Equal(t, 404, st)
	var body struct {
		Error map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal(raw, &body), string(raw))
	require.Contains(t, body.Error, "param")
	require.Nil(t, body.Error["param"])
	require.Equal(t, "model_not_found", body.Error["code"])
	require.Equal(t, "invalid_request_error", body.Error["type"])
	st, got := e.doJSON("GET", "/s/some-session/v1/models/"+fixtureModel, e.keyA, nil)
	require.Equal(t, 200, st, got)
	require.Equal(t, fixtureModel, got["id"])
	st, _ = e.doJSON("GET", "/v1/models/"+fixtureModel, "", nil)
	require.Equal(t, 401, st, "a model is only shown to a key")
}
