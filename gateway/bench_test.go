package gateway_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/gateway"
	"github.com/flywheel-ai/flywheel/internal/testenv"
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

// TestSessionGrowthStoresEachByteOnce runs `flywheel bench session-growth`
// small: through an upstream in vLLM's dialect, a session's later turns
// store only what they add, so the session stores about what it holds.
func TestSessionGrowthStoresEachByteOnce(t *testing.T) {
	res, err := gateway.RunGrowth(context.Background(), gateway.GrowthConfig{Pool: testenv.Pool(t), Turns: 6, TurnKB: 4, Out: io.Discard})
	require.NoError(t, err)
	require.Len(t, res.PerTurn, 6)
	require.Less(t, res.Ratio, 1.05, "stored ÷ unique")
	last, second := res.PerTurn[5], res.PerTurn[1]
	require.Less(t, last.StoredBytes, 2*second.StoredBytes, "turn 6 stores about what turn 2 does, not the conversation so far")
}
