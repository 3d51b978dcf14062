package upstream

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
)

// wireCases are requests whose bytes on the wire are pinned by
// wireGolden: every part of the chat shape the client writes.
func wireCases() []inference.Request {
	temp, topP, seed, pen, ptc := 0.25, 0.9, int64(7), -1.5, false
	return []inference.Request{
		{Messages: []inference.Message{{Role: "user", Content: "hi"}}},
		{Messages: []inference.Message{
			{Role: "system", Content: "Be <brief> & kind\u2028."},
			{Role: "user", Content: "héllo \"there\"\n", Name: "ann"},
			{Role: "assistant", ToolCalls: []inference.ToolCall{{ID: "c1", Name: "f", Arguments: `{"a":1}`}, {ID: "c2", Name: "g"}}},
			{Role: "tool", Content: "ok", ToolCallID: "c1"},
			{Role: "assistant", Content: "and", ToolCalls: []inference.ToolCall{{ID: "c3", Name: "f", Arguments: "{}"}}},
			{Role: "assistant", Content: ""},
		},
			Tools:      []inference.Tool{{Name: "f", Description: "does f", Parameters: json.RawMessage(`{"type":"object"}`)}, {Name: "g"}},
			ToolChoice: "f<x>", MaxTokens: 12, Temperature: &temp, TopP: &topP, Stop: []string{"\n", "</s>"}, Seed: &seed,
			TopLogprobs: 3, ResponseFormat: json.RawMessage(`{"type":"json_object"}`), ParallelToolCalls: &ptc,
			FrequencyPenalty: &pen, PresencePenalty: &pen, LogitBias: map[string]float64{"12": -100, "3": 2.5}, Version: "m@v2"},
		{Messages: []inference.Message{{Role: "user", Content: "x"}}, ToolChoice: "auto", Stop: []string{}, MaxTokens: -1},
		{Messages: []inference.Message{{Role: "user", Content: "x"}}, ToolChoice: "required", Tools: []inference.Tool{{Name: "t"}}},
		{Messages: []inference.Message{{Role: "user", Content: "x"}}, ToolChoice: "none"},
	}
}

func wireBodies(t *testing.T) []string {
	var out []string
	for _, dialect := range []deployment.Dialect{deployment.DialectVLLM, deployment.DialectSGLang, deployment.DialectOpenAI} {
		for _, byName := range []bool{false, true} {
			var last []byte
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				last, _ = io.ReadAll(r.Body)
				_, _ = w.Write([]byte(`{"tokens":[1],"count":1}`))
			}))
			b, err := New(Config{BaseURL: srv.URL + "/v1", Model: "m", Dialect: dialect, VersionsByName: byName})
			require.NoError(t, err)
			for _, req := range wireCases() {
				for _, stream := range []bool{false, true} {
					body, err := json.Marshal(b.wire(&req, stream))
					require.NoError(t, err)
					out = append(out, string(body))
				}
				if dialect != deployment.DialectOpenAI {
					_, err := b.tokenize(context.Background(), &req)
					require.NoError(t, err)
					out = append(out, string(last))
				}
			}
			b.idsInTokens.Store(true)
			req := wireCases()[0]
			body, err := json.Marshal(b.wire(&req, false))
			require.NoError(t, err)
			out = append(out, string(body))
			srv.Close()
		}
	}
	return out
}

var updateWire = flag.Bool("update-wire", false, "rewrite testdata/wire_requests.json from what the client writes now")

// TestWireBytes pins the bytes of every request the client writes, chat
// and tokenize, in each dialect: a change to the shared wire types
// (protocol/openai) must not change what an engine receives.
func TestWireBytes(t *testing.T) {
	const golden = "testdata/wire_requests.json"
	got := wireBodies(t)
	if *updateWire {
		raw, err := json.MarshalIndent(got, "", "\t")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(golden, append(raw, '\n'), 0o644))
	}
	raw, err := os.ReadFile(golden)
	require.NoError(t, err)
	var want []string
	require.NoError(t, json.Unmarshal(raw, &want))
	require.Equal(t, want, got)
}
