package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ForgetResult is a completed forget request.
type ForgetResult struct {
	ID       int64
	Scope    string
	Subject  string
	Sessions []string
	// AffectedVersions are model versions whose training used the data
	// (from lineage): they are recorded so they can be retired.
	AffectedVersions []string
	Deleted          map[string]int64
}

// Forget deletes a tenant's session (scope "session") or every session of
// an end user (scope "end_user"): interactions, rewards, trajectories,
// steps and queued samples go; the session rows stay, emptied and marked
// forgotten, and a forget_requests row records what was done and which
// model versions trained on the data. ErrNotFound when nothing matches.
func Forget(ctx context.Context, db Beginner, tenantID, scope, subject string) (*ForgetResult, error) {
	res := &ForgetResult{Scope: scope, Subject: subject, Deleted: map[string]int64{}}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var q string
		switch scope {
		case "session":
			q = `SELECT id FROM sessions WHERE tenant_id = $1 AND id = $2 AND status <> 'forgotten' FOR UPDATE`
		case "end_user":
			q = `SELECT id FROM sessions WHERE tenant_id = $1 AND end_user = $2 AND status <> 'forgotten' FOR UPDATE`
		default:
			return fmt.Errorf("forget: unknown scope %q", scope)
		}
		rows, err := tx.Query(ctx, q, tenantID, subject)
		if err != nil {
			return fmt.Errorf("forget: find sessions: %w", err)
		}
		res.Sessions, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("forget: find sessions: %w", err)
		}
		if len(res.Sessions) == 0 {
			return ErrNotFound
		}
		rows, err = tx.Query(ctx, `SELECT DISTINCT version_id FROM model_version_lineage
			WHERE tenant_id = $1 AND session_id = ANY($2) ORDER BY version_id`, tenantID, res.Sessions)
		if err != nil {
			return fmt.Errorf("forget: lineage: %w", err)
		}
		res.AffectedVersions, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("forget: lineage: %w", err)
		}
		// Children first, so each count is what this request removed.
		for _, t := range []string{"training_samples", "atdp_steps", "trajectories", "rewards", "interactions"} {
			var tag string
			switch t {
			case "training_samples":
				tag = `DELETE FROM training_samples WHERE tenant_id = $1 AND step_id IN
					(SELECT id FROM atdp_steps WHERE tenant_id = $1 AND session_id = ANY($2))`
			default:
				tag = `DELETE FROM ` + t + ` WHERE tenant_id = $1 AND session_id = ANY($2)`
			}
			ct, err := tx.Exec(ctx, tag, tenantID, res.Sessions)
			if err != nil {
				return fmt.Errorf("forget: delete %s: %w", t, err)
			}
			res.Deleted[t] = ct.RowsAffected()
		}
		if _, err := tx.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND session_id = ANY($2) AND revoked_at IS NULL`,
			tenantID, res.Sessions); err != nil {
			return fmt.Errorf("forget: revoke session keys: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE sessions SET status = 'forgotten', end_user = '', metadata = '{}',
			ended_at = coalesce(ended_at, now()) WHERE tenant_id = $1 AND id = ANY($2)`, tenantID, res.Sessions); err != nil {
			return fmt.Errorf("forget: mark sessions: %w", err)
		}
		deleted, _ := json.Marshal(map[string]any{"sessions": res.Sessions, "rows": res.Deleted})
		// The record must not keep the identifier it was asked to forget.
		recorded := subject
		if scope == "end_user" {
			sum := sha256.Sum256([]byte(tenantID + "\x00" + subject))
			recorded = "sha256:" + hex.EncodeToString(sum[:])
		}
		return tx.QueryRow(ctx, `INSERT INTO forget_requests (tenant_id, scope, subject, status, affected_versions, deleted, completed_at)
			VALUES ($1, $2, $3, 'done', $4, $5, now()) RETURNING id`, tenantID, scope, recorded, res.AffectedVersions, deleted).Scan(&res.ID)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}
