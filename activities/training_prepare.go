package activities

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

// PrepareBatch writes a claimed run as the Parquet batch of the trainer
// protocol: its live samples with advantages from the deployment's
// estimator and the stored per-task baselines. It reserves the run's
// candidate version and names the base checkpoint and where the new one
// goes. Preparing a run again writes the same batch for the same
// candidate.
func (t *Training) PrepareBatch(ctx context.Context, in flow.PrepareBatchInput) (flow.TrainBatchInput, error) {
	run, samples, err := store.LoadRun(ctx, t.DB, in.RunID)
	if errors.Is(err, store.ErrNotFound) {
		return flow.TrainBatchInput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	if err != nil {
		return flow.TrainBatchInput{}, err
	}
	if run.Deployment != in.Deployment {
		return flow.TrainBatchInput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("prepare batch: run %d belongs to %q, not %q", run.ID, run.Deployment, in.Deployment), "BadInput", nil)
	}
	var live []store.RunSample
	for _, s := range samples {
		if s.Status == "queued" { // retired (forgotten) samples never train
			live = append(live, s)
		}
	}
	if len(live) == 0 {
		_ = store.FailRun(ctx, t.DB, run.ID, "no queued samples left")
		return flow.TrainBatchInput{}, temporal.NewNonRetryableApplicationError("prepare batch: no queued samples left in the run", "BadData", nil)
	}
	baseModel, tokenizer, tr, err := trainerOf(ctx, t.DB, in.Deployment)
	if err != nil {
		return flow.TrainBatchInput{}, err
	}
	baselines, err := store.TaskBaselines(ctx, t.DB, in.Deployment)
	if err != nil {
		return flow.TrainBatchInput{}, err
	}
	rows := make([]parquetbatch.Row, len(live))
	batch := make([]trainer.Sample, len(live))
	tokens := 0
	for i, s := range live {
		rows[i] = rowOf(s)
		batch[i] = sampleOf(rows[i])
		batch[i].Advantage = nil // set next, by the estimator
		tokens += len(s.PromptTokenIDs) + len(s.CompletionTokenIDs)
	}
	var estimator trainer.AdvantageConfig // the trainer's defaults
	if a := tr.Advantage; a != nil {
		estimator = trainer.AdvantageConfig{Estimator: a.Estimator, BaselineRate: a.BaselineRate, PerfectAdvantage: a.PerfectAdvantage,
			NegativeWeight: a.NegativeWeight}
	}
	adv, err := formAdvantages(batch, estimator, baselines)
	if err != nil {
		_ = store.FailRun(ctx, t.DB, run.ID, err.Error())
		return flow.TrainBatchInput{}, temporal.NewNonRetryableApplicationError("prepare batch: "+err.Error(), "BadData", err)
	}
	for i := range rows {
		rows[i].Advantage = *batch[i].Advantage
	}
	stats := map[string]any{"groups": adv.Groups, "baseline_samples": adv.BaselineSamples, "zero_signal_groups": adv.ZeroSignalGroups, "perfect_groups": adv.PerfectGroups,
		"no_baseline_samples": adv.NoBaseline, "advantage_estimator": adv.Estimator}
	// A version whose training state was pruned (a person rolled back to
	// an old one) cannot be continued: the step starts from the newest
	// version that still has its state.
	baseVersion, err := store.TrainableBase(ctx, t.DB, in.Deployment, in.Base)
	if err != nil {
		return flow.TrainBatchInput{}, err
	}
	if baseVersion != in.Base {
		stats["base_state_pruned"] = in.Base
		t.logger().Warn(msgBaseStatePruned, "deployment", in.Deployment, "run_id", run.ID, "asked", in.Base, "base", baseVersion)
	}
	prep, err := store.PrepareRun(ctx, t.DB, run.ID, store.PreparedRun{
		Base: baseVersion, Baselines: adv.Baselines, Observed: adv.Observed, Flat: sampleIDs(live, adv.Flat),
		Samples: allIDs(live), Stats: stats,
	})
	if err != nil {
		return flow.TrainBatchInput{}, err
	}
	path := t.batchPath(in.Deployment, run.ID)
	if err := parquetbatch.Write(path, map[string]string{
		"flywheel.deployment": in.Deployment, "flywheel.run_id": strconv.FormatInt(run.ID, 10),
		"flywheel.base": baseVersion, "flywheel.candidate": prep.Candidate,
	}, rows); err != nil {
		return flow.TrainBatchInput{}, fmt.Errorf("prepare batch: %w", err)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return flow.TrainBatchInput{}, fmt.Errorf("prepare batch: %w", err)
	}
	base := flow.CheckpointRef{Version: baseVersion, Model: baseModel, Tokenizer: tokenizer}
	if baseVersion != "" {
		paths, err := store.Checkpoints(ctx, t.DB, in.Deployment, []string{baseVersion})
		if err != nil {
			return flow.TrainBatchInput{}, err
		}
		if p := paths[baseVersion]; p != "" {
			base.URI, base.Format = fileURI(p), checkpointFormat(p)
		}
	}
	algo := in.Algorithm
	if algo.Objective == "" {
		algo.Objective = trainer.ObjectiveGRPO
	}
	out := flow.TrainBatchInput{
		Protocol: flow.TrainerProtocol, Deployment: in.Deployment, RunID: run.ID,
		Batch:     flow.BatchRef{URI: fileURI(path), Format: "parquet", Samples: len(rows), Tokens: tokens, SHA256: sum},
		Base:      base,
		Output:    flow.OutputRef{Version: prep.Candidate, Dir: filepath.Join(t.CheckpointDir, in.Deployment)},
		Algo:      algo,
		TaskQueue: tr.Queue,
	}
	if tr.Kind == deployment.TrainerTinker {
		out.Trainer = &tr
	}
	return out, nil
}

// sampleIDs are the ids of samples[idx...].
func sampleIDs(samples []store.RunSample, idx []int) []int64 {
	out := make([]int64, len(idx))
	for i, j := range idx {
		out[i] = samples[j].ID
	}
	return out
}

// allIDs are the ids of samples.
func allIDs(samples []store.RunSample) []int64 {
	out := make([]int64, len(samples))
	for i, s := range samples {
		out[i] = s.ID
	}
	return out
}

// Advantages is how a batch's rewards became advantages.
type Advantages struct {
	trainer.AdvantageStats
	Estimator string
	// Baselines are the moved per-task means to store; Observed counts the
	// samples each moved by.
	Baselines map[string]float64
	Observed  map[string]int
	// Flat are the indexes of samples in groups of two or more whose
	// advantages are all zero (every answer scored the same): they carry
	// no learning signal, and their steps say filtered_group.
	Flat []int
}

// formAdvantages sets every sample's advantage with the trainer's
// estimator over GRPO groups (samples sharing a group id); a singleton is
// compared with its task's running baseline, continued from the stored
// ones, and the moved baselines are returned to store.
func formAdvantages(samples []trainer.Sample, cfg trainer.AdvantageConfig, stored map[string]float64) (Advantages, error) {
	cfg = cfg.WithDefaults()
	base := trainer.NewBaselineFrom(cfg.BaselineRate, stored)
	st, err := trainer.ComputeAdvantages(samples, cfg, base)
	if err != nil {
		return Advantages{}, err
	}
	out := Advantages{AdvantageStats: st, Estimator: cfg.Estimator, Baselines: map[string]float64{}, Observed: map[string]int{}}
	members, signal := map[string][]int{}, map[string]bool{}
	for i, s := range samples {
		if s.GroupID == "" {
			continue
		}
		members[s.GroupID] = append(members[s.GroupID], i)
		if s.Advantage != nil && *s.Advantage != 0 {
			signal[s.GroupID] = true
		}
	}
	for g, idx := range members {
		if len(idx) > 1 && !signal[g] {
			out.Flat = append(out.Flat, idx...)
		}
	}
	sort.Ints(out.Flat)
	for _, s := range samples {
		out.Observed[s.TaskID]++
		if v, ok := base.Task(s.TaskID); ok {
			out.Baselines[s.TaskID] = v
		}
	}
	return out, nil
}

// trainerOf is what the deployment's settings say of its training: its
// base model and tokenizer, and its trainer (zero: none named, the
// training policy's queue). A deployment without settings names nothing.
func trainerOf(ctx context.Context, db store.DBTX, name string) (model, tokenizer string, tr deployment.Trainer, err error) {
	d, err := store.GetDeployment(ctx, db, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", "", tr, nil
	}
	if err != nil {
		return "", "", tr, fmt.Errorf("trainer of %s: %w", name, err)
	}
	up, err := d.Settings()
	if err != nil {
		return "", "", tr, nil
	}
	tr, _ = up.TrainerOf()
	return up.BaseModel, up.ModelTokenizer(), tr, nil
}

// checkpointFormat names the format of a stored checkpoint path.
func checkpointFormat(path string) string {
	if strings.HasSuffix(path, ".safetensors") {
		return flow.CheckpointFlywheelPolicy
	}
	if _, err := os.Stat(filepath.Join(path, "adapter_config.json")); err == nil {
		return flow.CheckpointPEFTLoRA
	}
	return flow.CheckpointSafetensors
}
