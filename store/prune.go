package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// PrunableStates are up to limit versions of deployment, oldest first,
// whose training states the training loop no longer needs, by id with
// their checkpoint paths: versions rolled back or retired; candidates older
// than the newest version a release has finished with (the loop releases
// only its newest candidate, so an older one is never released and never
// becomes serving or the anchor); and superseded versions older than the
// newest keepSuperseded of them (a rollback goes to the anchor, which the
// caller keeps, or to a version a person names: a step from one whose
// state is gone starts from TrainableBase instead). keep names versions
// the training loop still holds (its serving version, the line's start
// and head, the pending candidate, the anchor), which are never
// prunable. A version whose state was pruned already, or that has no
// checkpoint, is not listed.
func PrunableStates(ctx context.Context, db DBTX, deployment string, keep []string, keepSuperseded, limit int) (map[string]string, error) {
	if keep == nil {
		keep = []string{} // id = ANY(NULL) is NULL, which would keep everything
	}
	rows, err := db.Query(ctx, `
		SELECT id, checkpoint_path FROM model_versions
		WHERE deployment = $1 AND checkpoint_path <> '' AND state_pruned_at IS NULL AND NOT (id = ANY($2))
		  AND (status IN ('rolled_back', 'retired')
		       OR (status = 'candidate' AND created_at < (
		           SELECT max(created_at) FROM model_versions
		           WHERE deployment = $1 AND status IN ('serving', 'superseded', 'rolled_back')))
		       OR (status = 'superseded' AND id NOT IN (
		           SELECT id FROM model_versions WHERE deployment = $1 AND status = 'superseded'
		           ORDER BY created_at DESC LIMIT $4)))
		ORDER BY created_at LIMIT $3`, deployment, keep, limit, keepSuperseded)
	if err != nil {
		return nil, fmt.Errorf("prunable states of %s: %w", deployment, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, path string
		if err := rows.Scan(&id, &path); err != nil {
			return nil, err
		}
		out[id] = path
	}
	return out, rows.Err()
}

// MarkStatesPruned records that the versions' training states are gone.
func MarkStatesPruned(ctx context.Context, db DBTX, versions []string) error {
	if _, err := db.Exec(ctx, `UPDATE model_versions SET state_pruned_at = now() WHERE id = ANY($1) AND state_pruned_at IS NULL`, versions); err != nil {
		return fmt.Errorf("mark states pruned: %w", err)
	}
	return nil
}

// TrainableBase is the version a train step starts from in place of
// version: version itself unless its training state was pruned, else the
// newest version of the deployment that serves or served and still has
// its state (the serving one first), else "" (the deployment's base
// model).
func TrainableBase(ctx context.Context, db DBTX, deployment, version string) (string, error) {
	if version == "" {
		return "", nil
	}
	var pruned bool
	err := db.QueryRow(ctx, `SELECT state_pruned_at IS NOT NULL FROM model_versions WHERE id = $1 AND deployment = $2`,
		version, deployment).Scan(&pruned)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !pruned) {
		return version, nil
	}
	if err != nil {
		return "", fmt.Errorf("trainable base of %s: %w", deployment, err)
	}
	var v string
	err = db.QueryRow(ctx, `
		SELECT id FROM model_versions
		WHERE deployment = $1 AND status IN ('serving', 'superseded') AND checkpoint_path <> '' AND state_pruned_at IS NULL
		ORDER BY status = 'serving' DESC, created_at DESC LIMIT 1`, deployment).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("trainable base of %s: %w", deployment, err)
	}
	return v, nil
}
