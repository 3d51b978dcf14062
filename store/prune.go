package store

import (
	"context"
	"fmt"
)

// PrunableStates are up to limit versions of deployment, oldest first,
// whose training states no step can start from again, by id with their
// checkpoint paths: versions rolled back or retired, and candidates older
// than the newest version a release has finished with (the loop releases
// only its newest candidate, so an older one is never released and never
// becomes serving or the anchor). keep names versions the training loop
// still holds (its serving version, the line's start and head, the
// pending candidate), which are never prunable. A version whose state was
// pruned already, or that has no checkpoint, is not listed.
func PrunableStates(ctx context.Context, db DBTX, deployment string, keep []string, limit int) (map[string]string, error) {
	if keep == nil {
		keep = []string{} // id = ANY(NULL) is NULL, which would keep everything
	}
	rows, err := db.Query(ctx, `
		SELECT id, checkpoint_path FROM model_versions
		WHERE deployment = $1 AND checkpoint_path <> '' AND state_pruned_at IS NULL AND NOT (id = ANY($2))
		  AND (status IN ('rolled_back', 'retired')
		       OR (status = 'candidate' AND created_at < (
		           SELECT max(created_at) FROM model_versions
		           WHERE deployment = $1 AND status IN ('serving', 'superseded', 'rolled_back'))))
		ORDER BY created_at LIMIT $3`, deployment, keep, limit)
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
