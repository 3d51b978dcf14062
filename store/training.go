package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/statusapi"
)

// VersionNumber parses the policy version number out of a model version id
// "<name>@v<N>" (the in-process engine's naming); ok is false for other
// names (upstream models), whose staleness cannot be judged.
func VersionNumber(id string) (int64, bool) { return statusapi.VersionNumber(id) }

// VersionID names version n of a deployment as the engine does.
func VersionID(deployment string, n int64) string {
	return deployment + "@v" + strconv.FormatInt(n, 10)
}

// QueueStats says how many samples of a deployment are queued and how long
// the oldest has waited.
func QueueStats(ctx context.Context, db DBTX, deployment string) (queued int, oldest time.Duration, err error) {
	return queueStats(ctx, db, deployment, -1, 0)
}

// FreshQueueStats is QueueStats for the samples a claim with staleness
// bound eta and group wait groupWait would take: behaviour version no more
// than eta behind the serving one (eta < 0, or a version that is not
// "<name>@v<N>": all), in groups that are whole or waited groupWait (0:
// every group is ready). A training loop that counted the stale ones too
// started steps on a sliver of fresh samples, each as large an update as a
// full batch.
func FreshQueueStats(ctx context.Context, db DBTX, deployment string, eta int, groupWait time.Duration) (queued int, oldest time.Duration, err error) {
	floor := int64(-1)
	if eta >= 0 {
		serving, err := ServingOf(ctx, db, deployment, artefact.LayerWeights)
		if err != nil {
			return 0, 0, err
		}
		floor = freshFloor(serving, eta)
	}
	return queueStats(ctx, db, deployment, floor, groupWait)
}

// readyGroups lists the queued samples of deployment ($1) with behaviour
// version at least $2 (< 0: any) by GRPO group (k: RunSample.GroupKey, or
// the sample alone), and keeps the groups that are ready: all of their
// sessions queued, or waiting longer than $3 seconds (0: every group),
// since a member that never comes (unrewarded, stale, opted out) must not
// hold the rest back for ever. A group trained
// before its last members arrive is normalised against part of itself.
const readyGroups = `
q AS (
  SELECT id, created_at, session_id, group_size, CASE WHEN group_id = '' THEN 'id:' || id ELSE tenant_id || '/' || group_id END AS k
  FROM training_samples WHERE deployment = $1 AND status = 'queued'
    AND ($2::bigint < 0 OR (` + behaviourVersionN + `::bigint >= $2) IS NOT FALSE)),
g AS (
  SELECT k, min(created_at) AS first, count(*) AS n FROM q GROUP BY k
  HAVING $3::float8 <= 0 OR count(DISTINCT session_id) >= max(group_size)
      OR min(created_at) < now() - make_interval(secs => $3::float8))`

// behaviourVersionN is a training sample's behaviour version number, NULL
// for names that are not "<name>@v<N>" (whose staleness cannot be judged).
const behaviourVersionN = `substring(behaviour_version from ` + versionPattern + `)`

// versionPattern captures N in a version id "<name>@v<N>" (VersionNumber
// in SQL).
const versionPattern = `'@v([0-9]+)$'`

// freshFloor is the oldest behaviour version a claim with staleness bound
// eta keeps while serving serves; -1: no bound.
func freshFloor(serving string, eta int) int64 {
	cur, ok := VersionNumber(serving)
	if !ok || eta < 0 {
		return -1
	}
	return cur - int64(eta)
}

// queueStats counts the queued samples of ready groups whose behaviour
// version is at least floor (or unnumbered); floor < 0 counts all.
func queueStats(ctx context.Context, db DBTX, deployment string, floor int64, groupWait time.Duration) (queued int, oldest time.Duration, err error) {
	var secs float64
	err = db.QueryRow(ctx, `WITH `+readyGroups+`
SELECT COALESCE(sum(n), 0)::int, COALESCE(extract(epoch FROM now() - min(first)), 0)::float8 FROM g`,
		deployment, floor, groupWait.Seconds()).Scan(&queued, &secs)
	if err != nil {
		return 0, 0, fmt.Errorf("queue stats of %s: %w", deployment, err)
	}
	return queued, time.Duration(secs * float64(time.Second)), nil
}

// TrainingRun is a training_runs row.
type TrainingRun struct {
	ID          int64
	Deployment  string
	RunKey      string
	SampleIDs   []int64
	Status      string
	VersionID   *string
	BaseVersion string
	Dropped     int
	// Prepared is set once its batch was written (PrepareRun).
	Prepared *PreparedRun
}

// PreparedRun is what a run's batch was written with: the candidate
// version reserved for it, the weights it trains on from, and the
// advantages' by-products, which commit with its checkpoint.
type PreparedRun struct {
	Candidate string             `json:"candidate"`
	Base      string             `json:"base"`
	Baselines map[string]float64 `json:"baselines,omitempty"`
	Observed  map[string]int     `json:"observed,omitempty"`
	// Samples are the batch's samples, the version's lineage.
	Samples []int64 `json:"samples"`
	// Flat are the samples of groups with no learning signal.
	Flat []int64 `json:"flat,omitempty"`
	// Stats are the advantage figures, stored with the version.
	Stats map[string]any `json:"stats,omitempty"`
}

// versionN is the number of a version id column or expression ("d@v7": 7).
func versionN(expr string) string {
	return `(substring(` + expr + ` from ` + versionPattern + `))::bigint`
}

// PrepareRun reserves the run's candidate version and stores p with it.
// The candidate is the deployment's next number, above every stored
// version and every candidate reserved before, so a failed or rolled-back
// step's number is never reused. Preparing a run again keeps its
// candidate.
func PrepareRun(ctx context.Context, db Beginner, runID int64, p PreparedRun) (PreparedRun, error) {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var deployment string
		var prev *string
		err := tx.QueryRow(ctx, `SELECT deployment, stats->'prepared'->>'candidate' FROM training_runs WHERE id = $1 FOR UPDATE`, runID).
			Scan(&deployment, &prev)
		if err != nil {
			return notFound(err)
		}
		if prev != nil && *prev != "" {
			p.Candidate = *prev
		} else {
			// A deployment's training workflow is its one writer; the lock
			// orders any other (a test, an operator's tool).
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('prepare-run/' || $1))`, deployment); err != nil {
				return err
			}
			var n int64
			err := tx.QueryRow(ctx, `SELECT coalesce(greatest(
  (SELECT max(`+versionN("id")+`) FROM model_versions WHERE deployment = $1),
  (SELECT max(`+versionN("stats->'prepared'->>'candidate'")+`) FROM training_runs WHERE deployment = $1)), 0) + 1`, deployment).Scan(&n)
			if err != nil {
				return err
			}
			p.Candidate = VersionID(deployment, n)
		}
		b, err := json.Marshal(p)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE training_runs SET stats = stats || jsonb_build_object('prepared', $2::jsonb) WHERE id = $1`, runID, b)
		return err
	})
	if err != nil {
		return PreparedRun{}, fmt.Errorf("prepare run %d: %w", runID, err)
	}
	return p, nil
}

// ClaimBatch claims up to size queued samples of a deployment for one
// training run keyed by runKey, after marking samples staler than η
// (behaviour version more than η behind the serving version)
// dropped_stale. The same key returns the same run.
func ClaimBatch(ctx context.Context, db Beginner, deployment, runKey string, size, eta int, groupWait time.Duration) (TrainingRun, error) {
	var run TrainingRun
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var stats []byte
		err := tx.QueryRow(ctx, `SELECT id, deployment, run_key, sample_ids, status, version_id, stats FROM training_runs WHERE run_key = $1`, runKey).
			Scan(&run.ID, &run.Deployment, &run.RunKey, &run.SampleIDs, &run.Status, &run.VersionID, &stats)
		if err == nil {
			var s struct {
				BaseVersion  string `json:"base_version"`
				DroppedStale int    `json:"dropped_stale"`
			}
			_ = json.Unmarshal(stats, &s)
			run.BaseVersion, run.Dropped = s.BaseVersion, s.DroppedStale
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		base, err := ServingOf(ctx, tx, deployment, artefact.LayerWeights)
		if err != nil {
			return err
		}
		run.BaseVersion = base
		if floor := freshFloor(base, eta); floor >= 0 {
			// The steps say so too (GET /v1/sessions/{id}: stale_version).
			tag, err := tx.Exec(ctx, `
WITH d AS (UPDATE training_samples SET status = 'dropped_stale'
           WHERE deployment = $1 AND status = 'queued' AND `+behaviourVersionN+`::bigint < $2 RETURNING step_id)
UPDATE atdp_steps SET eligible = false, ineligible_reason = 'stale_version' WHERE id IN (SELECT step_id FROM d)`, deployment, floor)
			if err != nil {
				return fmt.Errorf("drop stale samples: %w", err)
			}
			run.Dropped = int(tag.RowsAffected())
		}
		// Whole, ready GRPO groups, oldest first, until the batch is full
		// (the last group may take it past size).
		rows, err := tx.Query(ctx, `WITH `+readyGroups+`,
picked AS (
  SELECT k FROM (SELECT k, sum(n) OVER (ORDER BY first, k) - n AS before FROM g) x WHERE before < $4)
SELECT q.id FROM q JOIN picked USING (k) ORDER BY q.created_at, q.id`, deployment, int64(-1), groupWait.Seconds(), size)
		if err != nil {
			return err
		}
		run.SampleIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		if run.SampleIDs == nil {
			run.SampleIDs = []int64{}
		}
		stats, _ = json.Marshal(map[string]any{"base_version": run.BaseVersion, "dropped_stale": run.Dropped})
		run.Deployment, run.RunKey, run.Status = deployment, runKey, "claimed"
		return tx.QueryRow(ctx, `INSERT INTO training_runs (deployment, run_key, sample_ids, stats) VALUES ($1, $2, $3, $4) RETURNING id`,
			deployment, runKey, run.SampleIDs, stats).Scan(&run.ID)
	})
	if err != nil {
		return TrainingRun{}, fmt.Errorf("claim batch of %s: %w", deployment, err)
	}
	return run, nil
}

// RunSample is a claimed sample with what training and lineage need.
type RunSample struct {
	ID                 int64
	TenantID           string
	SessionID          string
	TaskID, GroupID    string
	BehaviourVersion   string
	PromptTokenIDs     []int32
	CompletionTokenIDs []int32
	Logprobs           []float32
	Reward             float64
	Status             string
}

// GroupKey names the sample's GRPO group for the trainer, as readyGroups
// keys groups for the claim: group ids are the client's names, so two
// tenants' "g1" are different groups. "" for a sample in no group.
func (s RunSample) GroupKey() string {
	if s.GroupID == "" {
		return ""
	}
	return s.TenantID + "/" + s.GroupID
}

// LoadRun reads a run and its samples (in claim order).
func LoadRun(ctx context.Context, db DBTX, runID int64) (TrainingRun, []RunSample, error) {
	var run TrainingRun
	var stats []byte
	err := db.QueryRow(ctx, `SELECT id, deployment, run_key, sample_ids, status, version_id, stats FROM training_runs WHERE id = $1`, runID).
		Scan(&run.ID, &run.Deployment, &run.RunKey, &run.SampleIDs, &run.Status, &run.VersionID, &stats)
	if err != nil {
		return run, nil, fmt.Errorf("load training run %d: %w", runID, notFound(err))
	}
	var s struct {
		BaseVersion string       `json:"base_version"`
		Prepared    *PreparedRun `json:"prepared"`
	}
	_ = json.Unmarshal(stats, &s)
	run.BaseVersion, run.Prepared = s.BaseVersion, s.Prepared
	rows, err := db.Query(ctx, `
SELECT ts.id, ts.tenant_id, st.session_id, ts.task_id, ts.group_id, ts.behaviour_version,
       ts.prompt_token_ids, ts.completion_token_ids, ts.logprobs, ts.reward, ts.status
FROM unnest($1::bigint[]) WITH ORDINALITY AS c(id, n)
JOIN training_samples ts ON ts.id = c.id
JOIN atdp_steps st ON st.id = ts.step_id
ORDER BY c.n`, run.SampleIDs)
	if err != nil {
		return run, nil, fmt.Errorf("load samples of run %d: %w", runID, err)
	}
	samples, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RunSample, error) {
		var s RunSample
		err := r.Scan(&s.ID, &s.TenantID, &s.SessionID, &s.TaskID, &s.GroupID, &s.BehaviourVersion,
			&s.PromptTokenIDs, &s.CompletionTokenIDs, &s.Logprobs, &s.Reward, &s.Status)
		return s, err
	})
	if err != nil {
		return run, nil, fmt.Errorf("load samples of run %d: %w", runID, err)
	}
	return run, samples, nil
}

// TaskBaselines reads the running mean reward of each task of a deployment.
func TaskBaselines(ctx context.Context, db DBTX, deployment string) (map[string]float64, error) {
	rows, err := db.Query(ctx, `SELECT task_id, value FROM task_baselines WHERE deployment = $1`, deployment)
	if err != nil {
		return nil, fmt.Errorf("read task baselines of %s: %w", deployment, err)
	}
	out := map[string]float64{}
	var task string
	var v float64
	_, err = pgx.ForEachRow(rows, []any{&task, &v}, func() error {
		out[task] = v
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read task baselines of %s: %w", deployment, err)
	}
	return out, nil
}

// TrainedRun is what a finished train step commits. Parent is the version
// whose weights it started from (not recorded when no such row exists: a
// base the deployment never registered).
type TrainedRun struct {
	RunID       int64
	Deployment  string
	Version     string
	Parent      string
	Checkpoint  string
	Metrics     any
	Samples     []RunSample
	Baselines   map[string]float64
	BaselineObs map[string]int
	// Flat are samples whose group carried no learning signal (every
	// answer scored the same); their steps are marked filtered_group.
	Flat []int64
}

// CommitTrainedRun records the candidate version with its lineage (every
// sample it trained on, with tenant and session), marks the samples used,
// stores the moved task baselines and closes the run, in one transaction.
// A run already trained is left as it is.
func CommitTrainedRun(ctx context.Context, db Beginner, t TrainedRun) error {
	metrics, err := json.Marshal(t.Metrics)
	if err != nil {
		return fmt.Errorf("commit run %d: %w", t.RunID, err)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var status string
		if err := tx.QueryRow(ctx, `SELECT status FROM training_runs WHERE id = $1 FOR UPDATE`, t.RunID).Scan(&status); err != nil {
			return fmt.Errorf("commit run %d: %w", t.RunID, notFound(err))
		}
		if status == "trained" {
			return nil
		}
		var parent *string
		if t.Parent != "" {
			parent = &t.Parent
		}
		_, err := tx.Exec(ctx, `
INSERT INTO model_versions (id, deployment, parent_version, status, checkpoint_path, metrics)
VALUES ($1, $2, (SELECT id FROM model_versions WHERE id = $3), 'candidate', $4, $5)`, t.Version, t.Deployment, parent, t.Checkpoint, metrics)
		if err != nil {
			return fmt.Errorf("commit run %d: insert version %s: %w", t.RunID, t.Version, err)
		}
		ids := make([]int64, len(t.Samples))
		tenants := make([]string, len(t.Samples))
		sessions := make([]string, len(t.Samples))
		for i, s := range t.Samples {
			ids[i], tenants[i], sessions[i] = s.ID, s.TenantID, s.SessionID
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO model_version_lineage (version_id, sample_id, tenant_id, session_id)
SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[])
ON CONFLICT DO NOTHING`, t.Version, ids, tenants, sessions); err != nil {
			return fmt.Errorf("commit run %d: lineage: %w", t.RunID, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE training_samples SET status = 'used' WHERE id = ANY($1) AND status = 'queued'`, ids); err != nil {
			return fmt.Errorf("commit run %d: mark samples used: %w", t.RunID, err)
		}
		if len(t.Flat) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE atdp_steps SET eligible = false, ineligible_reason = 'filtered_group'
WHERE id IN (SELECT step_id FROM training_samples WHERE id = ANY($1))`, t.Flat); err != nil {
				return fmt.Errorf("commit run %d: mark flat groups: %w", t.RunID, err)
			}
		}
		for task, v := range t.Baselines {
			if _, err := tx.Exec(ctx, `
INSERT INTO task_baselines (deployment, task_id, value, samples) VALUES ($1, $2, $3, $4)
ON CONFLICT (deployment, task_id) DO UPDATE SET value = EXCLUDED.value,
    samples = task_baselines.samples + EXCLUDED.samples, updated_at = now()`, t.Deployment, task, v, t.BaselineObs[task]); err != nil {
				return fmt.Errorf("commit run %d: baseline of task %q: %w", t.RunID, task, err)
			}
		}
		_, err = tx.Exec(ctx, `UPDATE training_runs SET status = 'trained', version_id = $2, finished_at = now(),
    stats = stats || $3 WHERE id = $1`, t.RunID, t.Version, metrics)
		return err
	})
}

// FailRun marks a run failed; its samples stay queued for the next batch.
func FailRun(ctx context.Context, db DBTX, runID int64, reason string) error {
	_, err := db.Exec(ctx, `UPDATE training_runs SET status = 'failed', finished_at = now(),
    stats = stats || jsonb_build_object('error', $2::text) WHERE id = $1 AND status = 'claimed'`, runID, reason)
	if err != nil {
		return fmt.Errorf("fail run %d: %w", runID, err)
	}
	return nil
}
