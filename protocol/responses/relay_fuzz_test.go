package responses

import (
	"testing"
)

// FuzzRelayedStream: whatever a server streams, reading its events ends
// with an answer or an error, never a panic.
func FuzzRelayedStream(f *testing.F) {
	f.Add("response.created", []byte(`{"type":"response.created","response":{"id":"resp_1","output":[]}}`))
	f.Add("response.output_text.delta", []byte(`{"type":"response.output_text.delta","delta":"hi"}`))
	f.Add("response.completed", []byte(`{"type":"response.completed","response":{"id":"resp_1","status":"incomplete",`+
		`"incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}],"usage":{"input_tokens":3}}}`))
	f.Add("", []byte(`{"type":"error","code":null,"message":"boom"}`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		var s StreamReader
		_, _ = s.Event(name, data)
		if s.Response() == nil {
			t.Fatal("no answer")
		}
	})
}

// FuzzDecodeRelayed: any body decodes or fails with an error, never a
// panic, and a decoded one yields a neutral request.
func FuzzDecodeRelayed(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"},{"type":"input_text","text":"hi"}]},` +
		`{"type":"web_search_call","id":"ws"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_file","file_id":"f"}]}],` +
		`"tools":[{"type":"web_search"}],"tool_choice":{"type":"web_search"},"text":{"format":{"type":"bogus"}}}`))
	f.Add([]byte(`{"model":"m","previous_response_id":"resp_1"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRelayed(body)
		if err == nil && r.Neutral(nil) == nil {
			t.Fatal("no neutral request")
		}
	})
}
