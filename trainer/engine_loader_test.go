package trainer

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/inference"
)

// TestEngineLoadsStoredVersionsOnDemand: a route may name a version this
// process never published (trained elsewhere) or one evicted by newer
// candidates; the engine loads it from the checkpoint directory instead of
// failing, and never evicts the current version.
func TestEngineLoadsStoredVersionsOnDemand(t *testing.T) {
	dir := CheckpointDir{Dir: t.TempDir()}
	models := map[int64]*Model{}
	for v := int64(1); v <= 3; v++ {
		m, err := NewModel(ModelConfig{Context: 64, Layers: 1, Heads: 2, DModel: 16, FFN: 32}, uint64(v))
		require.NoError(t, err)
		models[v] = m
		_, err = dir.Save(m, v, nil)
		require.NoError(t, err)
	}
	loads := 0
	e, err := NewEngine(models[1], 1, EngineConfig{KeepVersions: 1, Loader: func(v int64) (*Model, error) {
		loads++
		m, _, err := dir.Load(v)
		return m, err
	}})
	require.NoError(t, err)
	require.NoError(t, e.Publish(models[2], 2), "evicts v1 from memory")

	req := func(version string) *inference.Request {
		return &inference.Request{Messages: []inference.Message{{Role: "user", Content: "hi"}}, MaxTokens: 2, Version: version}
	}
	resp, err := e.Complete(context.Background(), req("flywheel-policy@v1"))
	require.NoError(t, err)
	require.Equal(t, "flywheel-policy@v1", resp.ModelVersion)
	require.Equal(t, 1, loads)

	resp, err = e.Complete(context.Background(), req("v3"))
	require.NoError(t, err, "a version trained by another process")
	require.Equal(t, "flywheel-policy@v3", resp.ModelVersion)

	resp, err = e.Complete(context.Background(), req(""))
	require.NoError(t, err)
	require.Equal(t, "flywheel-policy@v2", resp.ModelVersion, "loading old versions never changes the current one")

	_, err = e.Complete(context.Background(), req("v9"))
	var ie *inference.Error
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 404, ie.Status)
	_, err = e.Complete(context.Background(), req("other-model@v1"))
	require.ErrorAs(t, err, &ie)
	require.Equal(t, 404, ie.Status)
}
