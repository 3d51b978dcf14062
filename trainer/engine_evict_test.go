package trainer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

// TestEngineEvictRereadsAVersion: an evicted version is loaded again on
// its next request (its checkpoint may have been replaced), a request
// already running on it is not disturbed, and the serving version is
// never evicted.
func TestEngineEvictRereadsAVersion(t *testing.T) {
	cfg := ModelConfig{Context: 64, Layers: 1, Heads: 2, DModel: 16, FFN: 32}
	base, err := NewModel(cfg, 1)
	require.NoError(t, err)
	first, err := NewModel(cfg, 2)
	require.NoError(t, err)
	second, err := NewModel(cfg, 3)
	require.NoError(t, err)
	stored := first
	loads := 0
	e, err := NewEngine(base, 1, EngineConfig{Loader: func(v int64) (*Model, error) {
		loads++
		return stored, nil
	}})
	require.NoError(t, err)

	zero := 0.0
	req := func(version string) *inference.Request {
		return &inference.Request{Messages: []inference.Message{{Role: "user", Content: "hi"}}, MaxTokens: 4, Temperature: &zero, Version: version}
	}
	direct := func(m *Model) []float32 {
		d, err := NewEngine(m, 7, EngineConfig{})
		require.NoError(t, err)
		resp, err := d.Complete(context.Background(), req(""))
		require.NoError(t, err)
		return resp.Logprobs
	}

	resp, err := e.Complete(context.Background(), req("v7"))
	require.NoError(t, err)
	require.Equal(t, direct(first), resp.Logprobs)
	_, err = e.Complete(context.Background(), req("v7"))
	require.NoError(t, err)
	require.Equal(t, 1, loads, "held in memory until evicted")

	// A stream running on v7 when it is evicted finishes on its weights.
	stored = second
	running, err := e.Stream(context.Background(), req("v7"), func(inference.Delta) error {
		e.Evict(7)
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, direct(first), running.Logprobs)

	resp, err = e.Complete(context.Background(), req("v7"))
	require.NoError(t, err)
	require.Equal(t, 2, loads, "read again after eviction")
	require.Equal(t, direct(second), resp.Logprobs)

	e.Evict(1)
	resp, err = e.Complete(context.Background(), req(""))
	require.NoError(t, err)
	require.Equal(t, "flywheel-policy@v1", resp.ModelVersion, "the serving version stays")
	require.Equal(t, 2, loads)
	e.Evict(99) // a version never loaded: nothing to do
}
