package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/store"
)

// TestPrunableStates: of a deployment's versions, the rolled-back and
// retired ones and the candidates older than the newest version a release
// finished with are prunable; serving and superseded versions (the anchor
// and the rollback targets), the candidates after that release, the ones
// the loop keeps, those without a checkpoint and those pruned already are
// not, nor another deployment's.
func TestPrunableStates(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	dep := "prune-" + time.Now().Format("150405.000000")
	rows := []struct{ v, status, ckpt string }{
		{"v0", "superseded", "/c/v0"},
		{"v1", "candidate", "/c/v1"},   // replaced by v2 before release: prunable
		{"v2", "rolled_back", "/c/v2"}, // prunable
		{"v3", "candidate", ""},        // no checkpoint
		{"v4", "candidate", "/c/v4"},   // kept by the loop
		{"v5", "superseded", "/c/v5"},
		{"v6", "retired", "/c/v6"},   // prunable
		{"v7", "candidate", "/c/v7"}, // pruned already
		{"v8", "serving", "/c/v8"},
		{"v9", "candidate", "/c/v9"}, // newer than every released version
	}
	for i, r := range rows {
		_, err := pool.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path, created_at) VALUES ($1, $2, $3, $4, now() - make_interval(mins => $5))`,
			store.VersionID(dep, int64(i)), dep, r.status, r.ckpt, 60-i)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path) VALUES ($1, $2, 'rolled_back', '/c/other')`, dep+"-other@v1", dep+"-other")
	require.NoError(t, err)
	v := func(n int) string { return store.VersionID(dep, int64(n)) }
	require.NoError(t, store.MarkStatesPruned(ctx, pool, []string{v(7)}))

	got, err := store.PrunableStates(ctx, pool, dep, []string{v(4), v(8)}, 100)
	require.NoError(t, err)
	require.Equal(t, map[string]string{v(1): "/c/v1", v(2): "/c/v2", v(6): "/c/v6"}, got)

	got, err = store.PrunableStates(ctx, pool, dep, nil, 2)
	require.NoError(t, err)
	require.Equal(t, map[string]string{v(1): "/c/v1", v(2): "/c/v2"}, got, "the oldest first, up to the limit")

	require.NoError(t, store.MarkStatesPruned(ctx, pool, []string{v(1), v(2), v(6)}))
	got, err = store.PrunableStates(ctx, pool, dep, []string{v(4)}, 100)
	require.NoError(t, err)
	require.Empty(t, got, fmt.Sprint(got))
}
