package trainer

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/flywheel-ai/flywheel/inference"
)

// go test -bench . -run XXX ./trainer/ — per-op figures; `flywheel bench
// trainer` prints the ratios.

func benchTrainStep(b *testing.B, noPacking bool) {
	m, err := NewModel(ModelConfig{}, 1)
	if err != nil {
		b.Fatal(err)
	}
	l, err := NewLocal(m, 0, Config{NoPacking: noPacking, MaxStaleness: -1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	batch := benchBatch(rand.New(rand.NewPCG(1, 1)), 8, 8, 64, 48)
	b.ResetTimer()
	var tokens int
	for i := 0; i < b.N; i++ {
		r, err := l.TrainStep(context.Background(), batch)
		if err != nil {
			b.Fatal(err)
		}
		tokens += r.TotalTokens
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkTrainStepPacked(b *testing.B)   { benchTrainStep(b, false) }
func BenchmarkTrainStepUnpacked(b *testing.B) { benchTrainStep(b, true) }

func BenchmarkGenerate64(b *testing.B) {
	m, err := NewModel(ModelConfig{}, 1)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	b.ResetTimer()
	var tokens float64
	for i := 0; i < b.N; i++ {
		tps, err := timeSampling(context.Background(), m, rng, 64, 32)
		if err != nil {
			b.Fatal(err)
		}
		tokens += tps
	}
	b.ReportMetric(tokens/float64(b.N), "tokens/s")
}

// BenchmarkEngineConcurrent16 is 16 agents calling Complete at once with a
// short chat prompt, as the demo's fleet does through the gateway.
func BenchmarkEngineConcurrent16(b *testing.B) {
	m, err := NewModel(ModelConfig{}, 1)
	if err != nil {
		b.Fatal(err)
	}
	e, err := NewEngine(m, 1, EngineConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var tokens atomic.Int64
	for i := 0; i < b.N; i++ {
		var wg sync.WaitGroup
		for a := 0; a < 16; a++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := e.Complete(context.Background(), &inference.Request{
					Messages: []inference.Message{{Role: "user", Content: "reverse: abcd"}}, MaxTokens: 8})
				if err != nil {
					b.Error(err)
					return
				}
				tokens.Add(int64(len(resp.CompletionTokenIDs)))
			}()
		}
		wg.Wait()
	}
	b.ReportMetric(float64(16*b.N)/b.Elapsed().Seconds(), "requests/s")
	b.ReportMetric(float64(tokens.Load())/b.Elapsed().Seconds(), "tokens/s")
}
