package trainer

import (
	"context"
	"math/rand/v2"
	"testing"
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
