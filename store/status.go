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

// The status view's types are statusapi's: the wire format of GET
// /v1/status, which clients of the HTTP API read without the store.

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

// LoadStatus reads the tenant's status. A named deployment the tenant has
// no session on is ErrNotFound, whether or not it exists.
func LoadStatus(ctx context.Context, db DBTX, q StatusQuery) (*statusapi.Status, error) {
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
	st := &statusapi.Status{Tenant: q.TenantID, GeneratedAt: q.Now.UTC(), Deployments: []statusapi.DeploymentStatus{}}
	for _, name := range names {
		d, err := deploymentStatus(ctx, db, q, name)
		if err != nil {
			return nil, err
		}
		st.Deployments = append(st.Deployments, d)
	}
	if st.Usage, err = TenantUsage(ctx, db, q.TenantID, q.Deployment, q.CurveSince); err != nil {
		return nil, err
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

func deploymentStatus(ctx context.Context, db DBTX, q StatusQuery, name string) (statusapi.DeploymentStatus, error) {
	d := statusapi.DeploymentStatus{Name: name}
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

func canaryOf(ctx context.Context, db DBTX, deployment string) (*statusapi.CanaryStatus, error) {
	var c statusapi.CanaryStatus
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

func versionsOf(ctx context.Context, db DBTX, q StatusQuery, deployment, serving string, canary *statusapi.CanaryStatus) ([]statusapi.VersionStatus, error) {
	rows, err := db.Query(ctx, `
SELECT v.id, coalesce(v.parent_version, ''), v.status, v.metrics, v.retired_reason, v.created_at,
       (SELECT count(*) FROM model_version_lineage l WHERE l.version_id = v.id),
       (SELECT count(DISTINCT l.session_id) FROM model_version_lineage l WHERE l.version_id = v.id AND l.tenant_id = $2)
FROM model_versions v WHERE v.deployment = $1
ORDER BY v.created_at DESC, v.id DESC LIMIT $3`, deployment, q.TenantID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("versions: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusapi.VersionStatus, error) {
		var v statusapi.VersionStatus
		var metrics []byte
		err := r.Scan(&v.ID, &v.Parent, &v.Status, &metrics, &v.RetiredReason, &v.CreatedAt, &v.TrainedSamples, &v.TenantSessions)
		v.Metrics = jsonObject(metrics)
		v.Serving = v.ID == serving
		v.Canary = canary != nil && canary.Share > 0 && canary.Candidate == v.ID
		return v, err
	})
}

func releasesOf(ctx context.Context, db DBTX, deployment string, limit int) ([]statusapi.ReleaseStatus, error) {
	rel, err := ListReleases(ctx, db, deployment, limit)
	if err != nil {
		return nil, err
	}
	out := make([]statusapi.ReleaseStatus, len(rel))
	ids := make([]int64, len(rel))
	byID := make(map[int64]*statusapi.ReleaseStatus, len(rel))
	for i, r := range rel {
		out[i] = statusapi.ReleaseStatus{ID: r.ID, Layer: r.Layer, Candidate: r.Candidate, Baseline: r.Baseline, Status: r.Status,
			Phase: r.Phase, CanaryShare: r.CanaryShare, Reason: r.Reason, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
			Gates: []statusapi.GateStatus{}}
		ids[i] = r.ID
		byID[r.ID] = &out[i]
	}
	rows, err := db.Query(ctx, `SELECT release_id, gate, passed, metrics, created_at FROM gate_results
WHERE release_id = ANY($1) ORDER BY release_id, id`, ids)
	if err != nil {
		return nil, fmt.Errorf("gates: %w", err)
	}
	var id int64
	var g statusapi.GateStatus
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

func trainingRunsOf(ctx context.Context, db DBTX, q StatusQuery, deployment string) ([]statusapi.TrainingRunStatus, error) {
	rows, err := db.Query(ctx, `
SELECT r.id, r.status, coalesce(r.version_id, ''), cardinality(r.sample_ids),
       (SELECT count(*) FROM training_samples ts WHERE ts.id = ANY(r.sample_ids) AND ts.tenant_id = $2),
       r.stats, r.created_at, r.finished_at
FROM training_runs r WHERE r.deployment = $1
ORDER BY r.created_at DESC, r.id DESC LIMIT $3`, deployment, q.TenantID, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("training runs: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusapi.TrainingRunStatus, error) {
		var t statusapi.TrainingRunStatus
		var stats []byte
		err := r.Scan(&t.ID, &t.Status, &t.Version, &t.Samples, &t.TenantSamples, &stats, &t.CreatedAt, &t.FinishedAt)
		t.Stats = jsonObject(stats)
		return t, err
	})
}
