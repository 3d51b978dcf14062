package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkChatCompletion is one captured non-streaming call through the
// gateway (fixture upstream, real Postgres), with parallel clients so
// group commit can batch.
func BenchmarkChatCompletion(b *testing.B) {
	e := newEnvB(b)
	body := []byte(`{"model":"fixture-model","messages":[{"role":"user","content":"hello there"}]}`)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", e.url+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+e.keyA)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}
