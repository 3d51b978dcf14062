package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// watchdogKeep is how long checks are kept (one a minute is 1,440 a day).
const watchdogKeep = 7 * 24 * time.Hour

// RecordWatchdogCheck stores a check and drops the deployment's checks
// older than a week.
func RecordWatchdogCheck(ctx context.Context, db DBTX, c statusapi.WatchdogCheck) error {
	raw, err := json.Marshal(c.Metrics)
	if err != nil {
		return fmt.Errorf("record watchdog check: %w", err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO watchdog_checks (deployment, serving, anchor, verdict, reason, metrics, workflow_id) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		c.Deployment, c.Serving, c.Anchor, c.Verdict, c.Reason, raw, c.WorkflowID)
	b.Queue(`DELETE FROM watchdog_checks WHERE deployment = $1 AND created_at < now() - make_interval(secs => $2)`, c.Deployment, watchdogKeep.Seconds())
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("record watchdog check of %s: %w", c.Deployment, err)
	}
	return nil
}

// WatchdogChecks lists a deployment's recent checks, newest first.
func WatchdogChecks(ctx context.Context, db DBTX, deployment string, limit int) ([]statusapi.WatchdogCheck, error) {
	rows, err := db.Query(ctx, `SELECT id, deployment, serving, anchor, verdict, reason, metrics, workflow_id, created_at
FROM watchdog_checks WHERE deployment = $1 ORDER BY created_at DESC, id DESC LIMIT $2`, deployment, limit)
	if err != nil {
		return nil, fmt.Errorf("watchdog checks of %s: %w", deployment, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (statusapi.WatchdogCheck, error) {
		var c statusapi.WatchdogCheck
		err := r.Scan(&c.ID, &c.Deployment, &c.Serving, &c.Anchor, &c.Verdict, &c.Reason, &c.Metrics, &c.WorkflowID, &c.CreatedAt)
		return c, err
	})
}
