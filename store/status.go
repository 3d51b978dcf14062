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

// The status view: what the control plane did with a deployment and what a
// tenant's own traffic looks like on it. Deployments are shared between
// tenants, so LoadStatus shows a tenant a deployment only once it has a
// session on it; sessions, the curve and per-tenant counts are filtered by
// tenant, and nothing another tenant wrote (prompts, answers, tool output)
// appears.

// The status view's types are the wire format of GET /v1/status; they live
// in statusapi so that clients of the HTTP API need not import the store.
type (
	Status            = statusapi.Status
	DeploymentStatus  = statusapi.DeploymentStatus
	CanaryStatus      = statusapi.CanaryStatus
	VersionStatus     = statusapi.VersionStatus
	ReleaseStatus     = statusapi.ReleaseStatus
	GateStatus        = statusapi.GateStatus
	DecisionStatus    = statusapi.DecisionStatus
	TrainingRunStatus = statusapi.TrainingRunStatus
	SessionSummary    = statusapi.SessionSummary
	Curve             = statusapi.Curve
	CurvePoint        = statusapi.CurvePoint
	AnchorStatus      = statusapi.AnchorStatus
	WatchdogCheck     = statusapi.WatchdogCheck
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

// StatusQuery selects what LoadStatus reads.
type StatusQuery struct {
	TenantID string
	// Deployment names one deployment; "" means all of the tenant's.
	Deployment string
	// CurveSince bounds the curve; zero: the last 24 hours.
	CurveSince time.Time
	// Limit caps each list (versions, releases, decisions, runs,
	// sessions); 0: 20.
	Limit int
	// Now stamps GeneratedAt; zero: time.Now.
	Now time.Time
}

// curveBuckets is about how many buckets the curve spans, whatever its
// length; bucketSteps are the widths it picks from.
const curveBuckets = 60

var bucketSteps = []time.Duration{
	10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 3 * time.Hour,
	6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// BucketFor picks the smallest step that covers span in about
// curveBuckets buckets.
func BucketFor(span time.Duration) time.Duration {
	for _, s := range bucketSteps {
		if span <= s*curveBuckets {
			return s
		}
	}
	return bucketSteps[len(bucketSteps)-1]
}

// LoadStatus reads the tenant's status. A named deployment the tenant has
// no session on is ErrNotFound, whether or not it exists.
func LoadStatus(ctx context.Context, db DBTX, q StatusQuery) (*Status, error) {
	if q.Limit <= 0 {
		q.Limit = 20
	}
	if q.Now.IsZero() {
		q.Now = time.Now()
	}
	if q.CurveSince.IsZero() {
		q.CurveSince = q.Now.Add(-24 * time.Hour)
	}
	names, err := tenantDeployments(ctx, db, q.TenantID, q.Deployment)
	if err != nil {
		return nil, err
	}
	if q.Deployment != "" && len(names) == 0 {
		return nil, fmt.Errorf("status of %q: %w", q.Deployment, ErrNotFound)
	}
	st := &Status{Tenant: q.TenantID, GeneratedAt: q.Now.UTC(), Deployments: []DeploymentStatus{}}
	for _, name := range names {
		d, err := deploymentStatus(ctx, db, q, name)
		if err != nil {
			return nil, err
		}
		st.Deployments = append(st.Deployments, d)
	}
	return st, nil
}

// tenantDeployments lists the deployments the tenant has sessions on (only
// the one named, when one is).
func tenantDeployments(ctx context.Context, db DBTX, tenantID, only string) ([]string, error) {
	rows, err := db.Query(ctx, `SELECT DISTINCT deployment FROM sessions
WHERE tenant_id = $1 AND deployment <> '' AND ($2 = '' OR deployment = $2) ORDER BY deployment`, tenantID, only)
	if err != nil {
		return nil, fmt.Errorf("list deployments of tenant %s: %w", tenantID, err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func deploymentStatus(ctx context.Context, db DBTX, q StatusQuery, name string) (DeploymentStatus, error) {
	d := DeploymentStatus{Name: name}
	err := db.QueryRow(ctx, `SELECT backend, coalesce(serving_version, '') FROM deployments WHERE name = $1`, name).
		Scan(&d.Backend, &d.ServingVersion)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("status of %s: %w", name, err)
	}
	steps := []func() error{
		func() (err error) { d.Canary, err = canaryOf(ctx, db, name); return },
		func() (err error) { d.Versions, err = versionsOf(ctx, db, q, name, d.ServingVersion, d.Canary); return },
		func() (err error) { d.Releases, err = releasesOf(ctx, db, name, q.Limit); return },
		func() (err error) { d.ReleaseCounts, err = releaseCountsOf(ctx, db, name); return },
		func() (err error) { d.Decisions, err = decisionsOf(ctx, db, name, q.TenantID, q.Limit); return },
		func() (err error) { d.TrainingRuns, err = trainingRunsOf(ctx, db, q, name); return },
		func() (err error) { d.TrainingCounts, err = trainingCountsOf(ctx, db, name); return },
		func() (err error) { d.Anchor, err = AnchorOf(ctx, db, name); return },
		func() (err error) { d.Watchdog, err = WatchdogChecks(ctx, db, name, q.Limit); return },
		func() (err error) { d.Sessions, err = sessionsOf(ctx, db, q, name); return },
		func() (err error) { d.Curve, err = curveOf(ctx, db, q, name); return },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return d, fmt.Errorf("status of %s: %w", name, err)
		}
	}
	return d, nil
}

func canaryOf(ctx context.Context, db DBTX, deployment string) (*CanaryStatus, error) {
	var c CanaryStatus
	err := db.QueryRow(ctx, `SELECT id, candidate, baseline, phase, canary_share FROM releases
WHERE deployment = $1 AND layer = 'weights' AND status = 'running' ORDER BY started_at DESC, id DESC LIMIT 1`, deployment).
		Scan(&c.ReleaseID, &c.Candidate, &c.Baseline, &c.Phase, &c.Share)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("running release: %w", err)
	}
	return &c, nil
}

func versionsOf(ctx context.Context, db DBTX, q StatusQuery, deployment, serving string, canary *CanaryStatus) ([]VersionStatus, error) {
	rows, err := db.Query(ctx, `
SELECT v.id, coalesce(v.parent_version, ''), v.status, v.metrics, v.retired_reason, v.created_at,
       (SELECT count(*) FROM model_version_lineage l WHERE l.version_id = v.id),
       (SELECT count(DISTINCT l.session_id) FROM model_version_lineage l WHERE l.version_id = v.id AND l.tenant_id = $2)
FROM model_versions v WHERE v.deployment = $1
ORDER BY v.created_at DESC, v.id DESC LIMIT $3`, deployment, q.TenantID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("versions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (VersionStatus, error) {
		var v VersionStatus
		var metrics []byte
		err := r.Scan(&v.ID, &v.Parent, &v.Status, &metrics, &v.RetiredReason, &v.CreatedAt, &v.TrainedSamples, &v.TenantSessions)
		v.Metrics = jsonObject(metrics)
		v.Serving = v.ID == serving
		v.Canary = canary != nil && canary.Share > 0 && canary.Candidate == v.ID
		return v, err
	})
}

func releasesOf(ctx context.Context, db DBTX, deployment string, limit int) ([]ReleaseStatus, error) {
	rel, err := ListReleases(ctx, db, deployment, limit)
	if err != nil {
		return nil, err
	}
	out := make([]ReleaseStatus, len(rel))
	ids := make([]int64, len(rel))
	byID := make(map[int64]*ReleaseStatus, len(rel))
	for i, r := range rel {
		out[i] = ReleaseStatus{ID: r.ID, Layer: r.Layer, Candidate: r.Candidate, Baseline: r.Baseline, Status: r.Status,
			Phase: r.Phase, CanaryShare: r.CanaryShare, Reason: r.Reason, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
			Gates: []GateStatus{}}
		ids[i] = r.ID
		byID[r.ID] = &out[i]
	}
	rows, err := db.Query(ctx, `SELECT release_id, gate, passed, metrics, created_at FROM gate_results
WHERE release_id = ANY($1) ORDER BY release_id, id`, ids)
	if err != nil {
		return nil, fmt.Errorf("gates: %w", err)
	}
	var id int64
	var g GateStatus
	var metrics []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &g.Gate, &g.Passed, &metrics, &g.CreatedAt}, func() error {
		g.Metrics = jsonObject(metrics)
		r := byID[id]
		r.Gates = append(r.Gates, g)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("gates: %w", err)
	}
	return out, nil
}

func releaseCountsOf(ctx context.Context, db DBTX, deployment string) (map[string]map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT layer, status, count(*) FROM releases WHERE deployment = $1 GROUP BY 1, 2`, deployment)
	if err != nil {
		return nil, fmt.Errorf("count releases: %w", err)
	}
	out := map[string]map[string]int{}
	var layer, status string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&layer, &status, &n}, func() error {
		if out[layer] == nil {
			out[layer] = map[string]int{}
		}
		out[layer][status] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("count releases: %w", err)
	}
	return out, nil
}

func trainingCountsOf(ctx context.Context, db DBTX, deployment string) (map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT status, count(*) FROM training_runs WHERE deployment = $1 GROUP BY 1`, deployment)
	if err != nil {
		return nil, fmt.Errorf("count training runs: %w", err)
	}
	out := map[string]int{}
	var status string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&status, &n}, func() error { out[status] = n; return nil }); err != nil {
		return nil, fmt.Errorf("count training runs: %w", err)
	}
	return out, nil
}

func decisionsOf(ctx context.Context, db DBTX, deployment, tenantID string, limit int) ([]DecisionStatus, error) {
	rows, err := ListDecisions(ctx, db, deployment, limit)
	if err != nil {
		return nil, err
	}
	out := make([]DecisionStatus, len(rows))
	for i, r := range rows {
		ev, theirs, err := scrubEvidence(r.Evidence, tenantID)
		if err != nil {
			return nil, fmt.Errorf("decision %d: %w", r.ID, err)
		}
		reason := r.Reason
		if theirs {
			reason = "a tool of another tenant failed often: its description changes for that tenant only"
		}
		out[i] = DecisionStatus{ID: r.ID, Decision: r.Decision, Reason: reason, Evidence: ev, CreatedAt: r.CreatedAt}
	}
	return out, nil
}

// jsonObject decodes a jsonb metrics column for display. Writers store any
// JSON there (a null, or an array where `stats || null` appended one), so
// what is not an object shows as empty instead of failing the whole view.
func jsonObject(raw []byte) map[string]any {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return map[string]any{}
	}
	return m
}

// scrubEvidence keeps, of a decision's evidence, what the tenant may see:
// the deployment's decisions are shown to every tenant that uses it, and
// tool failure clusters are one tenant's tool names and results. Other
// tenants' clusters (and clusters of no tenant, recorded before clusters
// were per tenant) go; theirs reports a decision about another tenant's
// tool, whose target goes too.
func scrubEvidence(raw json.RawMessage, tenantID string) (json.RawMessage, bool, error) {
	if len(raw) == 0 {
		return json.RawMessage(`{}`), false, nil
	}
	var ev map[string]any
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, false, fmt.Errorf("decode evidence: %w", err)
	}
	if tools, ok := ev["tool_failures"].([]any); ok {
		mine := []any{}
		for _, t := range tools {
			if m, ok := t.(map[string]any); ok && m["tenant"] == tenantID {
				mine = append(mine, m)
			}
		}
		ev["tool_failures"] = mine
	}
	theirs := false
	if t, ok := ev["tenant"].(string); ok && t != tenantID {
		theirs = true
		delete(ev, "target")
		delete(ev, "tenant")
	}
	out, err := json.Marshal(ev)
	if err != nil {
		return nil, false, fmt.Errorf("encode evidence: %w", err)
	}
	return out, theirs, nil
}

func trainingRunsOf(ctx context.Context, db DBTX, q StatusQuery, deployment string) ([]TrainingRunStatus, error) {
	rows, err := db.Query(ctx, `
SELECT r.id, r.status, coalesce(r.version_id, ''), cardinality(r.sample_ids),
       (SELECT count(*) FROM training_samples ts WHERE ts.id = ANY(r.sample_ids) AND ts.tenant_id = $2),
       r.stats, r.created_at, r.finished_at
FROM training_runs r WHERE r.deployment = $1
ORDER BY r.created_at DESC, r.id DESC LIMIT $3`, deployment, q.TenantID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("training runs: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (TrainingRunStatus, error) {
		var t TrainingRunStatus
		var stats []byte
		err := r.Scan(&t.ID, &t.Status, &t.Version, &t.Samples, &t.TenantSamples, &stats, &t.CreatedAt, &t.FinishedAt)
		t.Stats = jsonObject(stats)
		return t, err
	})
}

// sessionsOf lists the tenant's latest sessions on the deployment with
// whether they trained and, if not, why.
func sessionsOf(ctx context.Context, db DBTX, q StatusQuery, deployment string) ([]SessionSummary, error) {
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
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (SessionSummary, error) {
		var s SessionSummary
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
func trainingReason(s SessionSummary, queued, stale, retired int, assembled bool, ineligible string) string {
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

// curveOf buckets the tenant's rewarded interactions on the deployment
// since q.CurveSince. An interaction's reward is its own step rewards'
// mean, else its session's outcome rewards' mean, as the canary gate
// scores versions.
func curveOf(ctx context.Context, db DBTX, q StatusQuery, deployment string) (Curve, error) {
	var first, last *time.Time
	err := db.QueryRow(ctx, `SELECT min(created_at), max(created_at) FROM interactions
WHERE tenant_id = $1 AND deployment = $2 AND created_at >= $3`, q.TenantID, deployment, q.CurveSince).Scan(&first, &last)
	if err != nil {
		return Curve{}, fmt.Errorf("curve span: %w", err)
	}
	c := Curve{Points: []CurvePoint{}}
	if first == nil {
		c.BucketSeconds = int(bucketSteps[0].Seconds())
		return c, nil
	}
	bucket := BucketFor(last.Sub(*first))
	c.BucketSeconds = int(bucket.Seconds())
	// Joins over the window's rewards rather than two lookups per
	// interaction: BenchmarkLoadStatus (6,000 steps) reads the whole view
	// in about 15 ms instead of 55.
	rows, err := db.Query(ctx, `
WITH inter AS (
    SELECT i.id, i.session_id, i.created_at, i.model_version FROM interactions i
    WHERE i.tenant_id = $1 AND i.deployment = $2 AND i.created_at >= $3
), step AS (
    SELECT w.interaction_id, avg(w.value) AS v FROM rewards w JOIN inter ON inter.id = w.interaction_id
    GROUP BY w.interaction_id
), outcome AS (
    SELECT w.session_id, avg(w.value) AS v FROM rewards w
    WHERE w.tenant_id = $1 AND w.interaction_id IS NULL AND w.session_id IN (SELECT session_id FROM inter)
    GROUP BY w.session_id
)
SELECT floor(extract(epoch FROM inter.created_at) / $4)::bigint, inter.model_version, count(*), avg(coalesce(step.v, outcome.v))
FROM inter LEFT JOIN step ON step.interaction_id = inter.id LEFT JOIN outcome ON outcome.session_id = inter.session_id
WHERE coalesce(step.v, outcome.v) IS NOT NULL
GROUP BY 1, 2 ORDER BY 1, 2`, q.TenantID, deployment, q.CurveSince, c.BucketSeconds)
	if err != nil {
		return c, fmt.Errorf("curve: %w", err)
	}
	var b int64
	var p CurvePoint
	_, err = pgx.ForEachRow(rows, []any{&b, &p.Version, &p.Rewarded, &p.MeanReward}, func() error {
		p.Start = time.Unix(b*int64(c.BucketSeconds), 0).UTC()
		c.Points = append(c.Points, p)
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("curve: %w", err)
	}
	return c, nil
}
