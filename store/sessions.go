package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Session is a stored session.
type Session struct {
	ID           string
	TenantID     string
	Deployment   string
	EndUser      string
	TaskID       string
	GroupID      string
	GroupSize    int
	IdentityMode string
	Status       string
	OptOut       bool
	// EndUserOptOut is the end user's consent record, nil when none.
	EndUserOptOut  *bool
	TrainByDefault bool
	Metadata       json.RawMessage
	CreatedAt      time.Time
	LastActiveAt   time.Time
	EndedAt        *time.Time
}

// NewSession is an explicitly created session.
type NewSession struct {
	ID, TenantID, Deployment, EndUser, TaskID, GroupID string
	GroupSize                                          int
	IdentityMode                                       string
	OptOut                                             bool
	Metadata                                           json.RawMessage
}

// CreateSession inserts a session.
func CreateSession(ctx context.Context, db DBTX, s NewSession) error {
	if s.GroupSize < 1 {
		s.GroupSize = 1
	}
	if len(s.Metadata) == 0 {
		s.Metadata = json.RawMessage(`{}`)
	}
	_, err := db.Exec(ctx, `INSERT INTO sessions (id, tenant_id, deployment, end_user, task_id, group_id,
		group_size, identity_mode, opt_out, metadata) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)`,
		s.ID, s.TenantID, s.Deployment, s.EndUser, s.TaskID, s.GroupID, s.GroupSize, s.IdentityMode, s.OptOut, s.Metadata)
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

// GetSession reads the tenant's session, ErrNotFound for another tenant's.
func GetSession(ctx context.Context, db DBTX, tenantID, id string) (*Session, error) {
	var s Session
	err := db.QueryRow(ctx, `SELECT s.id, s.tenant_id, s.deployment, s.end_user, s.task_id, s.group_id,
		s.group_size, s.identity_mode, s.status, s.opt_out, c.opt_out, t.train_by_default, s.metadata,
		s.created_at, s.last_active_at, s.ended_at
		FROM sessions s JOIN tenants t ON t.id = s.tenant_id
		LEFT JOIN end_user_consent c ON c.tenant_id = s.tenant_id AND c.end_user = s.end_user AND s.end_user <> ''
		WHERE s.tenant_id = $1 AND s.id = $2`, tenantID, id).Scan(&s.ID, &s.TenantID, &s.Deployment, &s.EndUser,
		&s.TaskID, &s.GroupID, &s.GroupSize, &s.IdentityMode, &s.Status, &s.OptOut, &s.EndUserOptOut,
		&s.TrainByDefault, &s.Metadata, &s.CreatedAt, &s.LastActiveAt, &s.EndedAt)
	if err != nil {
		return nil, notFound(err)
	}
	return &s, nil
}

// SessionStatus is the state of the tenant's session, for the request
// path; ErrNotFound when the tenant has no session of that id.
func SessionStatus(ctx context.Context, db DBTX, tenantID, id string) (string, error) {
	var status string
	err := db.QueryRow(ctx, `SELECT status FROM sessions WHERE tenant_id = $1 AND id = $2`, tenantID, id).Scan(&status)
	return status, notFound(err)
}

// EndSession marks the tenant's open session ended; it reports whether it
// was open (ending twice is not an error).
func EndSession(ctx context.Context, db DBTX, tenantID, id string) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE sessions SET status = 'ended', ended_at = now()
		WHERE tenant_id = $1 AND id = $2 AND status = 'open'`, tenantID, id)
	if err != nil {
		return false, fmt.Errorf("end session: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, nil
	}
	if _, err := GetSession(ctx, db, tenantID, id); err != nil {
		return false, err
	}
	return false, nil
}

// SetSessionOptOut records a session's consent decision.
func SetSessionOptOut(ctx context.Context, db DBTX, tenantID, id string, optOut bool) error {
	tag, err := db.Exec(ctx, `UPDATE sessions SET opt_out = $3 WHERE tenant_id = $1 AND id = $2`, tenantID, id, optOut)
	if err != nil {
		return fmt.Errorf("set session consent: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// SetEndUserConsent records an end user's consent decision.
func SetEndUserConsent(ctx context.Context, db DBTX, tenantID, endUser string, optOut bool) error {
	_, err := db.Exec(ctx, `INSERT INTO end_user_consent (tenant_id, end_user, opt_out) VALUES ($1, $2, $3)
		ON CONFLICT (tenant_id, end_user) DO UPDATE SET opt_out = EXCLUDED.opt_out, updated_at = now()`,
		tenantID, endUser, optOut)
	if err != nil {
		return fmt.Errorf("set end user consent: %w", err)
	}
	return nil
}

// Backlog is what the control plane has yet to absorb from a tenant.
type Backlog struct {
	// SessionsAwaitingAssembly ended in the last BacklogWindow and have not
	// been assembled into trajectories yet; OldestSeconds is how long the
	// oldest of them has waited.
	SessionsAwaitingAssembly int     `json:"sessions_awaiting_assembly"`
	OldestSeconds            float64 `json:"oldest_awaiting_seconds"`
	WindowSeconds            float64 `json:"window_seconds"`
}

// BacklogWindow bounds the sessions Backlog counts, so a session whose
// workflow was lost does not count for ever.
const BacklogWindow = 15 * time.Minute

// TenantBacklog counts the tenant's recently ended sessions that are not
// assembled yet (a partial index holds exactly those).
func TenantBacklog(ctx context.Context, db DBTX, tenantID string) (Backlog, error) {
	b := Backlog{WindowSeconds: BacklogWindow.Seconds()}
	err := db.QueryRow(ctx, `
SELECT count(*), COALESCE(extract(epoch FROM now() - min(ended_at)), 0)
FROM sessions WHERE tenant_id = $1 AND status = 'ended' AND assembled_at IS NULL AND ended_at > now() - make_interval(secs => $2)`,
		tenantID, BacklogWindow.Seconds()).Scan(&b.SessionsAwaitingAssembly, &b.OldestSeconds)
	if err != nil {
		return b, fmt.Errorf("backlog of %s: %w", tenantID, err)
	}
	return b, nil
}

// MarkNotified records that a notice for each of the sessions (tenant and
// id, pairwise) reached Temporal, so the reconciler leaves them alone.
func MarkNotified(ctx context.Context, db DBTX, tenants, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `UPDATE sessions s SET notified_at = now()
FROM unnest($1::text[], $2::text[]) AS k(tenant_id, id)
WHERE s.tenant_id = k.tenant_id AND s.id = k.id AND s.notified_at IS NULL`, tenants, ids)
	if err != nil {
		return fmt.Errorf("mark %d sessions notified: %w", len(ids), err)
	}
	return nil
}

// Unnotified lists, oldest first, up to limit sessions created more than
// age ago whose notice never reached Temporal (the gateway died with it
// in memory, or Temporal was down): their workflows must still start.
func Unnotified(ctx context.Context, db DBTX, age time.Duration, limit int) ([]SessionInfo, error) {
	rows, err := db.Query(ctx, `SELECT id, tenant_id, deployment, task_id, group_id, group_size, status FROM sessions
WHERE notified_at IS NULL AND created_at < now() - make_interval(secs => $1) AND status <> 'forgotten'
ORDER BY created_at LIMIT $2`, age.Seconds(), limit)
	if err != nil {
		return nil, fmt.Errorf("unnotified sessions: %w", err)
	}
	defer rows.Close()
	var out []SessionInfo
	for rows.Next() {
		var s SessionInfo
		if err := rows.Scan(&s.ID, &s.TenantID, &s.Deployment, &s.TaskID, &s.GroupID, &s.GroupSize, &s.Status); err != nil {
			return nil, fmt.Errorf("unnotified sessions: %w", err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
