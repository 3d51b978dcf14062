package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/migrations"
)

func tables(t *testing.T, ctx context.Context, url string) []string {
	t.Helper()
	db, err := migrations.Open(url)
	require.NoError(t, err)
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'public' AND table_name <> 'goose_db_version' ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestUpDownUpOnFreshDatabase(t *testing.T) {
	ctx := context.Background()
	url := testenv.DatabaseURL(t, false)
	db, err := migrations.Open(url)
	require.NoError(t, err)
	defer db.Close()

	n, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Positive(t, n)
	cur, latest, err := migrations.Version(ctx, db)
	require.NoError(t, err)
	require.Equal(t, latest, cur)
	got := tables(t, ctx, url)
	for _, want := range []string{"tenants", "api_keys", "sessions", "interactions", "rewards", "trajectories",
		"atdp_steps", "training_samples", "model_versions", "model_version_lineage", "releases", "gate_results",
		"evolution_decisions", "artefacts", "forget_requests", "end_user_consent", "deployments"} {
		require.Contains(t, got, want)
	}

	again, err := migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Zero(t, again, "a second up applies nothing")

	_, err = migrations.DownTo(ctx, db, 0)
	require.NoError(t, err)
	require.Empty(t, tables(t, ctx, url), "down removes every table")

	_, err = migrations.Up(ctx, db)
	require.NoError(t, err)
	require.Equal(t, got, tables(t, ctx, url), "up after down restores the same schema")
}

func TestEveryTenantOwnedTableCarriesTenantID(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	// Tables that belong to the system, not to a tenant.
	// Adding a table here is a decision: it must hold no tenant's raw data
	// (aggregates over a deployment, such as task_baselines, are fine).
	system := map[string]bool{"tenants": true, "deployments": true, "model_versions": true, "artefacts": true,
		"releases": true, "gate_results": true, "evolution_decisions": true, "goose_db_version": true,
		"task_baselines": true, "training_runs": true, "eval_prompts": true,
		// A version's answers to the operator's suite prompts, and the
		// watchdog's numbers on them: no tenant's text.
		"suite_results": true, "watchdog_checks": true}
	rows, err := pool.Query(ctx, `SELECT t.table_name,
		EXISTS (SELECT 1 FROM information_schema.columns c
		        WHERE c.table_schema = 'public' AND c.table_name = t.table_name AND c.column_name = 'tenant_id')
		FROM information_schema.tables t WHERE t.table_schema = 'public'`)
	require.NoError(t, err)
	defer rows.Close()
	checked := 0
	for rows.Next() {
		var name string
		var has bool
		require.NoError(t, rows.Scan(&name, &has))
		if system[name] {
			continue
		}
		checked++
		require.True(t, has, "table %s holds tenant data but has no tenant_id", name)
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, checked, 9)
}

func TestRewardRejectsNonFiniteValues(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO tenants (id, name) VALUES ('t1', 't1')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO sessions (id, tenant_id, identity_mode) VALUES ('s1', 't1', 'header')`)
	require.NoError(t, err)
	for _, v := range []string{"NaN", "Infinity", "-Infinity"} {
		_, err = pool.Exec(ctx, `INSERT INTO rewards (tenant_id, session_id, value) VALUES ('t1', 's1', $1::float8)`, v)
		require.Error(t, err, v)
	}
	_, err = pool.Exec(ctx, `INSERT INTO rewards (tenant_id, session_id, value) VALUES ('t1', 's1', 0.5)`)
	require.NoError(t, err)
}
