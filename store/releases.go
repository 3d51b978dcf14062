package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/artefact"
)

// ArtefactKind maps a release layer to its artefacts.kind ("" for weights).
func ArtefactKind(layer string) string {
	switch layer {
	case artefact.LayerPlaybook, artefact.LayerHarness, artefact.LayerToolSchema:
		return layer
	}
	return ""
}

// ServingOf is what serves a layer of a deployment now: the serving model
// version (weights) or the serving artefact version number ("" if none).
func ServingOf(ctx context.Context, db DBTX, deployment, layer string) (string, error) {
	if kind := ArtefactKind(layer); kind != "" {
		var v *int
		err := db.QueryRow(ctx, `SELECT max(version) FROM artefacts WHERE deployment = $1 AND kind = $2 AND status = 'serving'`,
			deployment, kind).Scan(&v)
		if err != nil || v == nil {
			return "", err
		}
		return strconv.Itoa(*v), nil
	}
	var v *string
	err := db.QueryRow(ctx, `SELECT serving_version FROM deployments WHERE name = $1`, deployment).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) || v == nil {
		return "", nil
	}
	return *v, err
}

// Release is a releases row.
type Release struct {
	ID                    int64
	Deployment, Layer     string
	Candidate, Baseline   string
	Status, Phase, Reason string
	CanaryShare           float64
	WorkflowID            string
	StartedAt             time.Time
	FinishedAt            *time.Time
}

// BeginRelease writes the release row for workflowID, or returns the one an
// earlier attempt wrote. An empty baseline is filled from what serves now.
func BeginRelease(ctx context.Context, db DBTX, r Release) (Release, error) {
	if r.WorkflowID == "" {
		return Release{}, errors.New("begin release: empty workflow id")
	}
	if r.Baseline == "" {
		b, err := ServingOf(ctx, db, r.Deployment, r.Layer)
		if err != nil {
			return Release{}, fmt.Errorf("begin release: read serving %s of %s: %w", r.Layer, r.Deployment, err)
		}
		r.Baseline = b
	}
	_, err := db.Exec(ctx, `
INSERT INTO releases (deployment, layer, candidate, baseline, workflow_id, reason, phase)
VALUES ($1, $2, $3, $4, $5, $6, 'starting')
ON CONFLICT (workflow_id) WHERE workflow_id <> '' DO NOTHING`,
		r.Deployment, r.Layer, r.Candidate, r.Baseline, r.WorkflowID, r.Reason)
	if err != nil {
		return Release{}, fmt.Errorf("begin release of %s: %w", r.Candidate, err)
	}
	return ReleaseByWorkflow(ctx, db, r.WorkflowID)
}

const releaseCols = `id, deployment, layer, candidate, baseline, status, phase, reason, canary_share, workflow_id, started_at, finished_at`

func scanRelease(row pgx.Row) (Release, error) {
	var r Release
	err := row.Scan(&r.ID, &r.Deployment, &r.Layer, &r.Candidate, &r.Baseline, &r.Status, &r.Phase, &r.Reason,
		&r.CanaryShare, &r.WorkflowID, &r.StartedAt, &r.FinishedAt)
	return r, notFound(err)
}

// ReleaseByWorkflow reads the release a workflow owns.
func ReleaseByWorkflow(ctx context.Context, db DBTX, workflowID string) (Release, error) {
	r, err := scanRelease(db.QueryRow(ctx, `SELECT `+releaseCols+` FROM releases WHERE workflow_id = $1`, workflowID))
	if err != nil {
		return Release{}, fmt.Errorf("read release of %s: %w", workflowID, err)
	}
	return r, nil
}

// RunningRelease is the running release of a deployment's layer, which the
// gateway routes by (phase shadow: mirror; canary: canary_share).
func RunningRelease(ctx context.Context, db DBTX, deployment, layer string) (Release, error) {
	r, err := scanRelease(db.QueryRow(ctx, `SELECT `+releaseCols+` FROM releases
WHERE deployment = $1 AND layer = $2 AND status = 'running' ORDER BY started_at DESC LIMIT 1`, deployment, layer))
	if err != nil {
		return Release{}, fmt.Errorf("read running %s release of %s: %w", layer, deployment, err)
	}
	return r, nil
}

// Draining lists the versions a release of layer moved traffic away from
// (its baseline and candidate) less than within ago.
func Draining(ctx context.Context, db DBTX, deployment, layer string, within time.Duration) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT v FROM releases, unnest(ARRAY[baseline, candidate]) AS v
WHERE deployment = $1 AND layer = $2 AND status <> 'running' AND finished_at > now() - $3::interval AND v <> ''
ORDER BY v`, deployment, layer, within)
	if err != nil {
		return nil, fmt.Errorf("read draining %s versions of %s: %w", layer, deployment, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ListReleases lists a deployment's releases, newest first.
func ListReleases(ctx context.Context, db DBTX, deployment string, limit int) ([]Release, error) {
	rows, err := db.Query(ctx, `SELECT `+releaseCols+` FROM releases WHERE deployment = $1 ORDER BY started_at DESC, id DESC LIMIT $2`, deployment, limit)
	if err != nil {
		return nil, fmt.Errorf("list releases of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Release, error) { return scanRelease(r) })
}

// SetReleasePhase moves a running release to phase with the canary share
// the gateway routes to the candidate.
func SetReleasePhase(ctx context.Context, db DBTX, id int64, phase string, share float64) error {
	if share < 0 || share > 1 {
		return fmt.Errorf("set release phase: canary share %v is outside [0, 1]", share)
	}
	_, err := db.Exec(ctx, `UPDATE releases SET phase = $2, canary_share = $3 WHERE id = $1 AND status = 'running'`, id, phase, share)
	if err != nil {
		return fmt.Errorf("set release %d phase %s: %w", id, phase, err)
	}
	return nil
}

// RecordGate stores a gate's numbers; evaluating the gate again (a retry,
// or the canary's next check) replaces them.
func RecordGate(ctx context.Context, db DBTX, releaseID int64, gate string, passed bool, metrics any) error {
	raw, err := json.Marshal(metrics)
	if err != nil {
		return fmt.Errorf("record %s gate: %w", gate, err)
	}
	_, err = db.Exec(ctx, `
INSERT INTO gate_results (release_id, gate, passed, metrics) VALUES ($1, $2, $3, $4)
ON CONFLICT (release_id, gate) DO UPDATE SET passed = EXCLUDED.passed, metrics = EXCLUDED.metrics, created_at = now()`,
		releaseID, gate, passed, raw)
	if err != nil {
		return fmt.Errorf("record %s gate of release %d: %w", gate, releaseID, err)
	}
	return nil
}

// GateRow is a recorded gate result.
type GateRow struct {
	Gate    string
	Passed  bool
	Metrics map[string]any
}

// ReleaseGates lists a release's gate results in the order they ran.
func ReleaseGates(ctx context.Context, db DBTX, releaseID int64) ([]GateRow, error) {
	rows, err := db.Query(ctx, `SELECT gate, passed, metrics FROM gate_results WHERE release_id = $1 ORDER BY id`, releaseID)
	if err != nil {
		return nil, fmt.Errorf("list gates of release %d: %w", releaseID, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (GateRow, error) {
		var g GateRow
		err := r.Scan(&g.Gate, &g.Passed, &g.Metrics)
		return g, err
	})
}

// FinishRelease ends a running release: promoted makes the candidate serve
// (the previous serving version is superseded); rolled_back and aborted
// mark the candidate rolled back. Either way the canary share drops to
// zero. Finishing an already finished release changes nothing.
func FinishRelease(ctx context.Context, db Beginner, id int64, status, reason string) error {
	switch status {
	case "promoted", "rolled_back", "aborted":
	default:
		return fmt.Errorf("finish release %d: status %q is not promoted, rolled_back or aborted", id, status)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		r, err := scanRelease(tx.QueryRow(ctx, `SELECT `+releaseCols+` FROM releases WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return fmt.Errorf("finish release %d: %w", id, err)
		}
		if r.Status != "running" {
			return nil
		}
		kind := ArtefactKind(r.Layer)
		if status == "promoted" {
			if kind == "" {
				if err := promoteVersion(ctx, tx, r.Deployment, r.Candidate); err != nil {
					return fmt.Errorf("finish release %d: %w", id, err)
				}
			} else if err := promoteArtefact(ctx, tx, r.Deployment, kind, r.Candidate); err != nil {
				return fmt.Errorf("finish release %d: %w", id, err)
			}
		} else {
			if kind == "" {
				_, err = tx.Exec(ctx, `UPDATE model_versions SET status = 'rolled_back', retired_reason = $2 WHERE id = $1 AND status = 'candidate'`, r.Candidate, reason)
			} else {
				_, err = tx.Exec(ctx, `UPDATE artefacts SET status = 'rolled_back' WHERE deployment = $1 AND kind = $2 AND version::text = $3 AND status = 'candidate'`, r.Deployment, kind, r.Candidate)
			}
			if err != nil {
				return fmt.Errorf("finish release %d: roll back candidate: %w", id, err)
			}
		}
		_, err = tx.Exec(ctx, `UPDATE releases SET status = $2, reason = $3, phase = 'done', canary_share = 0, finished_at = now() WHERE id = $1`, id, status, reason)
		if err != nil {
			return fmt.Errorf("finish release %d: %w", id, err)
		}
		return nil
	})
}

func promoteVersion(ctx context.Context, tx pgx.Tx, deployment, version string) error {
	if _, err := tx.Exec(ctx, `UPDATE model_versions SET status = 'superseded' WHERE deployment = $1 AND status = 'serving' AND id <> $2`, deployment, version); err != nil {
		return fmt.Errorf("supersede serving version: %w", err)
	}
	tag, err := tx.Exec(ctx, `UPDATE model_versions SET status = 'serving' WHERE id = $1 AND deployment = $2 AND status IN ('candidate', 'serving', 'superseded')`, version, deployment)
	if err != nil {
		return fmt.Errorf("promote version %s: %w", version, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("promote version %s: no such promotable version of %s", version, deployment)
	}
	if _, err := tx.Exec(ctx, `UPDATE deployments SET serving_version = $2, updated_at = now() WHERE name = $1`, deployment, version); err != nil {
		return fmt.Errorf("route %s to %s: %w", deployment, version, err)
	}
	return nil
}

func promoteArtefact(ctx context.Context, tx pgx.Tx, deployment, kind, version string) error {
	if _, err := tx.Exec(ctx, `UPDATE artefacts SET status = 'superseded' WHERE deployment = $1 AND kind = $2 AND status = 'serving' AND version::text <> $3`, deployment, kind, version); err != nil {
		return fmt.Errorf("supersede serving %s: %w", kind, err)
	}
	tag, err := tx.Exec(ctx, `UPDATE artefacts SET status = 'serving' WHERE deployment = $1 AND kind = $2 AND version::text = $3`, deployment, kind, version)
	if err != nil {
		return fmt.Errorf("promote %s %s: %w", kind, version, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("promote %s: no version %s of %s", kind, version, deployment)
	}
	return nil
}

// VersionOutcomes is what the live traffic a version served says about it.
type VersionOutcomes struct {
	Interactions int
	Errors       int
	// Rewarded interactions have a step reward or a session outcome.
	Rewarded   int
	MeanReward float64
	StdReward  float64
}

// maxOutcomeSeries bounds the rewards OutcomeSeries returns.
const maxOutcomeSeries = 20_000

// OutcomeSeries summarises the deployment's interactions served by version
// since t (and, when artefacts is not nil, under exactly those artefact
// versions, store.ArtefactSuffix) and returns each rewarded one's reward
// in the order they were served (the most recent maxOutcomeSeries): an
// interaction's reward is its own step rewards' mean, else its session's
// outcome rewards' mean.
//
// Version "" is the deployment's base model, before any trained version
// serves: the interactions no version of the deployment answered, under
// whatever name the engine gave its model (a deployment's first release
// compares its candidate with them).
func OutcomeSeries(ctx context.Context, db DBTX, deployment, version string, artefacts *string, since time.Time) (VersionOutcomes, []float64, error) {
	var o VersionOutcomes
	servedBy := "i.model_version = $2"
	if version == "" {
		servedBy = "($2 = '' AND left(i.model_version, length($1) + 1) <> ($1 || '@'))"
	}
	rows, err := db.Query(ctx, `
WITH inter AS (
    SELECT i.id, i.tenant_id, i.session_id, i.status, i.created_at FROM interactions i
    WHERE i.deployment = $1 AND `+servedBy+` AND i.created_at >= $3
      AND ($5::text IS NULL OR coalesce(i.request->>'artefacts', '') = $5)
), scored AS (
    SELECT inter.id, inter.status, inter.created_at, COALESCE(
        (SELECT avg(w.value) FROM rewards w WHERE w.interaction_id = inter.id),
        (SELECT avg(w.value) FROM rewards w
         WHERE w.tenant_id = inter.tenant_id AND w.session_id = inter.session_id AND w.interaction_id IS NULL)) AS reward
    FROM inter
), recent AS (
    SELECT id, created_at, reward FROM scored WHERE reward IS NOT NULL ORDER BY created_at DESC, id DESC LIMIT $4
)
SELECT (SELECT count(*) FROM scored), (SELECT count(*) FILTER (WHERE status <> 'ok') FROM scored),
       (SELECT count(*) FROM scored WHERE reward IS NOT NULL),
       COALESCE((SELECT array_agg(reward ORDER BY created_at, id) FROM recent), '{}')`,
		deployment, version, since, maxOutcomeSeries, artefacts)
	if err != nil {
		return o, nil, fmt.Errorf("outcomes of %s since %s: %w", version, since.Format(time.RFC3339), err)
	}
	defer rows.Close()
	var series []float64
	for rows.Next() {
		if err := rows.Scan(&o.Interactions, &o.Errors, &o.Rewarded, &series); err != nil {
			return o, nil, fmt.Errorf("outcomes of %s: %w", version, err)
		}
	}
	if err := rows.Err(); err != nil {
		return o, nil, fmt.Errorf("outcomes of %s: %w", version, err)
	}
	if n := len(series); n > 0 {
		var sum, ss float64
		for _, v := range series {
			sum += v
		}
		o.MeanReward = sum / float64(n)
		for _, v := range series {
			ss += (v - o.MeanReward) * (v - o.MeanReward)
		}
		if n > 1 {
			o.StdReward = math.Sqrt(ss / float64(n-1))
		}
	}
	return o, series, nil
}

// RecordedPrompt is a past interaction's request for replay.
type RecordedPrompt struct {
	InteractionID int64
	Request       []byte
	Response      []byte
	Status        string
	// Reward is the interaction's reward (step mean, else session outcome).
	Reward *float64
}

// RecentPrompts lists up to limit recent ok interactions of the deployment
// since t, newest first; rewardedOnly keeps those with a reward.
func RecentPrompts(ctx context.Context, db DBTX, deployment string, since time.Time, limit int, rewardedOnly bool) ([]RecordedPrompt, error) {
	rows, err := db.Query(ctx, `
SELECT i.id, i.request, COALESCE(i.response, 'null'::jsonb), i.status, r.reward,
       coalesce(i.prefix_id, 0), i.prefix_messages, i.prefix_tokens,
       coalesce(i.prompt_token_ids, '{}'), coalesce(i.completion_token_ids, '{}')
FROM interactions i
CROSS JOIN LATERAL (SELECT COALESCE(
    (SELECT avg(w.value) FROM rewards w WHERE w.interaction_id = i.id),
    (SELECT avg(w.value) FROM rewards w
     WHERE w.tenant_id = i.tenant_id AND w.session_id = i.session_id AND w.interaction_id IS NULL)) AS reward) r
WHERE i.deployment = $1 AND i.created_at >= $2 AND (NOT $4 OR r.reward IS NOT NULL)
ORDER BY i.created_at DESC, i.id DESC
LIMIT $3`, deployment, since, limit, rewardedOnly)
	if err != nil {
		return nil, fmt.Errorf("recent prompts of %s: %w", deployment, err)
	}
	var turns []turn
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RecordedPrompt, error) {
		var p RecordedPrompt
		t := turn{prompt: new([]int32), completion: new([]int32)}
		err := r.Scan(&p.InteractionID, &p.Request, &p.Response, &p.Status, &p.Reward,
			&t.prefix.ID, &t.prefix.Messages, &t.prefix.Tokens, t.prompt, t.completion)
		turns = append(turns, t)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("recent prompts of %s: %w", deployment, err)
	}
	for k := range out {
		turns[k].id, turns[k].request, turns[k].response = out[k].InteractionID, &out[k].Request, &out[k].Response
	}
	if err := expand(ctx, db, turns); err != nil {
		return nil, fmt.Errorf("recent prompts of %s: %w", deployment, err)
	}
	return out, nil
}

// Checkpoints are the checkpoint paths of the named versions of a
// deployment; a version with none (a base model) is left out.
func Checkpoints(ctx context.Context, db DBTX, deployment string, versions []string) (map[string]string, error) {
	rows, err := db.Query(ctx, `SELECT id, checkpoint_path FROM model_versions
		WHERE deployment = $1 AND id = ANY($2) AND checkpoint_path <> ''`, deployment, versions)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for rows.Next() {
		var id, path string
		if err := rows.Scan(&id, &path); err != nil {
			rows.Close()
			return nil, err
		}
		out[id] = path
	}
	return out, rows.Err()
}
