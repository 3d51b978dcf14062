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

// TestTuningHeldOutIsNeverReported: the prompts settings are tuned on are
// none of the prompts the online demo reports, and every base the demo or
// the rehearsal builds was built without them.
func TestTuningHeldOutIsNeverReported(t *testing.T) {
	for _, task := range []Task{DefaultTask, ToolsTask} {
		reported, err := EvalHeldOut(task, MaxEvalPrompts)
		require.NoError(t, err)
		tuning, err := TuningHeldOut(task, deployHeldOutSeed, 200)
		require.NoError(t, err)
		require.Len(t, tuning, 200)
		unseen, err := HeldOut(task, deployHeldOutSeed, max(TuningHeldOutSpan(200), baseHeldOut))
		require.NoError(t, err)
		seen := map[string]bool{}
		for _, p := range reported {
			seen[p.Text] = true
		}
		excluded := map[string]bool{}
		for _, p := range unseen {
			excluded[p.Text] = true
		}
		for _, p := range tuning {
			require.False(t, seen[p.Text], "%q is reported", p.Text)
			require.True(t, excluded[p.Text], "%q may have been trained on", p.Text)
		}
	}
}
