package upstream

import (
	"bytes"
	"testing"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
)

// FuzzReadGenerateStream: whatever SGLang's /generate stream holds, the
// reader returns an answer or an error, never panics, and what it emitted
// is what it kept.
func FuzzReadGenerateStream(f *testing.F) {
	f.Add([]byte(`data: {"text":"ab","output_ids":[97,98],"meta_info":{"finish_reason":null,"completion_tokens":2,"output_token_logprobs":[[-0.1,97,"a"],[null,98,null]]}}` + "\n\n" +
		`data: {"text":"abc","output_ids":[97,98,99],"meta_info":{"finish_reason":{"type":"stop"},"completion_tokens":3,"output_token_logprobs":[[-0.1,97,"a"],[-0.2,98,"b"],[-0.3,99,"c"]],"output_top_logprobs":[null,[],[[-0.3,99,"c"]]]}}` + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`data: {"text":"ab","meta_info":{"completion_tokens":2,"output_token_logprobs":[[-0.1,97],[-0.2,98]]}}` + "\n\n" +
		`data: {"text":"","meta_info":{"completion_tokens":1,"output_token_logprobs":[[-0.1,97]]}}` + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`data: {"error":{"message":"boom"}}` + "\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`data: {"text":"x","meta_info":{"finish_reason":{"type":"abort","message":"cut"}}}` + "\n\n"))
	b := &Backend{cfg: Config{Model: "m", Dialect: deployment.DialectSGLang}}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ids []int
		resp, err := b.readGenerateStream(bytes.NewReader(data), []int{1, 2}, func(d inference.Delta) error {
			ids = append(ids, d.TokenIDs...)
			return nil
		})
		if resp == nil {
			t.Fatal("no response kept")
		}
		if len(resp.CompletionTokenIDs) != len(resp.Logprobs) {
			t.Fatalf("%d ids, %d logprobs", len(resp.CompletionTokenIDs), len(resp.Logprobs))
		}
		if err == nil && len(ids) != len(resp.CompletionTokenIDs) {
			t.Fatalf("emitted %d ids, kept %d", len(ids), len(resp.CompletionTokenIDs))
		}
	})
}
