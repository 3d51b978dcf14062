package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func FuzzDecodeOpenAI(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"stop":["x"],"logprobs":true,"top_logprobs":3}`))
	f.Add([]byte(`{"model":"m","messages":[],"n":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		wire, req, err := decodeOpenAI(body)
		if err != nil {
			var ae *apiError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, 400, ae.Status)
			return
		}
		require.NotNil(t, wire)
		require.NotEmpty(t, req.Model)
		require.NotEmpty(t, req.Messages)
		for _, m := range req.Messages {
			require.Contains(t, []string{"system", "user", "assistant", "tool"}, m.Role)
		}
		// What decodes must hash and re-encode without trouble.
		_ = prefixHashes(req.Messages)
		_, err = json.Marshal(req)
		require.NoError(t, err)
	})
}

func FuzzDecodeAnthropic(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"text","text":"a"},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r"}],"is_error":true},{"type":"text","text":"next"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		_, req, err := decodeAnthropic(body)
		if err != nil {
			var ae *apiError
			require.ErrorAs(t, err, &ae)
			require.Equal(t, 400, ae.Status)
			return
		}
		require.Positive(t, req.MaxTokens)
		for _, m := range req.Messages {
			require.Contains(t, []string{"system", "user", "assistant", "tool"}, m.Role)
			for _, tc := range m.ToolCalls {
				require.True(t, json.Valid([]byte(tc.Arguments)))
			}
		}
	})
}

func TestUTF8CarryNeverSplitsACharacter(t *testing.T) {
	text := "añ€😀b"
	for cut1 := 0; cut1 <= len(text); cut1++ {
		for cut2 := cut1; cut2 <= len(text); cut2++ {
			var u utf8Carry
			var out strings.Builder
			for _, piece := range []string{text[:cut1], text[cut1:cut2], text[cut2:]} {
				p := u.next(piece)
				require.True(t, utf8.ValidString(p))
				out.WriteString(p)
			}
			out.WriteString(u.flush())
			require.Equal(t, text, out.String())
		}
	}
	var u utf8Carry
	require.Equal(t, "a", u.next("a\xe2\x82"))
	require.Equal(t, "\ufffd\ufffd", u.flush(), "a stream cut inside a character ends with replacement characters")
}
