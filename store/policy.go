package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// EnsurePolicyDeployment registers the in-process policy deployment name
// and its base version (serving, with its checkpoint) unless a serving
// version is already recorded, and returns the serving version. Serving
// always goes through an explicit version, so a freshly trained candidate
// only reaches users through a release.
func EnsurePolicyDeployment(ctx context.Context, db Beginner, name, baseVersion, checkpoint string) (string, error) {
	var serving string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path)
			VALUES ($1, $2, 'serving', $3) ON CONFLICT (id) DO NOTHING`, baseVersion, name, checkpoint); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO deployments (name, backend, serving_version) VALUES ($1, 'policy', $2)
			ON CONFLICT (name) DO UPDATE SET serving_version = coalesce(deployments.serving_version, EXCLUDED.serving_version)`,
			name, baseVersion); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT serving_version FROM deployments WHERE name = $1`, name).Scan(&serving)
	})
	if err != nil {
		return "", fmt.Errorf("ensure policy deployment %s: %w", name, err)
	}
	return serving, nil
}
