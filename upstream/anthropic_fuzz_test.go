package upstream

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzAnthropicStream: whatever a server streams, reading it ends with an
// answer or an error, never a panic, and every event passed on is the
// data the server sent.
func FuzzAnthropicStream(f *testing.F) {
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":3}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":4}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"))
	f.Add([]byte("data: {\"type\":\"content_block_delta\",\"index\":-1}\n\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		out, err := readSSE(bytes.NewReader(stream), "m", func() {}, func(ev SSEEvent) error {
			if !json.Valid(ev.Data) || !bytes.Contains(stream, bytes.SplitN(ev.Data, []byte("\n"), 2)[0]) {
				t.Fatalf("event data %q is not what was sent", ev.Data)
			}
			return nil
		})
		if out == nil || out.Response == nil {
			t.Fatalf("no answer (err %v)", err)
		}
		var m anthropicMessage
		if json.Unmarshal(stream, &m) == nil {
			var mb messageBuilder
			mb.start(&m)
			_ = mb.response("m")
		}
	})
}
