package anthropic

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

func TestInjectSystemKeepsTheClientsBlocks(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m","messages":[]}`:         `{"model":"m","messages":[],"system":"H"}`,
		`{"system": "be brief", "model":"m"}`: `{"system": "H\n\nbe brief", "model":"m"}`,
		`{"system":[],"model":"m"}`:           `{"system":[{"type":"text","text":"H"}],"model":"m"}`,
		`{"system":[ {"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}]}`: `{"system":[{"type":"text","text":"H"}, {"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}]}`,
	} {
		out, err := InjectSystem([]byte(in), "H")
		require.NoError(t, err, in)
		require.Equal(t, want, string(out))
	}
	_, err := InjectSystem([]byte(`{"system":3}`), "H")
	require.ErrorContains(t, err, "system")
	out, err := InjectSystem([]byte(`{"system":3}`), "")
	require.NoError(t, err, "nothing to inject: the body as it is")
	require.Equal(t, `{"system":3}`, string(out))
}

func TestOverrideToolsTouchesOnlyTheChanged(t *testing.T) {
	body := `{"tools":[{"name":"search","description":"old","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}},` +
		`{"type":"web_search_20250305","name":"web_search","max_uses":5}],"model":"m"}`
	tools := []inference.Tool{{Name: "search", Description: "Search the web.", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
		{Name: "web_search"}}
	out, err := OverrideTools([]byte(body), tools, []string{"search"})
	require.NoError(t, err)
	require.Equal(t, `{"tools":[{"name":"search","description":"Search the web.","input_schema":{"type":"object","properties":{}},"cache_control":{"type":"ephemeral"}},`+
		`{"type":"web_search_20250305","name":"web_search","max_uses":5}],"model":"m"}`, string(out))
	out, err = OverrideTools([]byte(body), tools, nil)
	require.NoError(t, err)
	require.Equal(t, body, string(out))
}
