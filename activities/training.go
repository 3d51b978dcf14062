package activities

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

const (
	msgBatchClaimed    = "training batch claimed"
	msgStepTrained     = "train step committed"
	msgBaseStatePruned = "the step's base version has no training state left; it starts from the newest version that has one"
)

// Training implements the control plane's side of TrainingWorkflow: it
// checks and claims batches, prepares them as the trainer protocol's batch
// files, and registers what the deployment's trainer trained. It holds no
// weights; the train step itself (TrainBatch) is the trainer's.
type Training struct {
	DB *pgxpool.Pool
	// CheckpointDir is where trainers write each deployment's versions,
	// <deployment>/<version>, and where a checkpoint of forgotten data may
	// be deleted from.
	CheckpointDir string
	// BatchDir receives the trainer protocol's batch files,
	// <deployment>/run-NNNNNNNNNNNN.parquet, until their step commits.
	BatchDir string
	Logger   *slog.Logger
}

// CheckBatch reports the deployment's queue.
func (t *Training) CheckBatch(ctx context.Context, in flow.CheckBatchInput) (flow.CheckBatchOutput, error) {
	eta := -1 // inputs recorded before FreshOnly existed count every sample
	if in.FreshOnly {
		eta = in.MaxStaleness
	}
	n, age, err := store.FreshQueueStats(ctx, t.DB, in.Deployment, eta, in.GroupWait)
	if err != nil {
		return flow.CheckBatchOutput{}, err
	}
	return flow.CheckBatchOutput{Queued: n, OldestAge: age}, nil
}

// ClaimBatch drops stale samples and claims a batch (idempotent by key).
func (t *Training) ClaimBatch(ctx context.Context, in flow.ClaimBatchInput) (flow.ClaimBatchOutput, error) {
	if in.RunKey == "" || in.BatchSize <= 0 {
		return flow.ClaimBatchOutput{}, temporal.NewNonRetryableApplicationError("claim batch: run key and a positive batch size are required", "BadInput", nil)
	}
	run, err := store.ClaimBatch(ctx, t.DB, in.Deployment, in.RunKey, in.BatchSize, in.MaxStaleness, in.GroupWait)
	if err != nil {
		return flow.ClaimBatchOutput{}, err
	}
	t.logger().Info(msgBatchClaimed, "deployment", in.Deployment, "run_id", run.ID, "samples", len(run.SampleIDs), "dropped_stale", run.Dropped)
	return flow.ClaimBatchOutput{RunID: run.ID, Samples: len(run.SampleIDs), DroppedStale: run.Dropped, BaseVersion: run.BaseVersion}, nil
}

// FailTrainingRun closes a run whose step failed; its samples stay queued.
func (t *Training) FailTrainingRun(ctx context.Context, in flow.FailTrainingRunInput) error {
	return store.FailRun(ctx, t.DB, in.RunID, in.Reason)
}

func (t *Training) logger() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}
