package fakevllm_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/fakevllm"
)

func post(t *testing.T, h http.Handler, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	return w
}

// Without RuntimeLoRA the fake serves its base alone: any model name is
// answered by it, and the adapter endpoints are vLLM's 404.
func TestWithoutRuntimeLoRAAnyNameIsTheBase(t *testing.T) {
	f := &fakevllm.Fixture{}
	w := post(t, f, "/v1/chat/completions", `{"model":"any-name","messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var resp struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &resp))
	require.Equal(t, "fixture-model", resp.Model)
	require.Equal(t, "echo: hi", resp.Choices[0].Message.Content)

	w = post(t, f, "/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/x"}`)
	require.Equal(t, http.StatusNotFound, w.Code)
	require.JSONEq(t, `{"detail":"Not Found"}`, w.Body.String())
	require.Empty(t, f.AdapterCalls())
}

// OldTokenIDs answers without token ids, as a vLLM that does not know
// return_token_ids; the request is recorded as it was sent.
func TestOldTokenIDsIgnoresReturnTokenIDs(t *testing.T) {
	body := `{"model":"fixture-model","messages":[{"role":"user","content":"hi"}],"return_token_ids":true}`
	w := post(t, &fakevllm.Fixture{}, "/v1/chat/completions", body)
	require.Contains(t, w.Body.String(), `"prompt_token_ids"`)

	old := &fakevllm.Fixture{OldTokenIDs: true}
	w = post(t, old, "/v1/chat/completions", body)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.NotContains(t, w.Body.String(), `token_ids"`)
	require.Equal(t, true, old.LastRequest()["return_token_ids"])
	require.EqualValues(t, 1, old.Requests.Load())
}

// The adapter endpoints record every call with its answer; FailLoRA fails
// a load with a 500, and a loaded adapter answers as AdapterReply says.
func TestAdapterCallsAreRecorded(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{}`), 0o644))
	f := &fakevllm.Fixture{RuntimeLoRA: true, Model: "base",
		AdapterReply: func(adapter, last string) string { return adapter + " says " + last }}
	f.FailLoRA.Store(1)
	load := `{"lora_name":"base@v1","lora_path":"` + dir + `"}`
	require.Equal(t, http.StatusInternalServerError, post(t, f, "/v1/load_lora_adapter", load).Code)
	require.Equal(t, http.StatusOK, post(t, f, "/v1/load_lora_adapter", load).Code)
	require.Equal(t, map[string]string{"base@v1": dir}, f.Adapters())
	missing := post(t, f, "/v1/load_lora_adapter", `{"lora_name":"base@v2","lora_path":"`+t.TempDir()+`"}`)
	require.Equal(t, http.StatusNotFound, missing.Code, "a path without adapter_config.json")

	w := post(t, f, "/v1/chat/completions", `{"model":"base@v1","messages":[{"role":"user","content":"hi"}]}`)
	require.Contains(t, w.Body.String(), `"content":"base@v1 says hi"`)
	require.Equal(t, http.StatusNotFound, post(t, f, "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`).Code)

	require.Equal(t, http.StatusOK, post(t, f, "/v1/unload_lora_adapter", `{"lora_name":"base@v1"}`).Code)
	var statuses []int
	for _, c := range f.AdapterCalls() {
		statuses = append(statuses, c.Status)
	}
	require.Equal(t, []int{500, 200, 404, 200}, statuses)
	require.Equal(t, map[string]any{"lora_name": "base@v1"}, f.AdapterCalls()[3].Body)
	require.Empty(t, f.Adapters())
}

// A streamed tool call arrives as argument increments, the first with
// the call's id and name, and is not sent again whole at the end.
func TestStreamedToolCallArrivesInIncrements(t *testing.T) {
	w := post(t, &fakevllm.Fixture{}, "/v1/chat/completions", `{"model":"fixture-model","stream":true,
		"messages":[{"role":"user","content":"weather in Oslo"}],
		"tools":[{"type":"function","function":{"name":"search"}}]}`)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	var args strings.Builder
	var names, ids []string
	finish := ""
	sc := bufio.NewScanner(w.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &chunk))
		for _, c := range chunk.Choices {
			for _, tc := range c.Delta.ToolCalls {
				args.WriteString(tc.Function.Arguments)
				if tc.ID != "" {
					ids, names = append(ids, tc.ID), append(names, tc.Function.Name)
				}
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	require.Equal(t, []string{"search"}, names)
	require.Equal(t, []string{"call_fx1"}, ids)
	require.JSONEq(t, `{"query":"weather in Oslo"}`, args.String())
	require.Equal(t, "tool_calls", finish)
}
