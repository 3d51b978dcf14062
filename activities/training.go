package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
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

// PrepareBatch writes a claimed run as the Parquet batch of the trainer
// protocol: its live samples with advantages from the configured
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
	adv, err := formAdvantages(batch, t.Advantage, baselines)
	if err != nil {
		_ = store.FailRun(ctx, t.DB, run.ID, err.Error())
		return flow.TrainBatchInput{}, temporal.NewNonRetryableApplicationError("prepare batch: "+err.Error(), "BadData", err)
	}
	for i := range rows {
		rows[i].Advantage = *batch[i].Advantage
	}
	prep, err := store.PrepareRun(ctx, t.DB, run.ID, store.PreparedRun{
		Base: in.Base, Baselines: adv.Baselines, Observed: adv.Observed, Flat: sampleIDs(live, adv.Flat),
		Samples: allIDs(live),
		Stats: map[string]any{"groups": adv.Groups, "baseline_samples": adv.BaselineSamples, "zero_signal_groups": adv.ZeroSignalGroups, "perfect_groups": adv.PerfectGroups,
			"no_baseline_samples": adv.NoBaseline, "advantage_estimator": adv.Estimator},
	})
	if err != nil {
		return flow.TrainBatchInput{}, err
	}
	path := t.batchPath(in.Deployment, run.ID)
	if err := parquetbatch.Write(path, map[string]string{
		"flywheel.deployment": in.Deployment, "flywheel.run_id": strconv.FormatInt(run.ID, 10),
		"flywheel.base": in.Base, "flywheel.candidate": prep.Candidate,
	}, rows); err != nil {
		return flow.TrainBatchInput{}, fmt.Errorf("prepare batch: %w", err)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return flow.TrainBatchInput{}, fmt.Errorf("prepare batch: %w", err)
	}
	base := flow.CheckpointRef{Version: in.Base}
	if base.Model, base.Tokenizer, err = baseModel(ctx, t.DB, in.Deployment); err != nil {
		return flow.TrainBatchInput{}, err
	}
	if in.Base != "" {
		paths, err := store.Checkpoints(ctx, t.DB, in.Deployment, []string{in.Base})
		if err != nil {
			return flow.TrainBatchInput{}, err
		}
		if p := paths[in.Base]; p != "" {
			base.URI, base.Format = fileURI(p), checkpointFormat(p)
		}
	}
	algo := in.Algorithm
	if algo.Objective == "" {
		algo.Objective = trainer.ObjectiveGRPO
	}
	return flow.TrainBatchInput{
		Protocol: flow.TrainerProtocol, Deployment: in.Deployment, RunID: run.ID,
		Batch:  flow.BatchRef{URI: fileURI(path), Format: "parquet", Samples: len(rows), Tokens: tokens, SHA256: sum},
		Base:   base,
		Output: flow.OutputRef{Version: prep.Candidate, Dir: filepath.Join(t.CheckpointDir, in.Deployment)},
		Algo:   algo,
	}, nil
}

// TrainBatch is the Go trainer's side of the trainer protocol: it trains
// the in-process policy on a batch file, from the base checkpoint, into
// the output version's checkpoint. It reads nothing but the files its
// input names. A retry after a checkpoint was written (the worker died
// before answering) answers with that checkpoint instead of training the
// same samples twice.
func (t *Training) TrainBatch(ctx context.Context, in flow.TrainBatchInput) (flow.TrainBatchOutput, error) {
	if t.Trainer == nil {
		return flow.TrainBatchOutput{}, errors.New("train batch: this worker has no trainer")
	}
	bad := func(format string, args ...any) error {
		return temporal.NewNonRetryableApplicationError("train batch: "+fmt.Sprintf(format, args...), "BadInput", nil)
	}
	if in.Protocol != flow.TrainerProtocol {
		return flow.TrainBatchOutput{}, bad("protocol %q, this trainer speaks %q", in.Protocol, flow.TrainerProtocol)
	}
	if err := t.refuseOther("train batch", in.Deployment); err != nil {
		return flow.TrainBatchOutput{}, err
	}
	if in.Algo.ClipLow != 0 || in.Algo.ClipHigh != 0 || in.Algo.KLCoef != 0 {
		return flow.TrainBatchOutput{}, bad("the built-in trainer takes clip and KL from its configuration (trainer.*), not per step")
	}
	out, ok := store.VersionNumber(in.Output.Version)
	if !ok || in.Output.Dir == "" {
		return flow.TrainBatchOutput{}, bad("output %q in %q is not a version and a directory", in.Output.Version, in.Output.Dir)
	}
	path := trainer.CheckpointDir{Dir: in.Output.Dir}.Path(out)
	runID := strconv.FormatInt(in.RunID, 10)
	if _, _, meta, err := trainer.LoadCheckpoint(path); err == nil && meta["training_run"] == runID {
		loss, _ := strconv.ParseFloat(meta["loss"], 64)
		samples, _ := strconv.Atoi(meta["samples"])
		return flow.TrainBatchOutput{Version: in.Output.Version, Loss: loss, Samples: samples, Resumed: true,
			Checkpoint: flow.CheckpointRef{Version: in.Output.Version, URI: fileURI(path), Format: flow.CheckpointFlywheelPolicy}}, nil
	}
	if err := t.ensureBase(in.Base); err != nil {
		return flow.TrainBatchOutput{}, err
	}
	batchPath, err := localPath(in.Batch.URI)
	if err != nil {
		return flow.TrainBatchOutput{}, bad("%v", err)
	}
	if sum, err := fileSHA256(batchPath); err != nil {
		return flow.TrainBatchOutput{}, bad("batch: %v", err)
	} else if in.Batch.SHA256 != "" && sum != in.Batch.SHA256 {
		return flow.TrainBatchOutput{}, bad("batch %s has sha256 %s, not %s", batchPath, sum, in.Batch.SHA256)
	}
	_, rows, err := parquetbatch.Read(batchPath)
	if err != nil {
		return flow.TrainBatchOutput{}, bad("%v", err)
	}
	batch := &trainer.Batch{Objective: in.Algo.Objective, Version: out}
	if eta := in.Algo.MaxStaleness; eta != 0 {
		// The deployment's η, which the claim applied too: the trainer's
		// own default would drop a batch the loop meant to train, and the
		// loop would claim the same samples again for ever. 0 is an input
		// from before η was sent (withDefaults never leaves it 0).
		batch.MaxStaleness = &eta
	}
	if m := in.Algo.Masks; m != nil {
		batch.Masks = &trainer.Masks{IcePop: m.IcePop, IcePopLow: m.IcePopLow, IcePopHigh: m.IcePopHigh, KPop: m.KPop, KPopPhi: m.KPopPhi}
	}
	for _, r := range rows {
		batch.Samples = append(batch.Samples, sampleOf(r))
	}
	stop := heartbeatWhile(ctx, t.HeartbeatEvery, func() any { return in.RunID })
	res, err := t.Trainer.TrainStep(ctx, batch)
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return flow.TrainBatchOutput{}, ctx.Err()
		}
		// The trainer rejects a batch for what it is (stale, malformed):
		// retrying the same batch would fail the same way.
		return flow.TrainBatchOutput{}, temporal.NewNonRetryableApplicationError("train batch: "+err.Error(), "BadData", err)
	}
	if err := os.MkdirAll(in.Output.Dir, 0o755); err != nil {
		return flow.TrainBatchOutput{}, fmt.Errorf("train batch: checkpoint dir: %w", err)
	}
	if err := trainer.SaveCheckpoint(path, t.Trainer.Snapshot(), res.Version, map[string]string{
		"deployment": in.Deployment, "training_run": runID, "parent_version": in.Base.Version,
		"loss": strconv.FormatFloat(res.Loss, 'g', -1, 64), "samples": strconv.Itoa(res.Samples),
	}); err != nil {
		return flow.TrainBatchOutput{}, fmt.Errorf("train batch: %w", err)
	}
	return flow.TrainBatchOutput{
		Version:    in.Output.Version,
		Checkpoint: flow.CheckpointRef{Version: in.Output.Version, URI: fileURI(path), Format: flow.CheckpointFlywheelPolicy},
		Loss:       res.Loss, Samples: res.Samples, DroppedStale: res.DroppedStale, TrainedTokens: res.TrainedTokens,
		IcePopMasked: frac(res.IcePopMasked, res.TrainedTokens), KPopMasked: frac(res.KPopMasked, res.TrainedTokens),
		Metrics: map[string]float64{"grad_norm": res.GradNorm, "mean_reward": res.MeanReward, "duration_ms": float64(res.Duration.Milliseconds())},
	}, nil
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

// ensureBase makes the trainer's weights the base's, loading its
// checkpoint unless the trainer holds them already (its previous step).
func (t *Training) ensureBase(base flow.CheckpointRef) error {
	if base.Version == "" {
		return nil // the trainer's own base model
	}
	v, ok := store.VersionNumber(base.Version)
	if !ok {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("train batch: base %q is not a version", base.Version), "BadInput", nil)
	}
	if t.Trainer.Version() == v {
		return nil
	}
	path, err := localPath(base.URI)
	if err != nil {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("train batch: base %s: %v", base.Version, err), "BadInput", nil)
	}
	m, _, _, err := trainer.LoadCheckpoint(path)
	if err != nil {
		return temporal.NewNonRetryableApplicationError("train batch: base: "+err.Error(), "BadInput", err)
	}
	if err := t.Trainer.Reset(m, v); err != nil {
		return temporal.NewNonRetryableApplicationError("train batch: base: "+err.Error(), "BadInput", err)
	}
	t.logger().Info(msgTrainerReset, "version", base.Version)
	return nil
}

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

// rowOf is a claimed sample as a batch row: every completion token trains,
// at its behaviour log-prob and version.
func rowOf(s store.RunSample) parquetbatch.Row {
	v, _ := store.VersionNumber(s.BehaviourVersion)
	n := len(s.CompletionTokenIDs)
	r := parquetbatch.Row{SampleID: s.ID, TenantID: s.TenantID, SessionID: s.SessionID, TaskID: s.TaskID, GroupID: s.GroupKey(),
		PromptIDs: s.PromptTokenIDs, CompletionIDs: s.CompletionTokenIDs, Reward: s.Reward,
		LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	for i := range n {
		r.LossMask[i], r.Versions[i] = 1, v
		if i < len(s.Logprobs) {
			r.Logprobs[i] = s.Logprobs[i]
		}
	}
	if r.PromptIDs == nil {
		r.PromptIDs = []int32{}
	}
	if r.CompletionIDs == nil {
		r.CompletionIDs = []int32{}
	}
	return r
}

// sampleOf lays a batch row out for the trainer: prompt then completion,
// the completion's tokens trained as the row's loss mask says.
func sampleOf(r parquetbatch.Row) trainer.Sample {
	n := len(r.PromptIDs) + len(r.CompletionIDs)
	out := trainer.Sample{GroupID: r.GroupID, TaskID: r.TaskID, Reward: r.Reward,
		TokenIDs: make([]int, 0, n), LossMask: make([]uint8, n), Logprobs: make([]float32, n), Versions: make([]int64, n)}
	a := r.Advantage // the control plane's estimator set it
	out.Advantage = &a
	for _, id := range r.PromptIDs {
		out.TokenIDs = append(out.TokenIDs, int(id))
	}
	for i, id := range r.CompletionIDs {
		j := len(r.PromptIDs) + i
		out.TokenIDs = append(out.TokenIDs, int(id))
		if j == 0 {
			continue // nothing predicts the first token
		}
		out.LossMask[j], out.Logprobs[j], out.Versions[j] = r.LossMask[i], r.Logprobs[i], r.Versions[i]
	}
	return out
}

// batchPath is where a run's batch file goes.
func (t *Training) batchPath(deployment string, runID int64) string {
	return filepath.Join(t.BatchDir, deployment, fmt.Sprintf("run-%012d.parquet", runID))
}

// fileURI is the file:// URI of a local path.
func fileURI(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return (&url.URL{Scheme: "file", Path: path}).String()
}

// localPath is the path of a file:// URI (or of a bare absolute path).
func localPath(uri string) (string, error) {
	if filepath.IsAbs(uri) {
		return uri, nil
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "file" || u.Path == "" {
		return "", fmt.Errorf("%q is not a file:// URI; this trainer reads shared files only", uri)
	}
	return u.Path, nil
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

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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

// baseModel is the deployment's base model and tokenizer, as its settings
// name them ("" for a deployment without settings, or none set).
func baseModel(ctx context.Context, db store.DBTX, name string) (model, tokenizer string, err error) {
	d, err := store.GetDeployment(ctx, db, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("base model of %s: %w", name, err)
	}
	up, err := d.Settings()
	if err != nil {
		return "", "", nil
	}
	return up.BaseModel, up.ModelTokenizer(), nil
}
