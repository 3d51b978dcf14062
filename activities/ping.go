// Package activities holds Flywheel's Temporal activities. Dependencies
// arrive through struct receivers; activities keep no state between calls
// beyond them. Permanent faults are non-retryable application errors.
package activities

import (
	"context"
	"fmt"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

// Ping answers workflows.PingWorkflow.
type Ping struct {
	DB store.DBTX
	// Worker and Compute describe this worker process.
	Worker, Compute string
}

// Ping reads the database version, proving the worker reaches Postgres.
func (p *Ping) Ping(ctx context.Context, in flow.PingInput) (flow.PingOutput, error) {
	var version string
	if err := p.DB.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return flow.PingOutput{}, fmt.Errorf("read postgres version: %w", err)
	}
	return flow.PingOutput{Note: in.Note, Postgres: version, Worker: p.Worker, Compute: p.Compute}, nil
}
