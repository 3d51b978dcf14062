package activities

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/store"
)

// SyncWeights makes a deployment's serving engine hold the versions its
// routes name (the serving version, the anchor a watchdog may roll back
// to, and the candidate under release), through the engine's own weight
// API (inference/weightsync). A deployment without weight sync is left
// alone and says so (Synced false). With Unload it also releases the
// versions nothing names, but keeps those still draining (in.Drain).
// An engine's refusal is final
// (WeightSync); no answer or a 5xx is retried.
func (r *Release) SyncWeights(ctx context.Context, in flow.SyncWeightsInput) (flow.SyncWeightsOutput, error) {
	d, err := store.GetDeployment(ctx, r.DB, in.Deployment)
	if errors.Is(err, store.ErrNotFound) || (err == nil && d.Backend != deployment.BackendUpstream) {
		return flow.SyncWeightsOutput{}, nil
	}
	if err != nil {
		return flow.SyncWeightsOutput{}, err
	}
	s, err := deployment.Parse(d.Config)
	if err != nil {
		return flow.SyncWeightsOutput{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("deployment %s: %v", d.Name, err), "BadInput", err)
	}
	if s.WeightSync == nil {
		return flow.SyncWeightsOutput{}, nil
	}
	engine, err := weightsync.New(*s.WeightSync, s.BaseURL, os.Getenv(s.APIKeyEnv), r.HTTPClient)
	if err != nil {
		return flow.SyncWeightsOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadInput", err)
	}
	serving, err := store.ServingOf(ctx, r.DB, d.Name, artefact.LayerWeights)
	if err != nil {
		return flow.SyncWeightsOutput{}, err
	}
	names := []string{serving, in.Candidate}
	if a, err := store.AnchorOf(ctx, r.DB, d.Name); err != nil {
		return flow.SyncWeightsOutput{}, err
	} else if a != nil {
		names = append(names, a.Version)
	}
	// A release in flight keeps its candidate (another release's sync
	// must not unload it).
	if rel, err := store.RunningRelease(ctx, r.DB, d.Name, artefact.LayerWeights); err == nil {
		names = append(names, rel.Candidate)
	} else if !errors.Is(err, store.ErrNotFound) {
		return flow.SyncWeightsOutput{}, err
	}
	if in.Unload && in.Drain > 0 {
		draining, err := store.Draining(ctx, r.DB, d.Name, artefact.LayerWeights, in.Drain)
		if err != nil {
			return flow.SyncWeightsOutput{}, err
		}
		names = append(names, draining...)
	}
	want, err := store.Checkpoints(ctx, r.DB, d.Name, names)
	if err != nil {
		return flow.SyncWeightsOutput{}, err
	}
	if in.Candidate != "" && want[in.Candidate] == "" && engine.ByName() {
		return flow.SyncWeightsOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("candidate %s has no checkpoint to load", in.Candidate), "WeightSync", nil)
	}
	rep, err := weightsync.Sync(ctx, engine, d.Name+"@", want, serving, in.Unload)
	out := flow.SyncWeightsOutput{Synced: true, Loaded: rep.Loaded, Unloaded: rep.Unloaded, Kept: rep.Kept}
	if err != nil {
		if weightsync.Temporary(err) {
			return out, err
		}
		return out, temporal.NewNonRetryableApplicationError(err.Error(), "WeightSync", err)
	}
	r.logger().Info("weights synced", "deployment", d.Name, "loaded", rep.Loaded, "unloaded", rep.Unloaded, "kept", rep.Kept)
	return out, nil
}
