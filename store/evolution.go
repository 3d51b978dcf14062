package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// WindowStats summarises a deployment's sessions active in [from, to).
type WindowStats struct {
	Sessions         int
	RewardedSessions int
	// MeanReward is the mean session outcome: a session's outcome rewards'
	// mean, else its step rewards' mean.
	MeanReward     float64
	Corrected      int
	SafetyFlagged  int
	Tenants        int
	FailingTenants int
	// EvaluatorMean is the mean reward from source "evaluator".
	EvaluatorMean float64
	// TokensPerSession is prompt + completion tokens per session.
	TokensPerSession float64
}

// SessionWindow computes WindowStats.
func SessionWindow(ctx context.Context, db DBTX, deployment string, from, to time.Time) (WindowStats, error) {
	var w WindowStats
	err := db.QueryRow(ctx, `
WITH sess AS (
    SELECT i.session_id, i.tenant_id, sum(i.prompt_tokens + i.completion_tokens) AS tokens
    FROM interactions i
    WHERE i.deployment = $1 AND i.created_at >= $2 AND i.created_at < $3 AND `+consentedSQL+`
    GROUP BY i.session_id, i.tenant_id
), scored AS (
    SELECT s.session_id, s.tenant_id, s.tokens, `+outcomeSQL+` AS outcome,
        EXISTS (SELECT 1 FROM rewards r WHERE r.tenant_id = s.tenant_id AND r.session_id = s.session_id AND (r.value < 0 OR r.source = 'correction')) AS corrected,
        EXISTS (SELECT 1 FROM rewards r WHERE r.tenant_id = s.tenant_id AND r.session_id = s.session_id AND r.source = 'safety' AND r.value < 0) AS flagged
    FROM sess s
)
SELECT count(*), count(outcome), COALESCE(avg(outcome), 0),
       count(*) FILTER (WHERE corrected), count(*) FILTER (WHERE flagged),
       count(DISTINCT tenant_id), count(DISTINCT tenant_id) FILTER (WHERE outcome < 0),
       COALESCE((SELECT avg(r.value) FROM rewards r JOIN sess USING (tenant_id, session_id) WHERE r.source = 'evaluator'), 0),
       COALESCE(avg(tokens), 0)
FROM scored`, deployment, from, to).Scan(&w.Sessions, &w.RewardedSessions, &w.MeanReward, &w.Corrected, &w.SafetyFlagged,
		&w.Tenants, &w.FailingTenants, &w.EvaluatorMean, &w.TokensPerSession)
	if err != nil {
		return w, fmt.Errorf("session window of %s: %w", deployment, err)
	}
	return w, nil
}

// ToolStats is one tenant's calls and failures of one tool in a window.
type ToolStats struct {
	Tenant   string
	Tool     string
	Calls    int
	Failures int
	// Example is the failure message seen most often, and Sessions the
	// sessions where it was seen.
	Example  string
	Sessions []string
}

// toolFailedSQL follows a tool result's text: it reports an error.
const toolFailedSQL = `~* '^\s*(error|exception|traceback|failed)|"error"'`

// ToolFailures counts, per tenant and tool, the tool results in a
// deployment's consented requests in [from, to) and how many of them
// report an error. A result is matched to its tool by tool_call_id; each
// call counts once per session although later turns repeat it.
func ToolFailures(ctx context.Context, db DBTX, deployment string, from, to time.Time) ([]ToolStats, error) {
	rows, err := db.Query(ctx, `
WITH msgs AS (
    SELECT i.tenant_id, i.session_id, m FROM interactions i, jsonb_array_elements(i.request->'messages') m
    WHERE i.deployment = $1 AND i.created_at >= $2 AND i.created_at < $3 AND jsonb_typeof(i.request->'messages') = 'array'
      AND `+consentedSQL+`
), calls AS (
    SELECT DISTINCT tenant_id, session_id, tc->>'id' AS call_id, COALESCE(tc->>'name', tc->'function'->>'name') AS tool
    FROM msgs, jsonb_array_elements(CASE WHEN jsonb_typeof(m->'tool_calls') = 'array' THEN m->'tool_calls' ELSE '[]'::jsonb END) tc
    WHERE m->>'role' = 'assistant'
), results AS (
    SELECT DISTINCT ON (tenant_id, session_id, m->>'tool_call_id') tenant_id, session_id, m->>'tool_call_id' AS call_id, left(m->>'content', 200) AS content
    FROM msgs WHERE m->>'role' = 'tool'
), joined AS (
    SELECT c.tenant_id, c.session_id, c.tool, r.content, r.content `+toolFailedSQL+` AS failed
    FROM results r JOIN calls c USING (tenant_id, session_id, call_id)
), example AS (
    SELECT DISTINCT ON (tenant_id, tool) tenant_id, tool, content
    FROM (SELECT tenant_id, tool, content, count(*) AS n FROM joined WHERE failed GROUP BY 1, 2, 3) x
    ORDER BY tenant_id, tool, n DESC, content
)
SELECT j.tenant_id, j.tool, count(*), count(*) FILTER (WHERE j.failed), COALESCE(e.content, ''),
       COALESCE(array_agg(DISTINCT j.session_id) FILTER (WHERE j.failed AND j.content = e.content), '{}')
FROM joined j LEFT JOIN example e USING (tenant_id, tool)
WHERE j.tool IS NOT NULL GROUP BY j.tenant_id, j.tool, e.content
ORDER BY count(*) FILTER (WHERE j.failed) DESC, j.tenant_id, j.tool`, deployment, from, to)
	if err != nil {
		return nil, fmt.Errorf("tool failures of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ToolStats, error) {
		var s ToolStats
		err := r.Scan(&s.Tenant, &s.Tool, &s.Calls, &s.Failures, &s.Example, &s.Sessions)
		return s, err
	})
}

// UserPrompts returns the last user message of up to limit requests of a
// deployment in [from, to) that brought one, newest first. A request
// stored as the suffix of its session's previous turn (migration 00021)
// holds only its new messages, so a user message counts once, in the turn
// the user sent it, not again in every later turn that repeats it.
func UserPrompts(ctx context.Context, db DBTX, deployment string, from, to time.Time, limit int) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT u.content
FROM interactions i
CROSS JOIN LATERAL (SELECT m->>'content' AS content FROM jsonb_array_elements(i.request->'messages') WITH ORDINALITY AS x(m, n)
                    WHERE m->>'role' = 'user' ORDER BY n DESC LIMIT 1) u
WHERE i.deployment = $1 AND i.created_at >= $2 AND i.created_at < $3 AND jsonb_typeof(i.request->'messages') = 'array'
  AND `+consentedSQL+`
ORDER BY i.created_at DESC LIMIT $4`, deployment, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("user prompts of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// consentedSQL holds for an interaction i whose session may be used: the
// rule SessionForAssembly applies (the session's opt-out wins, then the end
// user's, then the tenant default). Evidence that feeds an artefact (a
// playbook lesson, a tool description, a harness) quotes user text, so it
// takes only consented sessions, as training does.
const consentedSQL = `EXISTS (SELECT 1 FROM sessions cs JOIN tenants ct ON ct.id = cs.tenant_id
  LEFT JOIN end_user_consent cc ON cc.tenant_id = cs.tenant_id AND cc.end_user = cs.end_user AND cs.end_user <> ''
  WHERE cs.id = i.session_id AND cs.tenant_id = i.tenant_id AND NOT cs.opt_out AND coalesce(NOT cc.opt_out, ct.train_by_default))`

// LastPromotion is the promoted weights release of the serving version.
func LastPromotion(ctx context.Context, db DBTX, deployment, serving string) (previous string, at time.Time, err error) {
	err = db.QueryRow(ctx, `
SELECT baseline, finished_at FROM releases
WHERE deployment = $1 AND layer = 'weights' AND status = 'promoted' AND candidate = $2
ORDER BY finished_at DESC LIMIT 1`, deployment, serving).Scan(&previous, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("last promotion of %s: %w", serving, err)
	}
	return previous, at, nil
}

// DecisionRow is a recorded evolution decision.
type DecisionRow struct {
	ID         int64
	Deployment string
	Decision   string
	Evidence   json.RawMessage
	Reason     string
	WorkflowID string
	CreatedAt  time.Time
	// Tenant is whose change it was ("": the deployment's).
	Tenant string
	// Expected says what the decision expects its change to do.
	Expected string
	// ReleaseStatus is how the release it started ended ("": none yet),
	// PromotedAt when it was promoted, and Outcome what it did to reward.
	ReleaseStatus string
	PromotedAt    *time.Time
	Outcome       *DecisionOutcome
}

// DecisionOutcome is what a promoted change did to reward.
type DecisionOutcome = statusapi.DecisionOutcome

const decisionCols = `id, deployment, decision, evidence, reason, workflow_id, created_at, tenant_id, expected, release_status, promoted_at, outcome`

func scanDecision(r pgx.Row) (DecisionRow, error) {
	var d DecisionRow
	err := r.Scan(&d.ID, &d.Deployment, &d.Decision, &d.Evidence, &d.Reason, &d.WorkflowID, &d.CreatedAt,
		&d.Tenant, &d.Expected, &d.ReleaseStatus, &d.PromotedAt, &d.Outcome)
	return d, err
}

// RecordDecision stores a decision with its evidence; the workflow id makes
// a retried call return the first row.
func RecordDecision(ctx context.Context, db DBTX, d DecisionRow) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `
INSERT INTO evolution_decisions (deployment, decision, evidence, reason, workflow_id, tenant_id, expected) VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (workflow_id) WHERE workflow_id <> '' DO UPDATE SET workflow_id = EXCLUDED.workflow_id
RETURNING id`, d.Deployment, d.Decision, d.Evidence, d.Reason, d.WorkflowID, d.Tenant, d.Expected).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record %s decision for %s: %w", d.Decision, d.Deployment, err)
	}
	return id, nil
}

// LastDecision is the deployment's latest decision before t, if any.
func LastDecision(ctx context.Context, db DBTX, deployment string, before time.Time) (DecisionRow, error) {
	d, err := scanDecision(db.QueryRow(ctx, `
SELECT `+decisionCols+` FROM evolution_decisions
WHERE deployment = $1 AND created_at < $2 AND decision <> 'noop' ORDER BY created_at DESC, id DESC LIMIT 1`, deployment, before))
	if err != nil {
		return DecisionRow{}, notFound(err)
	}
	return d, nil
}

// ListDecisions lists a deployment's decisions, newest first.
func ListDecisions(ctx context.Context, db DBTX, deployment string, limit int) ([]DecisionRow, error) {
	rows, err := db.Query(ctx, `
SELECT `+decisionCols+` FROM evolution_decisions
WHERE deployment = $1 ORDER BY created_at DESC, id DESC LIMIT $2`, deployment, limit)
	if err != nil {
		return nil, fmt.Errorf("list decisions of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (DecisionRow, error) { return scanDecision(r) })
}

// SetDecisionRelease records how the release a decision started ended,
// and when it was promoted.
func SetDecisionRelease(ctx context.Context, db DBTX, id int64, status string, at time.Time) error {
	_, err := db.Exec(ctx, `UPDATE evolution_decisions SET release_status = $2,
		promoted_at = CASE WHEN $2 = 'promoted' THEN coalesce(promoted_at, $3) END WHERE id = $1`, id, status, at)
	if err != nil {
		return fmt.Errorf("record the release of decision %d: %w", id, err)
	}
	return nil
}

// ReviewDecisions measures, for the deployment's promoted decisions whose
// outcome is not yet known and whose promotion is at least window old,
// what the change did: the mean reward of the scope's rewarded sessions
// in the window before the decision and in the window after the
// promotion. It returns how many it measured.
func ReviewDecisions(ctx context.Context, db DBTX, deployment string, window time.Duration, now time.Time) (int, error) {
	tag, err := db.Exec(ctx, `
WITH due AS (
    SELECT id, tenant_id, created_at, promoted_at FROM evolution_decisions
    WHERE deployment = $1 AND promoted_at IS NOT NULL AND outcome IS NULL AND promoted_at + $2::interval <= $3
), sides AS (
    SELECT d.id, s.after, `+outcomeSQL+` AS outcome
    FROM due d
    CROSS JOIN LATERAL (
        SELECT DISTINCT i.tenant_id, i.session_id, i.created_at >= d.promoted_at AS after FROM interactions i
        WHERE i.deployment = $1 AND (d.tenant_id = '' OR i.tenant_id = d.tenant_id)
          AND ((i.created_at >= d.created_at - $2::interval AND i.created_at < d.created_at)
            OR (i.created_at >= d.promoted_at AND i.created_at < d.promoted_at + $2::interval))) s
), measured AS (
    SELECT d.id,
        jsonb_build_object(
            'before', coalesce(avg(x.outcome) FILTER (WHERE NOT x.after), 0),
            'after', coalesce(avg(x.outcome) FILTER (WHERE x.after), 0),
            'rewarded_before', count(x.outcome) FILTER (WHERE NOT x.after),
            'rewarded_after', count(x.outcome) FILTER (WHERE x.after),
            'measured_at', $3::timestamptz) AS outcome
    FROM due d LEFT JOIN sides x ON x.id = d.id GROUP BY d.id
)
UPDATE evolution_decisions e SET outcome = m.outcome FROM measured m WHERE e.id = m.id`,
		deployment, window.String(), now)
	if err != nil {
		return 0, fmt.Errorf("review decisions of %s: %w", deployment, err)
	}
	return int(tag.RowsAffected()), nil
}

// ActiveDeployments lists the deployments with consented interactions in
// [from, to), by name.
func ActiveDeployments(ctx context.Context, db DBTX, from, to time.Time) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT DISTINCT i.deployment FROM interactions i
WHERE i.created_at >= $1 AND i.created_at < $2 AND `+consentedSQL+` ORDER BY 1`, from, to)
	if err != nil {
		return nil, fmt.Errorf("active deployments: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// TenantOutcome is one tenant's sessions of a deployment in a window.
type TenantOutcome struct {
	Tenant   string  `json:"tenant"`
	Sessions int     `json:"sessions"`
	Rewarded int     `json:"rewarded"`
	Failed   int     `json:"failed"`
	Mean     float64 `json:"mean_reward"`
}

// TenantOutcomes summarises each tenant's consented sessions of a
// deployment active in [from, to), worst mean reward first.
func TenantOutcomes(ctx context.Context, db DBTX, deployment string, from, to time.Time) ([]TenantOutcome, error) {
	rows, err := db.Query(ctx, `
WITH s AS (
    SELECT DISTINCT i.tenant_id, i.session_id FROM interactions i
    WHERE i.deployment = $1 AND i.created_at >= $2 AND i.created_at < $3 AND `+consentedSQL+`
), o AS (SELECT s.tenant_id, `+outcomeSQL+` AS outcome FROM s)
SELECT tenant_id, count(*), count(outcome), count(*) FILTER (WHERE outcome < 0), coalesce(avg(outcome), 0)
FROM o GROUP BY tenant_id ORDER BY coalesce(avg(outcome), 0), tenant_id`, deployment, from, to)
	if err != nil {
		return nil, fmt.Errorf("tenant outcomes of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TenantOutcome, error) {
		var t TenantOutcome
		err := r.Scan(&t.Tenant, &t.Sessions, &t.Rewarded, &t.Failed, &t.Mean)
		return t, err
	})
}

// SessionsSince counts a deployment's sessions with interactions after t.
func SessionsSince(ctx context.Context, db DBTX, deployment string, t time.Time) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(DISTINCT (tenant_id, session_id)) FROM interactions WHERE deployment = $1 AND created_at > $2`, deployment, t).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sessions of %s since %s: %w", deployment, t.Format(time.RFC3339), err)
	}
	return n, nil
}

// ErrCannotServe is returned for a rollback to a retired or rolled-back
// version.
var ErrCannotServe = errors.New("version cannot serve")

// RollbackTo makes version serve the deployment again: the serving version
// is marked rolled_back with reason, and a releases row records the
// change. Rolling back to the version that already serves is a no-op.
func RollbackTo(ctx context.Context, db Beginner, deployment, version, reason string) (from string, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var cur *string
		if err := tx.QueryRow(ctx, `SELECT serving_version FROM deployments WHERE name = $1 FOR UPDATE`, deployment).Scan(&cur); err != nil {
			return fmt.Errorf("read deployment: %w", notFound(err))
		}
		if cur != nil {
			from = *cur
		}
		if from == version {
			return nil
		}
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM model_versions WHERE id = $1 AND deployment = $2`, version, deployment).Scan(&status); err != nil {
			return fmt.Errorf("target version %s: %w", version, notFound(err))
		}
		if status == "retired" || status == "rolled_back" {
			return fmt.Errorf("target version %s is %s: %w", version, status, ErrCannotServe)
		}
		if from != "" {
			if _, err := tx.Exec(ctx, `UPDATE model_versions SET status = 'rolled_back', retired_reason = $2 WHERE id = $1 AND status <> 'retired'`, from, reason); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE model_versions SET status = 'serving' WHERE id = $1`, version); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE deployments SET serving_version = $2, updated_at = now() WHERE name = $1`, deployment, version); err != nil {
			return err
		}
		// A running weights release of the bad version stops routing too.
		if _, err := tx.Exec(ctx, `UPDATE releases SET status = 'aborted', reason = 'superseded by rollback: ' || $2, phase = 'done', canary_share = 0, finished_at = now()
WHERE deployment = $1 AND layer = 'weights' AND status = 'running'`, deployment, reason); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO releases (deployment, layer, candidate, baseline, status, reason, phase, finished_at)
VALUES ($1, 'weights', $2, $3, 'rolled_back', $4, 'done', now())`, deployment, from, version, reason)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("roll %s back to %s: %w", deployment, version, err)
	}
	return from, nil
}
