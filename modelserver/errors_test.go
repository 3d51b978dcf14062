package modelserver_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TestBadInputGetsVLLMAnswers: each refusal has vLLM's status and error
// JSON, and an unknown route FastAPI's.
func TestBadInputGetsVLLMAnswers(t *testing.T) {
	e := newEnv(t, modelserver.Config{})
	hi := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name    string
		path    string
		body    string
		status  int
		typ     string
		message string
	}{
		{"invalid JSON", "/v1/chat/completions", `{"model":`, 400, "BadRequestError", "invalid request"},
		{"wrong type", "/v1/chat/completions", `{"temperature":"hot",` + hi + `}`, 400, "BadRequestError", "invalid request"},
		{"n 2", "/v1/chat/completions", `{"n":2,` + hi + `}`, 400, "BadRequestError", "n 2"},
		{"unknown model", "/v1/chat/completions", `{"model":"nope",` + hi + `}`, 404, "NotFoundError", "The model `nope` does not exist."},
		{"adapter never loaded", "/v1/chat/completions", `{"model":"policy@v7",` + hi + `}`, 404, "NotFoundError", "The model `policy@v7` does not exist."},
		{"no messages", "/v1/chat/completions", `{"model":"policy","messages":[]}`, 400, "BadRequestError", "messages are empty"},
		{"no role", "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, 400, "BadRequestError", "messages[0].role is required"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "BadRequestError", "text only"},
		{"max_tokens 0", "/v1/chat/completions", `{"max_tokens":0,` + hi + `}`, 400, "BadRequestError", "max_tokens must be at least 1"},
		{"top_logprobs alone", "/v1/chat/completions", `{"top_logprobs":2,` + hi + `}`, 400, "BadRequestError", "`logprobs` must be set to true"},
		{"too many top_logprobs", "/v1/chat/completions", `{"logprobs":true,"top_logprobs":21,` + hi + `}`, 400, "BadRequestError", "top_logprobs 21"},
		{"stream options alone", "/v1/chat/completions", `{"stream_options":{"include_usage":true},` + hi + `}`, 400, "BadRequestError", "stream=True"},
		{"tool_choice without tools", "/v1/chat/completions", `{"tool_choice":"required",` + hi + `}`, 400, "BadRequestError", "`tools` must be set"},
		{"bad tool_choice", "/v1/chat/completions", `{"tool_choice":"sometimes",` + hi + `}`, 400, "BadRequestError", "tool_choice"},
		{"json mode", "/v1/chat/completions", `{"response_format":{"type":"json_object"},` + hi + `}`, 400, "BadRequestError", "response_format json_object"},
		{"penalty", "/v1/chat/completions", `{"presence_penalty":1,` + hi + `}`, 400, "BadRequestError", "presence_penalty"},
		{"negative temperature", "/v1/chat/completions", `{"temperature":-1,` + hi + `}`, 400, "BadRequestError", "temperature"},
		{"stream refused before it starts", "/v1/chat/completions", `{"stream":true,"top_p":2,` + hi + `}`, 400, "BadRequestError", "top_p"},
		{"prompt over the context", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("a", 300) + `"}]}`, 400, "BadRequestError", "the context is 256"},
		{"tokenize nothing", "/tokenize", `{"model":"policy"}`, 400, "BadRequestError", "messages or prompt"},
		{"tokenize unknown model", "/tokenize", `{"model":"nope","prompt":"x"}`, 404, "NotFoundError", "The model `nope` does not exist."},
		{"unload nothing", "/v1/unload_lora_adapter", `{}`, 400, "InvalidUserInput", "'lora_name' needs to be provided"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := e.post(t, c.path, c.body)
			require.Equal(t, c.status, status, "%v", body)
			requireVLLMError(t, c.status, c.typ, body)
			require.Contains(t, body["message"], c.message)
		})
	}

	status, body := e.post(t, "/v1/completions", `{}`)
	require.Equal(t, http.StatusNotFound, status)
	require.Equal(t, map[string]any{"detail": "Not Found"}, body, "FastAPI's answer for a route it does not have")
	resp, err := http.Get(e.http.URL + "/v1/chat/completions")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	// Over the body limit: 413, before the rest is read.
	big := `{"messages":[{"role":"user","content":"` + strings.Repeat("a", 16<<20) + `"}]}`
	w := httptest.NewRecorder()
	e.srv.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(big)))
	require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	require.Contains(t, w.Body.String(), `"object":"error"`)
	require.Contains(t, w.Body.String(), `"code":413`)
}

// TestTokenize: /tokenize (and /v1/tokenize) count what a completion
// conditions on, a bare prompt's bytes, and without the generation prompt
// when asked.
func TestTokenize(t *testing.T) {
	e := newEnv(t, modelserver.Config{})
	for _, path := range []string{"/tokenize", "/v1/tokenize"} {
		status, body := e.post(t, path, map[string]any{"model": served, "prompt": "héllo"})
		require.Equal(t, http.StatusOK, status, "%v", body)
		require.Equal(t, float64(6), body["count"], "bytes")
		require.Equal(t, toFloats([]int{'h', 0xc3, 0xa9, 'l', 'l', 'o'}), body["tokens"])
		require.Equal(t, float64(smallModel.Context), body["max_model_len"])
	}
	msgs := []map[string]string{{"role": "user", "content": "hi"}}
	_, with := e.post(t, "/tokenize", map[string]any{"messages": msgs})
	_, without := e.post(t, "/tokenize", map[string]any{"messages": msgs, "add_generation_prompt": false})
	prompt, err := trainer.RenderPrompt([]inference.Message{{Role: "user", Content: "hi"}}, nil, "", nil)
	require.NoError(t, err)
	require.Equal(t, toFloats(prompt), with["tokens"], "what a completion of the same messages conditions on")
	require.Equal(t, with["tokens"].([]any)[:len(without["tokens"].([]any))], without["tokens"])
	// The generation prompt is <|im_start|> (one token) and "assistant\n".
	require.Equal(t, with["count"].(float64)-float64(1+len("assistant\n")), without["count"])
}
