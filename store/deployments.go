package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Route is how the gateway serves one deployment right now: its backend,
// the serving weights version, the running weights canary (if any) and the
// serving memory / harness artefacts to inject.
type Route struct {
	Deployment     string
	Backend        string
	Config         json.RawMessage
	ServingVersion string
	// CreatedAt is when the deployment was registered.
	CreatedAt time.Time
	// CanaryVersion receives CanaryShare of traffic while a weights
	// release is running.
	CanaryVersion string
	CanaryShare   float64
	// Artefacts are the serving playbook / harness / tool_schema contents
	// by kind.
	Artefacts map[string]Artefact
	// ArtefactCanary is the candidate of a running artefact release in its
	// canary phase: it serves Share of sessions in place of its kind's
	// serving version (nil: none).
	ArtefactCanary *ArtefactCanary
}

// ArtefactCanary is an artefact release's candidate on live traffic.
type ArtefactCanary struct {
	Kind  string
	Share float64
	Artefact
}

// Artefact is a serving memory or harness artefact.
type Artefact struct {
	ID      int64
	Version int
	Content json.RawMessage
}

// LoadRoutes reads every deployment with its running weights release, its
// artefact release in canary and its serving artefacts, in four small
// queries.
func LoadRoutes(ctx context.Context, db DBTX) (map[string]*Route, error) {
	routes := map[string]*Route{}
	rows, err := db.Query(ctx, `SELECT name, backend, config, coalesce(serving_version, ''), created_at FROM deployments`)
	if err != nil {
		return nil, fmt.Errorf("load deployments: %w", err)
	}
	for rows.Next() {
		r := &Route{Artefacts: map[string]Artefact{}}
		if err := rows.Scan(&r.Deployment, &r.Backend, &r.Config, &r.ServingVersion, &r.CreatedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan deployment: %w", err)
		}
		routes[r.Deployment] = r
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load deployments: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT DISTINCT ON (deployment) deployment, candidate, canary_share
		FROM releases WHERE layer = 'weights' AND status = 'running' AND canary_share > 0
		ORDER BY deployment, started_at DESC`)
	if err != nil {
		return nil, fmt.Errorf("load releases: %w", err)
	}
	for rows.Next() {
		var dep, cand string
		var share float64
		if err := rows.Scan(&dep, &cand, &share); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan release: %w", err)
		}
		if r, ok := routes[dep]; ok {
			r.CanaryVersion, r.CanaryShare = cand, share
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load releases: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT DISTINCT ON (r.deployment) r.deployment, a.kind, r.canary_share, a.id, a.version, a.content
		FROM releases r JOIN artefacts a ON a.deployment = r.deployment AND a.kind = r.layer AND a.version::text = r.candidate
		WHERE r.layer IN ('playbook', 'harness', 'tool_schema') AND r.status = 'running' AND r.canary_share > 0
		ORDER BY r.deployment, r.started_at DESC`)
	if err != nil {
		return nil, fmt.Errorf("load artefact canaries: %w", err)
	}
	for rows.Next() {
		var dep string
		var c ArtefactCanary
		if err := rows.Scan(&dep, &c.Kind, &c.Share, &c.ID, &c.Version, &c.Content); err != nil {
			rows.Close()
			return nil, fmt.Errorf("scan artefact canary: %w", err)
		}
		if r, ok := routes[dep]; ok {
			r.ArtefactCanary = &c
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load artefact canaries: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT DISTINCT ON (deployment, kind) deployment, kind, id, version, content
		FROM artefacts WHERE status = 'serving' AND kind IN ('playbook', 'harness', 'tool_schema')
		ORDER BY deployment, kind, version DESC`)
	if err != nil {
		return nil, fmt.Errorf("load artefacts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var dep, kind string
		var a Artefact
		if err := rows.Scan(&dep, &kind, &a.ID, &a.Version, &a.Content); err != nil {
			return nil, fmt.Errorf("scan artefact: %w", err)
		}
		if r, ok := routes[dep]; ok {
			r.Artefacts[kind] = a
		}
	}
	return routes, rows.Err()
}

// UpsertDeployment registers a deployment (idempotent; keeps the serving
// version when already set).
func UpsertDeployment(ctx context.Context, db DBTX, name, backend string, cfg json.RawMessage, servingVersion string) error {
	if len(cfg) == 0 {
		cfg = json.RawMessage(`{}`)
	}
	var sv *string
	if servingVersion != "" {
		sv = &servingVersion
	}
	_, err := db.Exec(ctx, `INSERT INTO deployments (name, backend, config, serving_version) VALUES ($1, $2, $3, $4)
		ON CONFLICT (name) DO UPDATE SET backend = EXCLUDED.backend, config = EXCLUDED.config,
		serving_version = coalesce(deployments.serving_version, EXCLUDED.serving_version), updated_at = now()`,
		name, backend, cfg, sv)
	if err != nil {
		return fmt.Errorf("upsert deployment %s: %w", name, err)
	}
	return nil
}
