package activities

import (
	"context"
	"errors"
	"fmt"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/store"
)

// gatePolicy is the policy a gate of deployment judges by: the release's,
// with its defaults, then each threshold the deployment's own settings set
// in its place. A deployment without settings, or whose settings no longer
// read, keeps the release's policy.
func gatePolicy(ctx context.Context, db store.DBTX, name string, p deployment.ReleasePolicy) (deployment.ReleasePolicy, error) {
	p = p.WithDefaults()
	d, err := store.GetDeployment(ctx, db, name)
	if errors.Is(err, store.ErrNotFound) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("gate policy of %s: %w", name, err)
	}
	s, err := d.Settings()
	if err != nil {
		return p, nil
	}
	if q, err := p.WithGates(s.Gates); err == nil {
		return q, nil
	}
	return p, nil
}
