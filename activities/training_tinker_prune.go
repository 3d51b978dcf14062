package activities

import (
	"context"
	"fmt"
	"slices"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

const msgStatesPruned = "training states pruned"

// pruneBatch bounds the versions one pass prunes.
const pruneBatch = 100

// keepSuperseded is how many of the newest superseded versions keep their
// training states: the versions a run of rollbacks goes back to first.
const keepSuperseded = 3

// PrunableStates lists the deployment's training states the loop no
// longer needs (store.PrunableStates), keeping the anchor's besides the
// loop's own, when its trainer is a Tinker service; for another kind of
// trainer, none.
func (t *Training) PrunableStates(ctx context.Context, in flow.PrunableStatesInput) (flow.PrunableStatesOutput, error) {
	_, _, tr, err := trainerOf(ctx, t.DB, in.Deployment)
	if err != nil || tr.Kind != deployment.TrainerTinker {
		return flow.PrunableStatesOutput{}, err
	}
	keep := slices.Clone(in.Keep)
	anchor, err := store.AnchorOf(ctx, t.DB, in.Deployment)
	if err != nil {
		return flow.PrunableStatesOutput{}, err
	}
	if anchor != nil {
		keep = append(keep, anchor.Version)
	}
	versions, err := store.PrunableStates(ctx, t.DB, in.Deployment, keep, keepSuperseded, pruneBatch)
	if err != nil || len(versions) == 0 {
		return flow.PrunableStatesOutput{}, err
	}
	return flow.PrunableStatesOutput{Versions: versions, Trainer: &tr}, nil
}

// MarkStatesPruned records the versions whose training states are gone.
func (t *Training) MarkStatesPruned(ctx context.Context, in flow.MarkStatesPrunedInput) error {
	if len(in.Versions) == 0 {
		return nil
	}
	return store.MarkStatesPruned(ctx, t.DB, in.Versions)
}

// PruneStates deletes the training state each version's tinker.json names
// from the deployment's Tinker service (a state already gone counts as
// deleted) and reports the versions done. A version without tinker.json
// has no state there; one whose state lives on another service than the
// deployment's trainer now names is left there (this worker holds no key
// for it), logged, and reported done too, so that it is not asked again.
// The versions' directories, the sampler weights serving loads, stay.
func (t *TinkerTraining) PruneStates(ctx context.Context, in flow.PruneStatesInput) (flow.PruneStatesOutput, error) {
	if in.Trainer == nil || in.Trainer.Kind != deployment.TrainerTinker {
		return flow.PruneStatesOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("prune states: deployment %s names no tinker trainer", in.Deployment), "BadInput", nil)
	}
	c, err := t.client(*in.Trainer, "prune states")
	if err != nil {
		return flow.PruneStatesOutput{}, err
	}
	log := t.logger()
	versions := make([]string, 0, len(in.Versions))
	for v := range in.Versions {
		versions = append(versions, v)
	}
	slices.Sort(versions)
	var out flow.PruneStatesOutput
	for _, v := range versions {
		if activity.IsActivity(ctx) {
			activity.RecordHeartbeat(ctx, v)
		}
		meta, ok := readTinkerMeta(in.Versions[v])
		switch {
		case !ok:
		case meta.Service != in.Trainer.URL:
			log.Warn("training state left on another service", "deployment", in.Deployment, "version", v, "state", meta.State, "service", meta.Service)
		default:
			if err := c.DeleteCheckpoint(ctx, meta.State); err != nil {
				// The versions done so far are reported; the rest wait
				// for the next pass.
				log.Warn("training state not deleted", "deployment", in.Deployment, "version", v, "state", meta.State, "error", err)
				return out, nil
			}
		}
		out.Pruned = append(out.Pruned, v)
	}
	log.Info(msgStatesPruned, "deployment", in.Deployment, "versions", len(out.Pruned))
	return out, nil
}
