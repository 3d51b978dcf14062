package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/artefact"
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
	// CleanArtefacts are the artefact versions released without what the
	// sessions taught ("deployment/kind:version").
	CleanArtefacts []string
	Deleted        map[string]int64
}

// Forget deletes a tenant's session (scope "session") or every session of
// an end user (scope "end_user"): interactions, stored Responses API
// responses, rewards, trajectories, steps and queued samples go; the
// session rows stay, emptied and marked forgotten, and a forget_requests
// row records what was done and which model versions trained on the data. What the sessions taught playbooks
// and tool schemas is removed from every version, and a clean version of
// each serving one serves. ErrNotFound when nothing matches.
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
		for _, t := range []string{"training_samples", "atdp_steps", "trajectories", "rewards", "responses", "interactions"} {
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
		if res.CleanArtefacts, err = forgetArtefacts(ctx, tx, tenantID, res.Sessions); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE tenant_id = $1 AND session_id = ANY($2) AND revoked_at IS NULL`,
			tenantID, res.Sessions); err != nil {
			return fmt.Errorf("forget: revoke session keys: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE sessions SET status = 'forgotten', end_user = '', metadata = '{}',
			ended_at = coalesce(ended_at, now()) WHERE tenant_id = $1 AND id = ANY($2)`, tenantID, res.Sessions); err != nil {
			return fmt.Errorf("forget: mark sessions: %w", err)
		}
		deleted, _ := json.Marshal(map[string]any{"sessions": res.Sessions, "rows": res.Deleted, "clean_artefacts": res.CleanArtefacts})
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

// forgetArtefacts removes what the tenant's sessions taught from every
// playbook and tool-schema version that holds it (the lessons and
// overrides name the sessions they came from). Old versions are rewritten
// in place, so no rollback can bring the data back; a serving version is
// followed by a new clean version that serves, so the change shows as a
// release. It returns the new versions.
func forgetArtefacts(ctx context.Context, tx pgx.Tx, tenantID string, sessions []string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT id, deployment, kind, version, content, status FROM artefacts
		WHERE kind IN ('playbook', 'tool_schema') ORDER BY deployment, kind, version FOR UPDATE`)
	if err != nil {
		return nil, fmt.Errorf("forget: read artefacts: %w", err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StoredArtefact, error) {
		var a StoredArtefact
		err := r.Scan(&a.ID, &a.Deployment, &a.Kind, &a.Version, &a.Content, &a.Status)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("forget: read artefacts: %w", err)
	}
	var released []string
	for _, a := range all {
		var set artefact.Set
		if err := set.Decode(a.Kind, a.Content); err != nil {
			continue // unreadable content was never applied: nothing of the sessions reached a prompt
		}
		if len(set.Forget(tenantID, sessions)) == 0 {
			continue
		}
		var clean any = set.Playbook
		if a.Kind == artefact.LayerToolSchema {
			clean = set.ToolSchema
		}
		content, err := json.Marshal(clean)
		if err != nil {
			return nil, fmt.Errorf("forget: encode %s %d: %w", a.Kind, a.Version, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE artefacts SET content = $2 WHERE id = $1`, a.ID, content); err != nil {
			return nil, fmt.Errorf("forget: rewrite %s %d of %s: %w", a.Kind, a.Version, a.Deployment, err)
		}
		if a.Status != "serving" {
			continue
		}
		var version int
		if err := tx.QueryRow(ctx, `
INSERT INTO artefacts (deployment, kind, version, content, status, parent_id)
SELECT $1, $2, max(version) + 1, $3, 'serving', $4 FROM artefacts WHERE deployment = $1 AND kind = $2
RETURNING version`, a.Deployment, a.Kind, content, a.ID).Scan(&version); err != nil {
			return nil, fmt.Errorf("forget: release clean %s of %s: %w", a.Kind, a.Deployment, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE artefacts SET status = 'superseded' WHERE id = $1`, a.ID); err != nil {
			return nil, fmt.Errorf("forget: supersede %s %d of %s: %w", a.Kind, a.Version, a.Deployment, err)
		}
		released = append(released, fmt.Sprintf("%s/%s:%d", a.Deployment, a.Kind, version))
	}
	return released, nil
}
