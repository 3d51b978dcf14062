package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/flywheel-ai/flywheel/inference/upstream"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/workflows"
)

// gatePolicy is the policy a gate of deployment judges by: the release's,
// with its defaults, then each threshold the deployment's own settings set
// (upstream.Gates) in its place. A deployment without settings, or whose
// settings no longer read, keeps the release's policy.
func gatePolicy(ctx context.Context, db store.DBTX, deployment string, p workflows.ReleasePolicy) (workflows.ReleasePolicy, error) {
	p = p.WithDefaults()
	d, err := store.GetDeployment(ctx, db, deployment)
	if errors.Is(err, store.ErrNotFound) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("gate policy of %s: %w", deployment, err)
	}
	if d.Backend != store.BackendUpstream {
		return p, nil
	}
	up, err := upstream.ParseSettings(d.Config)
	if err != nil || up.Gates == nil {
		return p, nil
	}
	g := up.Gates
	set := func(dst *float64, v *float64) {
		if v != nil {
			*dst = *v
		}
	}
	if g.AllowUnevaluated != nil {
		p.AllowUnevaluated = *g.AllowUnevaluated
	}
	set(&p.MaxRewardDrop, g.MaxRewardDrop)
	set(&p.AnchorBudget, g.AnchorBudget)
	set(&p.MaxSafetyDrop, g.MaxSafetyDrop)
	set(&p.MaxErrorRise, g.MaxErrorRise)
	set(&p.Alpha, g.Alpha)
	if g.MinCanarySamples != nil {
		p.MinCanarySamples = *g.MinCanarySamples
	}
	return p, nil
}
