package trainer

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckpointDir(t *testing.T) {
	d := CheckpointDir{Dir: filepath.Join(t.TempDir(), "ckpt")}
	_, _, _, err := d.Latest()
	require.ErrorIs(t, err, ErrNoCheckpoint)
	m1, err := NewModel(ModelConfig{Context: 16, Layers: 1, Heads: 1, DModel: 8, FFN: 8}, 1)
	require.NoError(t, err)
	m2, err := NewModel(m1.Config, 2)
	require.NoError(t, err)
	_, err = d.Save(m1, 9, nil)
	require.NoError(t, err)
	_, err = d.Save(m2, 10, map[string]string{"note": "x"})
	require.NoError(t, err)
	_, err = d.Save(m1, 10, nil)
	require.ErrorContains(t, err, "immutable")
	vs, err := d.Versions()
	require.NoError(t, err)
	require.Equal(t, []int64{9, 10}, vs)
	got, v, meta, err := d.Latest()
	require.NoError(t, err)
	require.Equal(t, int64(10), v)
	require.Equal(t, "x", meta["note"])
	require.Equal(t, m2.W, got.W)
	old, _, err := d.Load(9)
	require.NoError(t, err)
	require.Equal(t, m1.W, old.W)
}
