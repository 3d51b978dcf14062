package ggraph

import (
	"context"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/trainer"
)

// BenchmarkDemoStep is one GRPO step of the demo policy through the graph
// (go test -bench DemoStep -cpuprofile ... to see where the time goes).
func BenchmarkDemoStep(b *testing.B) {
	m, err := trainer.NewModel(trainer.ModelConfig{}, 2)
	require.NoError(b, err)
	batch := trainer.BenchBatch(rand.New(rand.NewPCG(1, 2)), 16, 8, 32, 24)
	gg, err := NewTrainer(m, 0, trainer.Config{MaxStaleness: -1}, nil)
	require.NoError(b, err)
	defer gg.Close()
	if os.Getenv("HAND") == "1" {
		l, err := trainer.NewLocal(m, 0, trainer.Config{MaxStaleness: -1}, nil)
		require.NoError(b, err)
		for i := 0; i < b.N; i++ {
			_, err := l.TrainStep(context.Background(), batch)
			require.NoError(b, err)
		}
		return
	}
	for i := 0; i < b.N; i++ {
		_, err := gg.TrainStep(context.Background(), batch)
		require.NoError(b, err)
	}
}
