package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Beginner starts transactions; *pgxpool.Pool and pgx.Tx implement it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// SessionInfo is what assembling a trajectory needs to know about a session.
type SessionInfo struct {
	ID, TenantID, Deployment, EndUser string
	TaskID, GroupID                   string
	GroupSize                         int
	Status                            string
	// OptOut is the effective data-use decision and ConsentBasis where it
	// came from: session, end_user or tenant_default.
	OptOut       bool
	ConsentBasis string
}

// SessionForAssembly loads a session with its effective consent: the
// session's own opt-out wins, then the end user's, then the tenant default.
func SessionForAssembly(ctx context.Context, db DBTX, tenantID, sessionID string) (SessionInfo, error) {
	var s SessionInfo
	var sessionOptOut, trainByDefault bool
	var userOptOut *bool
	err := db.QueryRow(ctx, `
SELECT s.id, s.tenant_id, s.deployment, s.end_user, s.task_id, s.group_id, s.group_size, s.status,
       s.opt_out, t.train_by_default, c.opt_out
FROM sessions s
JOIN tenants t ON t.id = s.tenant_id
LEFT JOIN end_user_consent c ON c.tenant_id = s.tenant_id AND c.end_user = s.end_user AND s.end_user <> ''
WHERE s.id = $1 AND s.tenant_id = $2`, sessionID, tenantID).Scan(
		&s.ID, &s.TenantID, &s.Deployment, &s.EndUser, &s.TaskID, &s.GroupID, &s.GroupSize, &s.Status,
		&sessionOptOut, &trainByDefault, &userOptOut)
	if err != nil {
		return SessionInfo{}, fmt.Errorf("load session %s: %w", sessionID, notFound(err))
	}
	switch {
	case sessionOptOut:
		s.OptOut, s.ConsentBasis = true, "session"
	case userOptOut != nil:
		s.OptOut, s.ConsentBasis = *userOptOut, "end_user"
	default:
		s.OptOut, s.ConsentBasis = !trainByDefault, "tenant_default"
	}
	return s, nil
}

// InteractionRow is one captured model call.
type InteractionRow struct {
	ID                              int64
	Seq                             int
	CompletionID, Deployment        string
	ModelVersion                    string
	Request, Response               []byte
	PromptTokenIDs                  []int32
	CompletionTokenIDs              []int32
	Logprobs                        []float32
	PromptTokens, CompletionTokens  int
	FinishReason, Status, ErrorText string
	LatencyMS                       float64
	CreatedAt                       time.Time
}

// SessionInteractions lists a session's interactions in order, each whole.
func SessionInteractions(ctx context.Context, db DBTX, tenantID, sessionID string) ([]InteractionRow, error) {
	rows, err := db.Query(ctx, `
SELECT id, seq, completion_id, deployment, model_version, request, response,
       prompt_token_ids, completion_token_ids, logprobs, prompt_tokens, completion_tokens,
       finish_reason, status, error, latency_ms, created_at, coalesce(prefix_id, 0), prefix_messages, prefix_tokens
FROM interactions WHERE tenant_id = $1 AND session_id = $2 ORDER BY seq`, tenantID, sessionID)
	if err != nil {
		return nil, fmt.Errorf("list interactions of %s: %w", sessionID, err)
	}
	var prefixes []Prefix
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (InteractionRow, error) {
		var i InteractionRow
		var p Prefix
		err := r.Scan(&i.ID, &i.Seq, &i.CompletionID, &i.Deployment, &i.ModelVersion, &i.Request, &i.Response,
			&i.PromptTokenIDs, &i.CompletionTokenIDs, &i.Logprobs, &i.PromptTokens, &i.CompletionTokens,
			&i.FinishReason, &i.Status, &i.ErrorText, &i.LatencyMS, &i.CreatedAt, &p.ID, &p.Messages, &p.Tokens)
		prefixes = append(prefixes, p)
		return i, err
	})
	if err != nil {
		return nil, fmt.Errorf("list interactions of %s: %w", sessionID, err)
	}
	turns := make([]turn, len(out))
	for k := range out {
		i := &out[k]
		turns[k] = turn{id: i.ID, prefix: prefixes[k], request: &i.Request, response: &i.Response, prompt: &i.PromptTokenIDs, completion: &i.CompletionTokenIDs}
	}
	if err := expand(ctx, db, turns); err != nil {
		return nil, fmt.Errorf("list interactions of %s: %w", sessionID, err)
	}
	return out, nil
}

// RewardRow is one reward as it arrived.
type RewardRow struct {
	ID            int64
	InteractionID *int64
	Value         float64
	Source        string
	Final         bool
	CreatedAt     time.Time
}

// SessionRewards lists a session's rewards in arrival order.
func SessionRewards(ctx context.Context, db DBTX, tenantID, sessionID string) ([]RewardRow, error) {
	rows, err := db.Query(ctx, `
SELECT id, interaction_id, value, source, final, created_at
FROM rewards WHERE tenant_id = $1 AND session_id = $2 ORDER BY id`, tenantID, sessionID)
	if err != nil {
		return nil, fmt.Errorf("list rewards of %s: %w", sessionID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RewardRow, error) {
		var w RewardRow
		err := r.Scan(&w.ID, &w.InteractionID, &w.Value, &w.Source, &w.Final, &w.CreatedAt)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("list rewards of %s: %w", sessionID, err)
	}
	return out, nil
}

// NewTrajectory is an assembled trajectory to write.
type NewTrajectory struct {
	TenantID, SessionID string
	// Key is the assembly's idempotency key.
	Key         string
	Discount    float64
	TotalReward *float64
	Steps       []NewStep
}

// NewStep is one ATDP step to write; Step is its JSON.
type NewStep struct {
	InteractionID int64
	Index         int
	Step          []byte
	Reward        *float64
	Return        *float64
	Eligible      bool
	Reason        string
	Redactions    []byte
}

// StepSummary is a written step as the assembly reports it.
type StepSummary struct {
	ID       int64
	Index    int
	Eligible bool
	Reason   string
}

// InsertTrajectory writes t and its steps in one transaction. If a
// trajectory with t.Key exists it is returned instead (existed = true), so
// a retried assembly never writes twice.
func InsertTrajectory(ctx context.Context, db Beginner, t NewTrajectory) (id int64, steps []StepSummary, existed bool, err error) {
	if t.Key == "" {
		return 0, nil, false, errors.New("insert trajectory: empty assembly key")
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT id FROM trajectories WHERE assembly_key = $1`, t.Key).Scan(&id)
		if err == nil {
			existed = true
			steps, err = TrajectorySteps(ctx, tx, id)
			return err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		err = tx.QueryRow(ctx, `
INSERT INTO trajectories (tenant_id, session_id, steps, total_reward, discount, assembly_key)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`,
			t.TenantID, t.SessionID, len(t.Steps), t.TotalReward, t.Discount, t.Key).Scan(&id)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE sessions SET assembled_at = now() WHERE id = $1 AND tenant_id = $2 AND assembled_at IS NULL`,
			t.SessionID, t.TenantID); err != nil {
			return err
		}
		var parent *int64
		for _, s := range t.Steps {
			redactions := s.Redactions
			if redactions == nil {
				redactions = []byte("[]")
			}
			var sid int64
			err := tx.QueryRow(ctx, `
INSERT INTO atdp_steps (tenant_id, trajectory_id, session_id, interaction_id, step_index, parent_step_id,
                        step, reward, discounted_return, eligible, ineligible_reason, redactions)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id`,
				t.TenantID, id, t.SessionID, s.InteractionID, s.Index, parent,
				s.Step, s.Reward, s.Return, s.Eligible, s.Reason, redactions).Scan(&sid)
			if err != nil {
				return fmt.Errorf("step %d: %w", s.Index, err)
			}
			steps = append(steps, StepSummary{ID: sid, Index: s.Index, Eligible: s.Eligible, Reason: s.Reason})
			parent = &sid
		}
		return nil
	})
	if err != nil {
		return 0, nil, false, fmt.Errorf("insert trajectory for %s: %w", t.SessionID, err)
	}
	return id, steps, existed, nil
}

// TrajectorySteps summarises a trajectory's steps in order.
func TrajectorySteps(ctx context.Context, db DBTX, trajectoryID int64) ([]StepSummary, error) {
	rows, err := db.Query(ctx, `
SELECT id, step_index, eligible, ineligible_reason FROM atdp_steps
WHERE trajectory_id = $1 ORDER BY step_index`, trajectoryID)
	if err != nil {
		return nil, fmt.Errorf("list steps of trajectory %d: %w", trajectoryID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StepSummary, error) {
		var s StepSummary
		err := r.Scan(&s.ID, &s.Index, &s.Eligible, &s.Reason)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("list steps of trajectory %d: %w", trajectoryID, err)
	}
	return out, nil
}

// TrajectoryTotal reads a trajectory's total reward (nil when none).
func TrajectoryTotal(ctx context.Context, db DBTX, trajectoryID int64) (*float64, error) {
	var v *float64
	err := db.QueryRow(ctx, `SELECT total_reward FROM trajectories WHERE id = $1`, trajectoryID).Scan(&v)
	if err != nil {
		return nil, fmt.Errorf("read trajectory %d: %w", trajectoryID, notFound(err))
	}
	return v, nil
}

// Enqueued is what EnqueueSamples did with a trajectory's eligible steps.
type Enqueued struct {
	// Eligible counts the trajectory's eligible steps.
	Eligible int
	// Queued counts samples this call queued (steps no assembly queued).
	Queued int
	// Rescored counts queued samples of an earlier assembly that took this
	// trajectory's return (a reward arrived after they were queued).
	Rescored int
	// AfterTraining counts steps whose sample had trained already (they
	// are marked arrived_after_training and the sample keeps its return)
	// or was dropped as stale (marked stale_version).
	AfterTraining int
}

// stepIDsSQL reads an ATDP step's token ids: what trains is the redacted
// step, not the raw capture.
const stepIDsSQL = `ARRAY(SELECT x::%[2]s FROM jsonb_array_elements_text(s.step->'action'->'tokens'->'%[1]s') WITH ORDINALITY AS t(x, n) ORDER BY n)`

// EnqueueSamples queues the eligible steps of a trajectory for training,
// with the token ids of the stored (redacted) step. A step whose
// interaction an earlier assembly of the session queued is not queued
// twice: a sample still queued takes the new return (a late reward
// re-scores it); one that trained already keeps the return it trained
// with, and the new step, if its return differs, says
// arrived_after_training; one dropped as stale marks the step stale.
// The step id is unique in training_samples, so calling it again changes
// nothing.
func EnqueueSamples(ctx context.Context, db Beginner, tenantID string, trajectoryID int64) (Enqueued, error) {
	var out Enqueued
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
SELECT count(*) FROM atdp_steps WHERE trajectory_id = $1 AND tenant_id = $2 AND eligible`,
			trajectoryID, tenantID).Scan(&out.Eligible)
		if err != nil {
			return fmt.Errorf("count eligible steps: %w", err)
		}
		// Samples an earlier assembly queued for the same interactions.
		const prior = `
WITH e AS (SELECT id, interaction_id, discounted_return FROM atdp_steps
           WHERE trajectory_id = $1 AND tenant_id = $2 AND eligible AND discounted_return IS NOT NULL),
p AS (SELECT e.id AS new_step, e.discounted_return, ts.id AS sample_id, ts.status, ts.reward
      FROM e JOIN atdp_steps s2 ON s2.interaction_id = e.interaction_id AND s2.id <> e.id
      JOIN training_samples ts ON ts.step_id = s2.id)`
		tag, err := tx.Exec(ctx, prior+`
UPDATE training_samples ts SET reward = p.discounted_return, step_id = p.new_step
FROM p WHERE ts.id = p.sample_id AND p.status = 'queued' AND p.reward <> p.discounted_return`, trajectoryID, tenantID)
		if err != nil {
			return fmt.Errorf("re-score queued samples: %w", err)
		}
		out.Rescored = int(tag.RowsAffected())
		tag, err = tx.Exec(ctx, prior+`
UPDATE atdp_steps s SET eligible = false,
  ineligible_reason = CASE p.status WHEN 'dropped_stale' THEN 'stale_version' ELSE 'arrived_after_training' END
FROM p WHERE s.id = p.new_step AND (p.status = 'dropped_stale' OR p.status <> 'queued' AND p.reward <> p.discounted_return)`, trajectoryID, tenantID)
		if err != nil {
			return fmt.Errorf("mark steps trained before: %w", err)
		}
		out.AfterTraining = int(tag.RowsAffected())
		tag, err = tx.Exec(ctx, `
INSERT INTO training_samples (tenant_id, step_id, deployment, task_id, group_id, behaviour_version,
                              prompt_token_ids, completion_token_ids, logprobs, reward, session_id, group_size)
SELECT s.tenant_id, s.id, i.deployment, se.task_id, se.group_id, i.model_version,
       `+fmt.Sprintf(stepIDsSQL, "prompt_ids", "integer")+`, `+fmt.Sprintf(stepIDsSQL, "completion_ids", "integer")+`,
       `+fmt.Sprintf(stepIDsSQL, "logprobs", "real")+`, s.discounted_return, s.session_id, se.group_size
FROM atdp_steps s
JOIN interactions i ON i.id = s.interaction_id
JOIN sessions se ON se.tenant_id = s.tenant_id AND se.id = s.session_id
WHERE s.trajectory_id = $1 AND s.tenant_id = $2 AND s.eligible AND s.discounted_return IS NOT NULL
  AND jsonb_array_length(s.step->'action'->'tokens'->'completion_ids') > 0
  AND NOT EXISTS (
      SELECT 1 FROM training_samples ts JOIN atdp_steps s2 ON s2.id = ts.step_id
      WHERE s2.interaction_id = s.interaction_id)
ON CONFLICT (step_id) DO NOTHING`, trajectoryID, tenantID)
		if err != nil {
			return fmt.Errorf("enqueue samples: %w", err)
		}
		out.Queued = int(tag.RowsAffected())
		return nil
	})
	if err != nil {
		return Enqueued{}, fmt.Errorf("enqueue samples of trajectory %d: %w", trajectoryID, err)
	}
	return out, nil
}

// QueuedSamplesOfSession counts a session's samples with status queued.
func QueuedSamplesOfSession(ctx context.Context, db DBTX, tenantID, sessionID string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `
SELECT count(*) FROM training_samples ts JOIN atdp_steps s ON s.id = ts.step_id
WHERE s.tenant_id = $1 AND s.session_id = $2 AND ts.status = 'queued'`, tenantID, sessionID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count queued samples of %s: %w", sessionID, err)
	}
	return n, nil
}

// CloseSession marks an open session ended after its workflow assembled
// it; an already ended one is left as it is (the call is idempotent).
func CloseSession(ctx context.Context, db DBTX, tenantID, sessionID string) error {
	_, err := db.Exec(ctx, `
UPDATE sessions SET status = 'ended', ended_at = now()
WHERE id = $1 AND tenant_id = $2 AND status = 'open'`, sessionID, tenantID)
	if err != nil {
		return fmt.Errorf("close session %s: %w", sessionID, err)
	}
	return nil
}
