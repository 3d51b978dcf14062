package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// Why a session did or did not train, beyond the ATDP ineligibility
// reasons (no_reward, redacted, …) its steps carry.
const (
	TrainingTrained      = "trained"
	TrainingQueued       = "queued"
	TrainingNotAssembled = "not_assembled"
	TrainingSessionOpen  = "session_open"
	TrainingDroppedStale = "dropped_stale"
	TrainingRetired      = "retired"
	TrainingForgotten    = "forgotten"
	TrainingNoSamples    = "no_trainable_steps"
)

// sessionsOf lists the tenant's latest sessions on the deployment with
// whether they trained and, if not, why.
func sessionsOf(ctx context.Context, db DBTX, q StatusQuery, deployment string) ([]statusapi.SessionSummary, error) {
	rows, err := db.Query(ctx, `
SELECT s.id, s.status, s.task_id, s.created_at, s.last_active_at,
       st.steps, coalesce(st.version, ''), rw.outcome,
       coalesce(ln.versions, '{}'), smp.queued, smp.stale, smp.retired, tj.id IS NOT NULL, coalesce(why.reason, '')
FROM (
    -- The latest sessions first, so the per-session lookups run only for
    -- the rows shown.
    SELECT * FROM sessions WHERE tenant_id = $1 AND deployment = $2
    ORDER BY last_active_at DESC, id LIMIT $3) s
CROSS JOIN LATERAL (
    SELECT count(*) AS steps, (array_agg(i.model_version ORDER BY i.seq DESC))[1] AS version
    FROM interactions i WHERE i.tenant_id = s.tenant_id AND i.session_id = s.id) st
CROSS JOIN LATERAL (
    SELECT coalesce(avg(r.value) FILTER (WHERE r.interaction_id IS NULL), avg(r.value)) AS outcome
    FROM rewards r WHERE r.tenant_id = s.tenant_id AND r.session_id = s.id) rw
CROSS JOIN LATERAL (
    SELECT array_agg(DISTINCT l.version_id ORDER BY l.version_id) AS versions
    FROM model_version_lineage l WHERE l.tenant_id = s.tenant_id AND l.session_id = s.id) ln
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE ts.status = 'queued') AS queued,
           count(*) FILTER (WHERE ts.status = 'dropped_stale') AS stale,
           count(*) FILTER (WHERE ts.status = 'retired') AS retired
    FROM atdp_steps a JOIN training_samples ts ON ts.step_id = a.id
    WHERE a.tenant_id = s.tenant_id AND a.session_id = s.id) smp
LEFT JOIN LATERAL (
    SELECT t.id FROM trajectories t WHERE t.tenant_id = s.tenant_id AND t.session_id = s.id
    ORDER BY t.assembled_at DESC, t.id DESC LIMIT 1) tj ON true
LEFT JOIN LATERAL (
    SELECT a.ineligible_reason AS reason FROM atdp_steps a
    WHERE a.trajectory_id = tj.id AND NOT a.eligible AND a.ineligible_reason <> ''
    GROUP BY a.ineligible_reason ORDER BY count(*) DESC, a.ineligible_reason LIMIT 1) why ON true
ORDER BY s.last_active_at DESC, s.id`, q.TenantID, deployment, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusapi.SessionSummary, error) {
		var s statusapi.SessionSummary
		var queued, stale, retired int
		var assembled bool
		var ineligible string
		err := r.Scan(&s.ID, &s.Status, &s.TaskID, &s.CreatedAt, &s.LastActiveAt, &s.Steps, &s.Version, &s.Reward,
			&s.TrainedInto, &queued, &stale, &retired, &assembled, &ineligible)
		s.Trained = len(s.TrainedInto) > 0
		s.Reason = trainingReason(s, queued, stale, retired, assembled, ineligible)
		return s, err
	})
}

// trainingReason says why a session did not train, most decisive first.
func trainingReason(s statusapi.SessionSummary, queued, stale, retired int, assembled bool, ineligible string) string {
	switch {
	case s.Trained:
		return TrainingTrained
	case s.Status == "forgotten":
		return TrainingForgotten
	case queued > 0:
		return TrainingQueued
	case !assembled && s.Status == "open":
		return TrainingSessionOpen
	case !assembled:
		return TrainingNotAssembled
	case stale > 0:
		return TrainingDroppedStale
	case retired > 0:
		return TrainingRetired
	case ineligible != "":
		return ineligible
	}
	return TrainingNoSamples
}
