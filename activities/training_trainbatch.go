package activities

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trainer"
	"github.com/flywheel-ai/flywheel/trainer/parquetbatch"
)

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

// frac is n/of, 0 when of is 0.
func frac(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}
