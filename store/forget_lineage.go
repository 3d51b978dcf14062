package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ForgetOutcome is what a forget request did.
type ForgetOutcome struct {
	Sessions []string
	// Affected are the versions trained on the data, directly or through a
	// parent; they are retired.
	Affected []string
	// Rollbacks maps a deployment whose serving version was affected to
	// the clean version that serves now ("" when none was left).
	Rollbacks map[string]string
	// Checkpoints of the retired versions, for the caller to delete.
	Checkpoints []string
	// Restart maps every deployment that had a retired version (serving
	// or a candidate a trainer may hold) to the clean version serving it
	// now, which its trainer must go on from ("" when none is left).
	Restart map[string]string
}

// RetireForgotten finishes a forget request the gateway recorded (it
// deleted the data and kept the sessions' ids in deleted.sessions): it
// finds every version trained on those sessions through lineage, and every
// version descended from them (weights inherit their parent's), rolls each
// deployment that serves one back to its newest clean version, stops
// running releases of them and retires them. affected_versions is updated
// to the full list. Running it again changes nothing more.
func RetireForgotten(ctx context.Context, db Beginner, requestID int64) (ForgetOutcome, error) {
	out := ForgetOutcome{Rollbacks: map[string]string{}, Restart: map[string]string{}}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var tenant string
		var deleted []byte
		if err := tx.QueryRow(ctx, `SELECT tenant_id, deleted FROM forget_requests WHERE id = $1 FOR UPDATE`, requestID).Scan(&tenant, &deleted); err != nil {
			return fmt.Errorf("read request: %w", notFound(err))
		}
		var d struct {
			Sessions []string `json:"sessions"`
		}
		if err := json.Unmarshal(deleted, &d); err != nil {
			return fmt.Errorf("read request: deleted: %w", err)
		}
		out.Sessions = d.Sessions
		if out.Sessions == nil {
			out.Sessions = []string{}
		}
		// Lineage keeps the (tenant, session) of every sample, so versions
		// are found after the samples themselves are gone.
		rows, err := tx.Query(ctx, `
WITH RECURSIVE hit AS (
    SELECT DISTINCT l.version_id AS id FROM model_version_lineage l
    WHERE l.tenant_id = $1 AND l.session_id = ANY($2)
  UNION
    SELECT v.id FROM model_versions v JOIN hit ON v.parent_version = hit.id
)
SELECT id FROM hit ORDER BY id`, tenant, out.Sessions)
		if err != nil {
			return err
		}
		if out.Affected, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		if out.Affected == nil {
			out.Affected = []string{}
		}
		if len(out.Affected) > 0 {
			if err := retireAffected(ctx, tx, requestID, &out); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT DISTINCT v.deployment, coalesce(d.serving_version, '')
FROM model_versions v LEFT JOIN deployments d ON d.name = v.deployment WHERE v.id = ANY($1)`, out.Affected)
			if err != nil {
				return err
			}
			var dep, serving string
			if _, err := pgx.ForEachRow(rows, []any{&dep, &serving}, func() error {
				out.Restart[dep] = serving
				return nil
			}); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `UPDATE forget_requests SET affected_versions = $2 WHERE id = $1`, requestID, out.Affected)
		return err
	})
	if err != nil {
		return ForgetOutcome{}, fmt.Errorf("retire versions of forget request %d: %w", requestID, err)
	}
	return out, nil
}

func retireAffected(ctx context.Context, tx pgx.Tx, requestID int64, out *ForgetOutcome) error {
	reason := fmt.Sprintf("forget request %d", requestID)
	rows, err := tx.Query(ctx, `SELECT name, serving_version FROM deployments WHERE serving_version = ANY($1) ORDER BY name FOR UPDATE`, out.Affected)
	if err != nil {
		return err
	}
	type dep struct{ name, serving string }
	deps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dep, error) {
		var d dep
		err := r.Scan(&d.name, &d.serving)
		return d, err
	})
	if err != nil {
		return err
	}
	for _, d := range deps {
		var clean *string
		err := tx.QueryRow(ctx, `
SELECT id FROM model_versions WHERE deployment = $1 AND id <> ALL($2) AND status IN ('serving', 'superseded')
ORDER BY created_at DESC, id DESC LIMIT 1`, d.name, out.Affected).Scan(&clean)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		to := ""
		if clean != nil {
			to = *clean
			if _, err := tx.Exec(ctx, `UPDATE model_versions SET status = 'serving' WHERE id = $1`, to); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE deployments SET serving_version = NULLIF($2, ''), updated_at = now() WHERE name = $1`, d.name, to); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO releases (deployment, layer, candidate, baseline, status, reason, phase, finished_at)
VALUES ($1, 'weights', $2, $3, 'rolled_back', $4, 'done', now())`, d.name, d.serving, to, reason); err != nil {
			return err
		}
		out.Rollbacks[d.name] = to
	}
	if _, err := tx.Exec(ctx, `UPDATE releases SET status = 'aborted', reason = $2, phase = 'done', canary_share = 0, finished_at = now()
WHERE layer = 'weights' AND status = 'running' AND candidate = ANY($1)`, out.Affected, reason); err != nil {
		return err
	}
	rows, err = tx.Query(ctx, `UPDATE model_versions SET status = 'retired', retired_reason = $2 WHERE id = ANY($1) AND status <> 'retired'
RETURNING checkpoint_path`, out.Affected, reason)
	if err != nil {
		return err
	}
	paths, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, p := range paths {
		if p != "" {
			out.Checkpoints = append(out.Checkpoints, p)
		}
	}
	return nil
}
