package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/jackc/pgx/v5"
)

// ErrExists is returned when creating something that already exists.
var ErrExists = errors.New("already exists")

const deploymentColumns = `name, backend, config, coalesce(serving_version, ''), created_at, updated_at`

func scanDeployment(row pgx.Row) (deployment.Deployment, error) {
	var d deployment.Deployment
	err := row.Scan(&d.Name, &d.Backend, &d.Config, &d.ServingVersion, &d.CreatedAt, &d.UpdatedAt)
	return d, err
}

// CreateUpstreamDeployment registers an upstream deployment; a name that
// exists is ErrExists.
func CreateUpstreamDeployment(ctx context.Context, db DBTX, name string, cfg deployment.Settings) (deployment.Deployment, error) {
	if err := deployment.ValidName(name); err != nil {
		return deployment.Deployment{}, err
	}
	if err := cfg.Validate(); err != nil {
		return deployment.Deployment{}, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return deployment.Deployment{}, err
	}
	d, err := scanDeployment(db.QueryRow(ctx, `INSERT INTO deployments (name, backend, config) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO NOTHING RETURNING `+deploymentColumns, name, deployment.BackendUpstream, raw))
	if errors.Is(err, pgx.ErrNoRows) {
		return deployment.Deployment{}, fmt.Errorf("deployment %s: %w", name, ErrExists)
	}
	if err != nil {
		return deployment.Deployment{}, fmt.Errorf("create deployment %s: %w", name, err)
	}
	return d, nil
}

// UpdateUpstreamDeployment replaces an upstream deployment's config; its
// versions, releases and artefacts stay.
func UpdateUpstreamDeployment(ctx context.Context, db DBTX, name string, cfg deployment.Settings) (deployment.Deployment, error) {
	if err := cfg.Validate(); err != nil {
		return deployment.Deployment{}, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return deployment.Deployment{}, err
	}
	d, err := scanDeployment(db.QueryRow(ctx, `UPDATE deployments SET config = $3, updated_at = now()
		WHERE name = $1 AND backend = $2 RETURNING `+deploymentColumns, name, deployment.BackendUpstream, raw))
	if errors.Is(err, pgx.ErrNoRows) {
		if _, gerr := GetDeployment(ctx, db, name); gerr == nil {
			return deployment.Deployment{}, fmt.Errorf("deployment %s: %w", name, deployment.ErrNotUpstream)
		}
		return deployment.Deployment{}, ErrNotFound
	}
	if err != nil {
		return deployment.Deployment{}, fmt.Errorf("update deployment %s: %w", name, err)
	}
	return d, nil
}

// RegisterUpstream records a gateway's configured upstream model as a
// deployment, so it gets the artefacts, canary, gates and status every
// deployment has; a row that exists (registered before, or through the
// admin API) is left as it is. It reports whether the row is new.
func RegisterUpstream(ctx context.Context, db DBTX, name string, cfg deployment.Settings) (bool, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return false, err
	}
	tag, err := db.Exec(ctx, `INSERT INTO deployments (name, backend, config) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO NOTHING`, name, deployment.BackendUpstream, raw)
	if err != nil {
		return false, fmt.Errorf("register deployment %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// GetDeployment reads one deployment, or ErrNotFound.
func GetDeployment(ctx context.Context, db DBTX, name string) (deployment.Deployment, error) {
	d, err := scanDeployment(db.QueryRow(ctx, `SELECT `+deploymentColumns+` FROM deployments WHERE name = $1`, name))
	return d, notFound(err)
}

// ListDeployments lists every deployment by name.
func ListDeployments(ctx context.Context, db DBTX) ([]deployment.Deployment, error) {
	rows, err := db.Query(ctx, `SELECT `+deploymentColumns+` FROM deployments ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deployment.Deployment, error) { return scanDeployment(r) })
	if err != nil {
		return nil, fmt.Errorf("list deployments: %w", err)
	}
	return ds, nil
}

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
