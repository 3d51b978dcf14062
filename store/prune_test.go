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
// retired ones, the candidates older than the newest version a release
// finished with, and the superseded ones older than the newest few are
// prunable; the serving version, the newest superseded ones, the
// candidates after that release, the ones the loop keeps, those without
// a checkpoint and those pruned already are not, nor another
// deployment's.
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

	got, err := store.PrunableStates(ctx, pool, dep, []string{v(4), v(8)}, 2, 100)
	require.NoError(t, err)
	require.Equal(t, map[string]string{v(1): "/c/v1", v(2): "/c/v2", v(6): "/c/v6"}, got, "both superseded versions are the newest two")

	got, err = store.PrunableStates(ctx, pool, dep, []string{v(4), v(8)}, 1, 100)
	require.NoError(t, err)
	require.Equal(t, map[string]string{v(0): "/c/v0", v(1): "/c/v1", v(2): "/c/v2", v(6): "/c/v6"}, got, "v5 is the newest superseded")
	got, err = store.PrunableStates(ctx, pool, dep, []string{v(0), v(4)}, 0, 100)
	require.NoError(t, err)
	require.Equal(t, map[string]string{v(1): "/c/v1", v(2): "/c/v2", v(5): "/c/v5", v(6): "/c/v6"}, got, "a kept superseded version (the anchor) stays")

	got, err = store.PrunableStates(ctx, pool, dep, nil, 2, 2)
	require.NoError(t, err)
	require.Equal(t, map[string]string{v(1): "/c/v1", v(2): "/c/v2"}, got, "the oldest first, up to the limit")

	require.NoError(t, store.MarkStatesPruned(ctx, pool, []string{v(1), v(2), v(6)}))
	got, err = store.PrunableStates(ctx, pool, dep, []string{v(4)}, 2, 100)
	require.NoError(t, err)
	require.Empty(t, got, fmt.Sprint(got))
}

// TestTrainableBase: a step starts from the version it asks for unless
// that version's training state was pruned; then from the newest version
// that serves or served and still has its state (the serving one first),
// and from the base model when none has.
func TestTrainableBase(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	dep := "trainable-" + time.Now().Format("150405.000000")
	v := func(n int) string { return store.VersionID(dep, int64(n)) }
	for i, status := range []string{"superseded", "superseded", "superseded", "candidate", "serving"} {
		_, err := pool.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path, created_at) VALUES ($1, $2, $3, $4, now() - make_interval(mins => $5))`,
			v(i+1), dep, status, fmt.Sprintf("/c/v%d", i+1), 60-i)
		require.NoError(t, err)
	}
	base := func(version string) string {
		t.Helper()
		got, err := store.TrainableBase(ctx, pool, dep, version)
		require.NoError(t, err)
		return got
	}
	require.Equal(t, v(2), base(v(2)), "its state is there")
	require.Equal(t, "", base(""), "the base model")
	require.Equal(t, dep+"@v99", base(dep+"@v99"), "a version not recorded is as asked")

	// A person rolled back to v1, whose state was pruned as superseded.
	serve := func(n int) {
		t.Helper()
		_, err := pool.Exec(ctx, `UPDATE model_versions SET status = CASE id WHEN $1 THEN 'serving' ELSE 'superseded' END
			WHERE deployment = $2 AND status IN ('serving', 'superseded')`, v(n), dep)
		require.NoError(t, err)
	}
	serve(1)
	require.NoError(t, store.MarkStatesPruned(ctx, pool, []string{v(1)}))
	require.Equal(t, v(5), base(v(1)), "the newest that served, with its state")
	serve(2)
	require.Equal(t, v(2), base(v(1)), "the serving one first")
	require.NoError(t, store.MarkStatesPruned(ctx, pool, []string{v(2), v(3), v(5)}))
	require.Equal(t, "", base(v(1)), "none has a state: the base model")
}
