package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
)

const (
	msgBatchClaimed = "training batch claimed"
	msgStepTrained  = "train step committed"
	msgTrainerReset = "trainer reset to a stored version"
)

// TrainStepper is the part of the trainer a train step needs;
// *trainer.Local implements it.
type TrainStepper interface {
	TrainStep(ctx context.Context, b *trainer.Batch) (trainer.StepResult, error)
	Snapshot() *trainer.Model
	Version() int64
	// Reset makes a stored version's weights the ones training goes on
	// from (after a rollback: the serving version's).
	Reset(m *trainer.Model, version int64) error
}

// Training implements TrainingWorkflow's activities. CheckBatch and
// ClaimBatch run anywhere; TrainStep runs on trainer workers, which hold the
// weights.
type Training struct {
	DB *pgxpool.Pool
	// Trainer is nil on workers without weights.
	Trainer TrainStepper
	// Deployment is the one whose weights Trainer holds; a step for any
	// other deployment is refused ("": no check).
	Deployment string
	// CheckpointDir receives <deployment>/vNNNNNNNNNNNN.safetensors.
	CheckpointDir string
	// BatchDir receives the trainer protocol's batch files,
	// <deployment>/run-NNNNNNNNNNNN.parquet, until their step commits.
	BatchDir string
	// Advantage is how rewards become advantages: the trainer's own
	// estimator (Dr. GRPO's r − mean for the demo) and the rate of the
	// per-task running baseline of singleton samples. Default: the
	// trainer's defaults (GRPO's (r − mean)/std, rate 0.1).
	Advantage trainer.AdvantageConfig
	// HeartbeatEvery is how often a running step heartbeats. Default 10s,
	// and never slower than a third of the step's heartbeat timeout.
	HeartbeatEvery time.Duration
	Logger         *slog.Logger
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

// TrainStep is a whole step in one activity, which training workflows
// started before the trainer protocol still schedule: the protocol's three
// activities in turn, from the trainer's current weights.
func (t *Training) TrainStep(ctx context.Context, in flow.TrainStepInput) (flow.TrainStepOutput, error) {
	if t.Trainer == nil {
		return flow.TrainStepOutput{}, errors.New("train step: this worker has no trainer")
	}
	if err := t.refuseOther("train step", in.Deployment); err != nil {
		// The run ends failed (its samples stay queued), so it does not
		// stay claimed.
		if t.DB != nil {
			if ferr := store.FailRun(ctx, t.DB, in.RunID, err.Error()); ferr != nil {
				return flow.TrainStepOutput{}, ferr
			}
		}
		return flow.TrainStepOutput{}, err
	}
	run, _, err := store.LoadRun(ctx, t.DB, in.RunID)
	if err == nil && run.Status == "trained" && run.VersionID != nil {
		return flow.TrainStepOutput{Version: *run.VersionID}, nil
	}
	base := store.VersionID(in.Deployment, t.Trainer.Version())
	if run.Prepared != nil {
		base = run.Prepared.Base
	}
	tb, err := t.PrepareBatch(ctx, flow.PrepareBatchInput{Deployment: in.Deployment, RunID: in.RunID, Base: base,
		Algorithm: flow.TrainAlgorithm{Objective: trainer.ObjectiveGRPO, Masks: in.Masks}})
	if err != nil {
		return flow.TrainStepOutput{}, err
	}
	out, err := t.TrainBatch(ctx, tb)
	if err != nil {
		var appErr *temporal.ApplicationError
		if errors.As(err, &appErr) && appErr.NonRetryable() {
			_ = store.FailRun(ctx, t.DB, in.RunID, err.Error())
		}
		return flow.TrainStepOutput{}, err
	}
	return t.RegisterCheckpoint(ctx, flow.RegisterCheckpointInput{Deployment: in.Deployment, RunID: in.RunID, Trained: out})
}

// ResetTrainer makes the trainer go on from a stored version (the serving
// one, after its candidate was rolled back): the rejected candidate's
// descendants are not trained further. Idempotent.
func (t *Training) ResetTrainer(ctx context.Context, in flow.ResetTrainerInput) (flow.ResetTrainerOutput, error) {
	if t.Trainer == nil {
		return flow.ResetTrainerOutput{}, errors.New("reset trainer: this worker has no trainer")
	}
	if t.Deployment != "" && in.Deployment != t.Deployment {
		return flow.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("reset trainer: this worker trains %q, not %q", t.Deployment, in.Deployment), "WrongDeployment", nil)
	}
	v, ok := store.VersionNumber(in.Version)
	if !ok || t.CheckpointDir == "" {
		return flow.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("reset trainer: %q is not a stored version of %s", in.Version, in.Deployment), "BadInput", nil)
	}
	if t.Trainer.Version() == v {
		return flow.ResetTrainerOutput{Version: in.Version}, nil
	}
	m, _, _, err := trainer.LoadCheckpoint(t.checkpointPath(in.Deployment, v))
	if err != nil {
		return flow.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError("reset trainer: "+err.Error(), "BadInput", err)
	}
	if err := t.Trainer.Reset(m, v); err != nil {
		return flow.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	t.logger().Info(msgTrainerReset, "deployment", in.Deployment, "version", in.Version)
	return flow.ResetTrainerOutput{Version: in.Version}, nil
}

// checkpointPath follows trainer.CheckpointDir's layout, one directory per
// deployment, so a serving engine can load any version on demand.
func (t *Training) checkpointPath(deployment string, version int64) string {
	return trainer.CheckpointDir{Dir: filepath.Join(t.CheckpointDir, deployment)}.Path(version)
}

// refuseOther refuses a step for a deployment other than the one whose
// weights this worker holds: training its samples into these weights
// would also write its checkpoints under the wrong name.
func (t *Training) refuseOther(what, deployment string) error {
	if t.Deployment == "" || deployment == t.Deployment {
		return nil
	}
	return temporal.NewNonRetryableApplicationError(
		fmt.Sprintf("%s: this worker trains %q, not %q", what, t.Deployment, deployment), "WrongDeployment", nil)
}

func (t *Training) logger() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}
