package store

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/jackc/pgx/v5"
)

// EnsurePolicyDeployment registers the in-process policy deployment name,
// an upstream deployment whose engine is the policy's model server (server
// says where it is and how its weights sync), and its base version
// (serving, with its checkpoint) unless a serving version is already
// recorded. It returns the serving version. With record set the stored
// config becomes server (the process that runs the model server knows
// where it is); otherwise a stored config stays as it is. Serving always
// goes through an explicit version, so a freshly trained candidate only
// reaches users through a release.
func EnsurePolicyDeployment(ctx context.Context, db Beginner, name, baseVersion, checkpoint string, server deployment.Settings, record bool) (string, error) {
	if err := server.Validate(); err != nil {
		return "", fmt.Errorf("ensure policy deployment %s: model server: %w", name, err)
	}
	raw, err := json.Marshal(server)
	if err != nil {
		return "", err
	}
	var serving string
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO model_versions (id, deployment, status, checkpoint_path)
			VALUES ($1, $2, 'serving', $3) ON CONFLICT (id) DO NOTHING`, baseVersion, name, checkpoint); err != nil {
			return err
		}
		// A deployment recorded before the model server (backend 'policy')
		// becomes the upstream it now is.
		if _, err := tx.Exec(ctx, `INSERT INTO deployments (name, backend, config, serving_version) VALUES ($1, $4, $3, $2)
			ON CONFLICT (name) DO UPDATE SET serving_version = coalesce(deployments.serving_version, EXCLUDED.serving_version),
				backend = EXCLUDED.backend,
				config = CASE WHEN $5 OR deployments.backend <> EXCLUDED.backend THEN EXCLUDED.config ELSE deployments.config END,
				updated_at = CASE WHEN $5 OR deployments.backend <> EXCLUDED.backend THEN now() ELSE deployments.updated_at END`,
			name, baseVersion, raw, deployment.BackendUpstream, record); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT serving_version FROM deployments WHERE name = $1`, name).Scan(&serving)
	})
	if err != nil {
		return "", fmt.Errorf("ensure policy deployment %s: %w", name, err)
	}
	return serving, nil
}
