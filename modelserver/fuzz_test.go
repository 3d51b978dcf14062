package modelserver_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
)

// FuzzChatRequest feeds arbitrary bodies to the chat and tokenize
// handlers: they never panic, never fail with 500, and always answer
// either a completion, a stream ending in [DONE], or vLLM's error JSON
// carrying the status.
func FuzzChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"policy","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`,
		`{"model":"policy","messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"}]}],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,"return_token_ids":true,"return_tokens_as_token_ids":true,"max_completion_tokens":3}`,
		`{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"stop":"\n","seed":3,"max_tokens":2}`,
		`{"messages":[{"role":"user","content":"x"}],"stop":["a","b"],"temperature":0.5,"top_p":0.9,"n":1,"response_format":{"type":"text"},"logit_bias":{},"parallel_tool_calls":true,"max_tokens":2}`,
		`{"prompt":"hello"}`,
		`{"model":"policy","messages":[{"role":"user","content":"hi"}],"n":2}`,
		`{"model":`,
		`null`,
		`[]`,
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	m, err := trainer.NewModel(trainer.ModelConfig{Context: 64, Layers: 1, Heads: 2, DModel: 8, FFN: 16}, 1)
	require.NoError(f, err)
	srv, err := modelserver.New(m, 0, modelserver.Config{Name: "policy", DefaultMaxTokens: 4, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, body string, tokenize bool) {
		path := "/v1/chat/completions"
		if tokenize {
			path = "/tokenize"
		}
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		require.Contains(t, []int{200, 400, 404}, w.Code, w.Body.String())
		out := w.Body.String()
		if w.Code == http.StatusOK && strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream") {
			require.True(t, strings.HasSuffix(out, "data: [DONE]\n\n"), out)
			require.NotContains(t, out, `"error"`, out)
			return
		}
		var answer map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &answer), out)
		if w.Code != http.StatusOK {
			require.Equal(t, "error", answer["object"], out)
			require.Equal(t, float64(w.Code), answer["code"], out)
		}
	})
}
