package store

import (
	"context"
	"fmt"
)

// NewReward is a reward to record; InteractionID 0 rewards the session.
type NewReward struct {
	TenantID, SessionID string
	InteractionID       int64
	Value               float64
	Source              string
	Final               bool
	// Feedback is the text that explains the reward (a grader's reason,
	// a user's complaint), at most MaxFeedback bytes; the reflector reads
	// it.
	Feedback string
}

// MaxFeedback bounds a reward's feedback text.
const MaxFeedback = 4000

// InsertReward records a reward after checking that the session (and the
// step, when given) belong to the tenant; ErrNotFound otherwise.
func InsertReward(ctx context.Context, db DBTX, r NewReward) (int64, error) {
	var iid *int64
	if r.InteractionID != 0 {
		iid = &r.InteractionID
	}
	var id int64
	err := db.QueryRow(ctx, `INSERT INTO rewards (tenant_id, session_id, interaction_id, value, source, final, feedback)
		SELECT s.tenant_id, s.id, $3, $4, $5, $6, $7 FROM sessions s
		WHERE s.tenant_id = $1 AND s.id = $2 AND s.status <> 'forgotten'
		AND ($3::bigint IS NULL OR EXISTS (SELECT 1 FROM interactions i
			WHERE i.id = $3 AND i.tenant_id = $1 AND i.session_id = $2))
		RETURNING id`, r.TenantID, r.SessionID, iid, r.Value, r.Source, r.Final, r.Feedback).Scan(&id)
	if err != nil {
		return 0, notFound(err)
	}
	return id, nil
}

// StepStatus is the assembled ATDP view of an interaction, when the
// session workflow has assembled it, with what the training queue wrote
// back (stale_version, arrived_after_training).
type StepStatus struct {
	InteractionID    int64
	Eligible         bool
	IneligibleReason string
	Redactions       int
	// TrainedInto is the model versions the interaction's sample trained
	// (empty when it has not trained).
	TrainedInto []string
}

// AssembledSteps returns the latest assembled status of each of a
// session's interactions, keyed by interaction id.
func AssembledSteps(ctx context.Context, db DBTX, tenantID, sessionID string) (map[int64]StepStatus, error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT ON (a.interaction_id) a.interaction_id, a.eligible, a.ineligible_reason,
		jsonb_array_length(a.redactions),
		ARRAY(SELECT DISTINCT l.version_id FROM atdp_steps s2 JOIN training_samples ts ON ts.step_id = s2.id
		      JOIN model_version_lineage l ON l.sample_id = ts.id
		      WHERE s2.interaction_id = a.interaction_id ORDER BY l.version_id)
		FROM atdp_steps a WHERE a.tenant_id = $1 AND a.session_id = $2
		ORDER BY a.interaction_id, a.id DESC`, tenantID, sessionID)
	if err != nil {
		return nil, fmt.Errorf("list assembled steps: %w", err)
	}
	defer rows.Close()
	out := map[int64]StepStatus{}
	for rows.Next() {
		var s StepStatus
		if err := rows.Scan(&s.InteractionID, &s.Eligible, &s.IneligibleReason, &s.Redactions, &s.TrainedInto); err != nil {
			return nil, fmt.Errorf("scan assembled step: %w", err)
		}
		out[s.InteractionID] = s
	}
	return out, rows.Err()
}
