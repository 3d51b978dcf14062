package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStops: stop's forms, and the gateway's limit on how many, which is
// Decode's and not the reader's (vLLM, and so the model server, has none).
func TestStops(t *testing.T) {
	for raw, want := range map[string][]string{``: nil, `null`: nil, ` "x" `: {"x"}, `[]`: {}, `["a","b"]`: {"a", "b"}} {
		got, err := Stops(json.RawMessage(raw))
		require.NoError(t, err, raw)
		require.Equal(t, want, got, raw)
	}
	for _, raw := range []string{`5`, `[1]`, `{}`} {
		_, err := Stops(json.RawMessage(raw))
		require.EqualError(t, err, "stop: want a string or an array of strings", raw)
	}

	many := `["` + strings.Repeat(`s","`, maxStops) + `s"]`
	stops, err := Stops(json.RawMessage(many))
	require.NoError(t, err)
	require.Len(t, stops, maxStops+1)
	_, _, err = Decode([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":` + many + `}`))
	require.EqualError(t, err, "stop: at most 16 sequences")
}
