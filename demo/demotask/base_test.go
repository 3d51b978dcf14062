package demotask

import (
	"context"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestBaseIsCachedAndDeterministic(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := BaseConfig{Steps: 3, BatchSize: 4}
	m1, cached, err := LoadOrBuildBase(ctx, dir, DefaultTask, cfg, 1, 20, quiet())
	require.NoError(t, err)
	require.False(t, cached)
	m2, cached, err := LoadOrBuildBase(ctx, dir, DefaultTask, cfg, 1, 20, quiet())
	require.NoError(t, err)
	require.True(t, cached)
	require.Equal(t, m1.W, m2.W)
	m3, err := BuildBase(ctx, DefaultTask, cfg, nil)
	require.NoError(t, err)
	require.Equal(t, m1.W, m3.W, "the same configuration builds the same base")

	// A different configuration is a different cache entry.
	_, cached, err = LoadOrBuildBase(ctx, dir, DefaultTask, BaseConfig{Steps: 4, BatchSize: 4}, 1, 20, quiet())
	require.NoError(t, err)
	require.False(t, cached)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 2)

	_, err = BuildBase(ctx, DefaultTask, BaseConfig{Steps: -1}, nil)
	require.Error(t, err)
}
