package trainer

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The export/import path end to end: DirTrainer writes batches, the
// built-in trainer behind ServeDir plays the external trainer, and the
// engine ends up serving exactly the weights that trainer produced.
func TestDirTrainerRoundTrip(t *testing.T) {
	dir := t.TempDir()
	m, err := NewModel(ModelConfig{Context: 32, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, 1)
	require.NoError(t, err)
	eng, err := NewEngine(m, 1, EngineConfig{})
	require.NoError(t, err)
	ext, err := NewLocal(m, 1, Config{}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		err := ServeDir(ctx, dir, ext, 10*time.Millisecond)
		if ctx.Err() == nil {
			t.Errorf("serve dir stopped: %v", err)
			cancel()
		}
		served <- err
	}()

	d, err := NewDirTrainer(dir, 10*time.Millisecond, AdvantageConfig{}, eng, nil)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(2, 2))
	for step := 0; step < 2; step++ {
		b := groupBatch(rng, 1, 4, 6, 4)
		for i := range b.Samples {
			for t := range b.Samples[i].Versions {
				b.Samples[i].Versions[t] = 1
			}
		}
		res, err := d.TrainStep(ctx, b)
		require.NoError(t, err)
		require.Equal(t, int64(2+step), res.Version)
	}
	got, v := eng.Current()
	require.Equal(t, int64(3), v)
	require.Equal(t, ext.Snapshot().W, got.W)
	require.NotEqual(t, m.W, got.W)

	// A new DirTrainer continues the numbering; a step nobody answers ends
	// with the context.
	d2, err := NewDirTrainer(dir, 10*time.Millisecond, AdvantageConfig{}, eng, nil)
	require.NoError(t, err)
	require.Equal(t, int64(2), d2.seq)
	cancel()
	require.ErrorIs(t, <-served, context.Canceled)
	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	_, err = d2.TrainStep(short, groupBatch(rng, 1, 2, 6, 4))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
