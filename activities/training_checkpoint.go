package activities

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

// RegisterCheckpoint records a trained checkpoint as the run's candidate
// version, with its lineage: the base it trained from and every sample in
// its batch. A sample forgotten while the step trained fails the run
// instead: those weights hold data that must not serve. Registering a run
// again is a no-op.
func (t *Training) RegisterCheckpoint(ctx context.Context, in flow.RegisterCheckpointInput) (flow.TrainStepOutput, error) {
	run, samples, err := store.LoadRun(ctx, t.DB, in.RunID)
	if errors.Is(err, store.ErrNotFound) {
		return flow.TrainStepOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	if err != nil {
		return flow.TrainStepOutput{}, err
	}
	if run.Status == "trained" && run.VersionID != nil {
		return flow.TrainStepOutput{Version: *run.VersionID, Loss: in.Trained.Loss, Samples: in.Trained.Samples}, nil
	}
	fail := func(msg string) error {
		_ = store.FailRun(ctx, t.DB, run.ID, msg)
		return temporal.NewNonRetryableApplicationError("register checkpoint: "+msg, "BadData", nil)
	}
	p := run.Prepared
	if p == nil {
		return flow.TrainStepOutput{}, fail("the run's batch was never prepared")
	}
	if in.Trained.Version != p.Candidate {
		return flow.TrainStepOutput{}, fail(fmt.Sprintf("the trainer answered version %q; the run's candidate is %q", in.Trained.Version, p.Candidate))
	}
	byID := make(map[int64]store.RunSample, len(samples))
	for _, s := range samples {
		byID[s.ID] = s
	}
	checkpoint, err := localPath(in.Trained.Checkpoint.URI)
	if err != nil {
		return flow.TrainStepOutput{}, fail("checkpoint: " + err.Error())
	}
	trained := make([]store.RunSample, 0, len(p.Samples))
	for _, id := range p.Samples {
		s, ok := byID[id]
		if !ok || s.Status == "retired" {
			// Those weights hold forgotten data: they must not stay
			// where a route could name them.
			t.removeCheckpoint(checkpoint)
			return flow.TrainStepOutput{}, fail(fmt.Sprintf("sample %d was forgotten while it trained; its checkpoint is deleted", id))
		}
		trained = append(trained, s)
	}
	metrics := map[string]any{
		"loss": in.Trained.Loss, "samples": in.Trained.Samples, "trainer_dropped_stale": in.Trained.DroppedStale,
		"trained_tokens": in.Trained.TrainedTokens, "training_run": run.ID, "resumed": in.Trained.Resumed,
		"parent_version": p.Base, "checkpoint_format": in.Trained.Checkpoint.Format,
		"icepop_masked": in.Trained.IcePopMasked, "kpop_masked": in.Trained.KPopMasked,
	}
	for k, v := range p.Stats {
		metrics[k] = v
	}
	for k, v := range in.Trained.Metrics {
		metrics[k] = v
	}
	err = store.CommitTrainedRun(ctx, t.DB, store.TrainedRun{
		RunID: run.ID, Deployment: in.Deployment, Version: p.Candidate, Parent: p.Base, Checkpoint: checkpoint,
		Metrics: metrics, Samples: trained, Baselines: p.Baselines, BaselineObs: p.Observed, Flat: p.Flat,
	})
	if err != nil {
		return flow.TrainStepOutput{}, err
	}
	_ = os.Remove(t.batchPath(in.Deployment, run.ID)) // trained: the batch is in the lineage now
	groups, _ := p.Stats["groups"].(float64)
	baseline, _ := p.Stats["baseline_samples"].(float64)
	t.logger().Info(msgStepTrained, "deployment", in.Deployment, "run_id", run.ID, "version", p.Candidate, "loss", in.Trained.Loss,
		"samples", in.Trained.Samples, "baseline_samples", int(baseline))
	return flow.TrainStepOutput{Version: p.Candidate, Loss: in.Trained.Loss, Samples: in.Trained.Samples, Groups: int(groups),
		Baseline: int(baseline), Stale: in.Trained.DroppedStale, IcePopMasked: in.Trained.IcePopMasked, KPopMasked: in.Trained.KPopMasked}, nil
}

// removeCheckpoint deletes a checkpoint the step wrote, if it lies under
// this control plane's checkpoint directory (never a path elsewhere).
func (t *Training) removeCheckpoint(path string) {
	root := filepath.Clean(t.CheckpointDir)
	if t.CheckpointDir == "" || !strings.HasPrefix(filepath.Clean(path), root+string(os.PathSeparator)) {
		t.logger().Warn("checkpoint of forgotten data left in place: not under the checkpoint directory", "path", path)
		return
	}
	if err := os.RemoveAll(path); err != nil {
		t.logger().Warn("checkpoint of forgotten data not deleted", "path", path, "err", err)
	}
}
