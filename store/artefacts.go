package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// StoredArtefact is a versioned memory / harness / tool-schema artefact.
type StoredArtefact struct {
	ID         int64
	Deployment string
	Kind       string
	Version    int
	Content    []byte
	Status     string
}

// CreateArtefact writes the next version of a deployment's artefact kind as
// a candidate, its parent being the serving version, and returns it. key
// (may be empty) makes the call idempotent: the same key returns the same
// artefact.
func CreateArtefact(ctx context.Context, db Beginner, deployment, kind string, content []byte, key string) (StoredArtefact, error) {
	var a StoredArtefact
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		// Serialise version numbering per deployment and kind.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1 || '/' || $2))`, deployment, kind); err != nil {
			return err
		}
		if key != "" {
			err := tx.QueryRow(ctx, `SELECT id, deployment, kind, version, content, status FROM artefacts
WHERE deployment = $1 AND kind = $2 AND content->>'_key' = $3`, deployment, kind, key).Scan(&a.ID, &a.Deployment, &a.Kind, &a.Version, &a.Content, &a.Status)
			if err == nil {
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			content, err = withKey(content, key)
			if err != nil {
				return err
			}
		}
		return tx.QueryRow(ctx, `
INSERT INTO artefacts (deployment, kind, version, content, parent_id)
SELECT $1, $2, COALESCE(max(version), 0) + 1, $3,
       (SELECT id FROM artefacts WHERE deployment = $1 AND kind = $2 AND status = 'serving' ORDER BY version DESC LIMIT 1)
FROM artefacts WHERE deployment = $1 AND kind = $2
RETURNING id, deployment, kind, version, content, status`, deployment, kind, content).Scan(&a.ID, &a.Deployment, &a.Kind, &a.Version, &a.Content, &a.Status)
	})
	if err != nil {
		return StoredArtefact{}, fmt.Errorf("create %s artefact of %s: %w", kind, deployment, err)
	}
	return a, nil
}

// withKey adds "_key" to a JSON object.
func withKey(content []byte, key string) ([]byte, error) {
	if len(content) < 2 || content[0] != '{' {
		return nil, errors.New("artefact content must be a JSON object")
	}
	k := strconv.Quote(key)
	if string(content) == "{}" {
		return []byte(`{"_key":` + k + `}`), nil
	}
	return append([]byte(`{"_key":`+k+`,`), content[1:]...), nil
}

// ArtefactVersion reads one version of a deployment's artefact kind.
func ArtefactVersion(ctx context.Context, db DBTX, deployment, kind, version string) (StoredArtefact, error) {
	var a StoredArtefact
	err := db.QueryRow(ctx, `SELECT id, deployment, kind, version, content, status FROM artefacts
WHERE deployment = $1 AND kind = $2 AND version::text = $3`, deployment, kind, version).Scan(&a.ID, &a.Deployment, &a.Kind, &a.Version, &a.Content, &a.Status)
	if err != nil {
		return StoredArtefact{}, fmt.Errorf("read %s %s of %s: %w", kind, version, deployment, notFound(err))
	}
	return a, nil
}

// ServingArtefacts lists the serving version of each artefact kind of a
// deployment: what the gateway applies to its requests.
func ServingArtefacts(ctx context.Context, db DBTX, deployment string) ([]StoredArtefact, error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT ON (kind) id, deployment, kind, version, content, status FROM artefacts
WHERE deployment = $1 AND status = 'serving' ORDER BY kind, version DESC`, deployment)
	if err != nil {
		return nil, fmt.Errorf("serving artefacts of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (StoredArtefact, error) {
		var a StoredArtefact
		err := r.Scan(&a.ID, &a.Deployment, &a.Kind, &a.Version, &a.Content, &a.Status)
		return a, err
	})
}
