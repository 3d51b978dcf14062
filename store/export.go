package store

import (
	"context"
	"fmt"
	"time"
)

// SessionFilter selects a tenant's sessions for export.
type SessionFilter struct {
	TenantID  string
	SessionID string
	EndUser   string
	Since     time.Time
	Until     time.Time
	// AfterID pages: sessions created after the session with this id's
	// position (created_at, id).
	Limit int
}

// ListSessions lists the tenant's sessions (not forgotten) oldest first.
func ListSessions(ctx context.Context, db DBTX, f SessionFilter) ([]SessionInfo, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	var since, until *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	if !f.Until.IsZero() {
		until = &f.Until
	}
	rows, err := db.Query(ctx, `
SELECT s.id, s.tenant_id, s.deployment, s.end_user, s.task_id, s.group_id, s.group_size, s.status,
       s.opt_out, t.train_by_default, c.opt_out
FROM sessions s
JOIN tenants t ON t.id = s.tenant_id
LEFT JOIN end_user_consent c ON c.tenant_id = s.tenant_id AND c.end_user = s.end_user AND s.end_user <> ''
WHERE s.tenant_id = $1 AND s.status <> 'forgotten'
  AND ($2 = '' OR s.id = $2) AND ($3 = '' OR s.end_user = $3)
  AND ($4::timestamptz IS NULL OR s.created_at >= $4) AND ($5::timestamptz IS NULL OR s.created_at < $5)
ORDER BY s.created_at, s.id
LIMIT $6`, f.TenantID, f.SessionID, f.EndUser, since, until, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer rows.Close()
	var out []SessionInfo
	for rows.Next() {
		var s SessionInfo
		var sessionOptOut, trainByDefault bool
		var userOptOut *bool
		if err := rows.Scan(&s.ID, &s.TenantID, &s.Deployment, &s.EndUser, &s.TaskID, &s.GroupID, &s.GroupSize,
			&s.Status, &sessionOptOut, &trainByDefault, &userOptOut); err != nil {
			return nil, fmt.Errorf("scan session: %w", err)
		}
		switch {
		case sessionOptOut:
			s.OptOut, s.ConsentBasis = true, "session"
		case userOptOut != nil:
			s.OptOut, s.ConsentBasis = *userOptOut, "end_user"
		default:
			s.OptOut, s.ConsentBasis = !trainByDefault, "tenant_default"
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
