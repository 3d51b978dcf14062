package activities

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/workflows"
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
	// Advantage is how rewards become advantages: the trainer's own
	// estimator (Dr. GRPO's r − mean for the demo) and the rate of the
	// per-task running baseline of singleton samples. Default: the
	// trainer's defaults (GRPO's (r − mean)/std, rate 0.1).
	Advantage trainer.AdvantageConfig
	// HeartbeatEvery is how often a running step heartbeats. Default 10s.
	HeartbeatEvery time.Duration
	Logger         *slog.Logger
}

// CheckBatch reports the deployment's queue.
func (t *Training) CheckBatch(ctx context.Context, in workflows.CheckBatchInput) (workflows.CheckBatchOutput, error) {
	eta := -1 // inputs recorded before FreshOnly existed count every sample
	if in.FreshOnly {
		eta = in.MaxStaleness
	}
	n, age, err := store.FreshQueueStats(ctx, t.DB, in.Deployment, eta, in.GroupWait)
	if err != nil {
		return workflows.CheckBatchOutput{}, err
	}
	return workflows.CheckBatchOutput{Queued: n, OldestAge: age}, nil
}

// ClaimBatch drops stale samples and claims a batch (idempotent by key).
func (t *Training) ClaimBatch(ctx context.Context, in workflows.ClaimBatchInput) (workflows.ClaimBatchOutput, error) {
	if in.RunKey == "" || in.BatchSize <= 0 {
		return workflows.ClaimBatchOutput{}, temporal.NewNonRetryableApplicationError("claim batch: run key and a positive batch size are required", "BadInput", nil)
	}
	run, err := store.ClaimBatch(ctx, t.DB, in.Deployment, in.RunKey, in.BatchSize, in.MaxStaleness, in.GroupWait)
	if err != nil {
		return workflows.ClaimBatchOutput{}, err
	}
	t.logger().Info(msgBatchClaimed, "deployment", in.Deployment, "run_id", run.ID, "samples", len(run.SampleIDs), "dropped_stale", run.Dropped)
	return workflows.ClaimBatchOutput{RunID: run.ID, Samples: len(run.SampleIDs), DroppedStale: run.Dropped, BaseVersion: run.BaseVersion}, nil
}

// TrainStep trains one claimed run, saves the checkpoint and records the
// candidate version with its lineage. Re-running a committed run returns
// its version without training again.
func (t *Training) TrainStep(ctx context.Context, in workflows.TrainStepInput) (workflows.TrainStepOutput, error) {
	if t.Trainer == nil {
		return workflows.TrainStepOutput{}, errors.New("train step: this worker has no trainer")
	}
	if t.Deployment != "" && in.Deployment != t.Deployment {
		// Training another deployment's samples into these weights would
		// also write its checkpoints under the wrong name. The run ends
		// failed (its samples stay queued), so it does not stay claimed.
		msg := fmt.Sprintf("train step: this worker trains %q, not %q", t.Deployment, in.Deployment)
		if t.DB != nil {
			if err := store.FailRun(ctx, t.DB, in.RunID, msg); err != nil {
				return workflows.TrainStepOutput{}, err
			}
		}
		return workflows.TrainStepOutput{}, temporal.NewNonRetryableApplicationError(msg, "WrongDeployment", nil)
	}
	run, samples, err := store.LoadRun(ctx, t.DB, in.RunID)
	if errors.Is(err, store.ErrNotFound) {
		return workflows.TrainStepOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	if err != nil {
		return workflows.TrainStepOutput{}, err
	}
	if run.Status == "trained" && run.VersionID != nil {
		return workflows.TrainStepOutput{Version: *run.VersionID, Samples: len(samples)}, nil
	}
	var live []store.RunSample
	for _, s := range samples {
		if s.Status == "queued" { // retired (forgotten) samples never train
			live = append(live, s)
		}
	}
	if len(live) == 0 {
		_ = store.FailRun(ctx, t.DB, run.ID, "no queued samples left")
		return workflows.TrainStepOutput{}, temporal.NewNonRetryableApplicationError("train step: no queued samples left in the run", "BadData", nil)
	}
	baselines, err := store.TaskBaselines(ctx, t.DB, in.Deployment)
	if err != nil {
		return workflows.TrainStepOutput{}, err
	}
	batch := &trainer.Batch{Objective: trainer.ObjectiveGRPO}
	if m := in.Masks; m != nil {
		batch.Masks = &trainer.Masks{IcePop: m.IcePop, IcePopLow: m.IcePopLow, IcePopHigh: m.IcePopHigh, KPop: m.KPop, KPopPhi: m.KPopPhi}
	}
	for _, s := range live {
		batch.Samples = append(batch.Samples, toTrainerSample(s))
	}
	adv, err := formAdvantages(batch.Samples, t.Advantage, baselines)
	if err != nil {
		_ = store.FailRun(ctx, t.DB, run.ID, err.Error())
		return workflows.TrainStepOutput{}, temporal.NewNonRetryableApplicationError("train step: "+err.Error(), "BadData", err)
	}

	// An earlier attempt may have trained this run and saved its
	// checkpoint but died before the commit: commit that step instead of
	// training the same samples twice.
	var res trainer.StepResult
	resumed := false
	if t.CheckpointDir != "" {
		v := t.Trainer.Version()
		if _, _, meta, err := trainer.LoadCheckpoint(t.checkpointPath(in.Deployment, v)); err == nil && meta["training_run"] == strconv.FormatInt(run.ID, 10) {
			parent, _ := store.VersionNumber(meta["parent_version"])
			res, resumed = trainer.StepResult{Version: v, Parent: parent, Samples: len(live)}, true
		}
	}
	if !resumed {
		stop := t.heartbeatWhile(ctx, in.RunID)
		res, err = t.Trainer.TrainStep(ctx, batch)
		stop()
	}
	if err != nil {
		if ctx.Err() != nil {
			return workflows.TrainStepOutput{}, ctx.Err()
		}
		_ = store.FailRun(ctx, t.DB, run.ID, err.Error())
		// The trainer rejects a batch for what it is (stale, malformed):
		// retrying the same batch would fail the same way.
		return workflows.TrainStepOutput{}, temporal.NewNonRetryableApplicationError("train step: "+err.Error(), "BadData", err)
	}
	version := store.VersionID(in.Deployment, res.Version)
	// The parent is the weights this step started from, which run ahead of
	// serving (up to η): forget follows this line to every descendant.
	parent := store.VersionID(in.Deployment, res.Parent)
	path := ""
	if t.CheckpointDir != "" {
		path = t.checkpointPath(in.Deployment, res.Version)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return workflows.TrainStepOutput{}, fmt.Errorf("train step: checkpoint dir: %w", err)
		}
		if _, statErr := os.Stat(path); statErr != nil {
			if err := trainer.SaveCheckpoint(path, t.Trainer.Snapshot(), res.Version, map[string]string{
				"deployment": in.Deployment, "training_run": strconv.FormatInt(run.ID, 10), "parent_version": parent,
			}); err != nil {
				return workflows.TrainStepOutput{}, fmt.Errorf("train step: %w", err)
			}
		}
	}
	metrics := map[string]any{
		"loss": res.Loss, "grad_norm": res.GradNorm, "samples": res.Samples, "trainer_dropped_stale": res.DroppedStale,
		"trained_tokens": res.TrainedTokens, "mean_reward": res.MeanReward, "groups": adv.Groups,
		"baseline_samples": adv.BaselineSamples, "zero_signal_groups": adv.ZeroSignalGroups,
		"no_baseline_samples": adv.NoBaseline, "advantage_estimator": adv.Estimator,
		"training_run": run.ID, "duration_ms": res.Duration.Milliseconds(),
		"resumed": resumed, "parent_version": parent,
		"icepop_masked": frac(res.IcePopMasked, res.TrainedTokens), "kpop_masked": frac(res.KPopMasked, res.TrainedTokens),
	}
	err = store.CommitTrainedRun(ctx, t.DB, store.TrainedRun{
		RunID: run.ID, Deployment: in.Deployment, Version: version, Parent: parent, Checkpoint: path,
		Metrics: metrics, Samples: live, Baselines: adv.Baselines, BaselineObs: adv.Observed, Flat: sampleIDs(live, adv.Flat),
	})
	if err != nil {
		return workflows.TrainStepOutput{}, err
	}
	t.logger().Info(msgStepTrained, "deployment", in.Deployment, "run_id", run.ID, "version", version, "loss", res.Loss,
		"samples", res.Samples, "baseline_samples", adv.BaselineSamples)
	return workflows.TrainStepOutput{Version: version, Loss: res.Loss, Samples: res.Samples, Groups: adv.Groups,
		Baseline: adv.BaselineSamples, Stale: res.DroppedStale,
		IcePopMasked: frac(res.IcePopMasked, res.TrainedTokens), KPopMasked: frac(res.KPopMasked, res.TrainedTokens)}, nil
}

// sampleIDs are the ids of samples[idx...].
func sampleIDs(samples []store.RunSample, idx []int) []int64 {
	out := make([]int64, len(idx))
	for i, j := range idx {
		out[i] = samples[j].ID
	}
	return out
}

// frac is n/of, 0 when of is 0.
func frac(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// ResetTrainer makes the trainer go on from a stored version (the serving
// one, after its candidate was rolled back): the rejected candidate's
// descendants are not trained further. Idempotent.
func (t *Training) ResetTrainer(ctx context.Context, in workflows.ResetTrainerInput) (workflows.ResetTrainerOutput, error) {
	if t.Trainer == nil {
		return workflows.ResetTrainerOutput{}, errors.New("reset trainer: this worker has no trainer")
	}
	if t.Deployment != "" && in.Deployment != t.Deployment {
		return workflows.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("reset trainer: this worker trains %q, not %q", t.Deployment, in.Deployment), "WrongDeployment", nil)
	}
	v, ok := store.VersionNumber(in.Version)
	if !ok || t.CheckpointDir == "" {
		return workflows.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("reset trainer: %q is not a stored version of %s", in.Version, in.Deployment), "BadInput", nil)
	}
	if t.Trainer.Version() == v {
		return workflows.ResetTrainerOutput{Version: in.Version}, nil
	}
	m, _, _, err := trainer.LoadCheckpoint(t.checkpointPath(in.Deployment, v))
	if err != nil {
		return workflows.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError("reset trainer: "+err.Error(), "BadInput", err)
	}
	if err := t.Trainer.Reset(m, v); err != nil {
		return workflows.ResetTrainerOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	t.logger().Info(msgTrainerReset, "deployment", in.Deployment, "version", in.Version)
	return workflows.ResetTrainerOutput{Version: in.Version}, nil
}

// checkpointPath follows trainer.CheckpointDir's layout, one directory per
// deployment, so a serving engine can load any version on demand.
func (t *Training) checkpointPath(deployment string, version int64) string {
	return trainer.CheckpointDir{Dir: filepath.Join(t.CheckpointDir, deployment)}.Path(version)
}

// heartbeatWhile heartbeats until the returned stop is called, so a long
// step on a dead worker is noticed within the heartbeat timeout.
func (t *Training) heartbeatWhile(ctx context.Context, runID int64) func() {
	every := t.HeartbeatEvery
	if every <= 0 {
		every = 10 * time.Second
	}
	done := make(chan struct{})
	heartbeat(ctx, runID)
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				// Cancelled (the worker is stopping): heartbeats stop, so
				// the server hands the step to another worker even if
				// this one never returns.
				return
			case <-tick.C:
				heartbeat(ctx, runID)
			}
		}
	}()
	return func() { close(done) }
}

// toTrainerSample lays out prompt then completion; only the completion
// trains, at its behaviour log-probs and version.
func toTrainerSample(s store.RunSample) trainer.Sample {
	n := len(s.PromptTokenIDs) + len(s.CompletionTokenIDs)
	out := trainer.Sample{GroupID: s.GroupKey(), TaskID: s.TaskID, Reward: s.Reward,
		TokenIDs: make([]int, 0, n), LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	v, _ := store.VersionNumber(s.BehaviourVersion)
	for _, id := range s.PromptTokenIDs {
		out.TokenIDs = append(out.TokenIDs, int(id))
	}
	for i, id := range s.CompletionTokenIDs {
		j := len(s.PromptTokenIDs) + i
		out.TokenIDs = append(out.TokenIDs, int(id))
		if j == 0 {
			continue // nothing predicts the first token
		}
		out.LossMask[j] = 1
		if i < len(s.Logprobs) {
			out.Logprobs[j] = s.Logprobs[i]
		}
		out.Versions[j] = v
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

func (t *Training) logger() *slog.Logger {
	if t.Logger == nil {
		return slog.Default()
	}
	return t.Logger
}
