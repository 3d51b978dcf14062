package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Snapshot commits a prepared sandbox's filesystem as an image from which
// identical sandboxes can be started (process state is not kept). The image
// is labelled for the janitor; remove it with RemoveSnapshot.
func (m *Manager) Snapshot(ctx context.Context, sb *Sandbox) (Image, error) {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	ref := "flywheel-sandbox/snapshot:" + hex.EncodeToString(nonce[:])
	res, err := m.cli.ContainerCommit(ctx, sb.ID, client.ContainerCommitOptions{
		Reference: ref,
		Comment:   "flywheel sandbox snapshot of " + short(sb.ID),
		Changes: []string{
			"LABEL " + LabelManaged + "=1 " + LabelKind + "=snapshot " + LabelOwner + "=" + m.cfg.Owner,
		},
	})
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	return Image{Ref: ref, ContentHash: res.ID, HasAgent: sb.Image.HasAgent}, nil
}

// RemoveSnapshot deletes a snapshot image once no sandbox uses it.
func (m *Manager) RemoveSnapshot(ctx context.Context, img Image) error {
	_, err := m.cli.ImageRemove(ctx, img.Ref, client.ImageRemoveOptions{PruneChildren: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("remove snapshot %s: %w", img.Ref, err)
	}
	return nil
}

// Fork snapshots sb and starts n sandboxes from the snapshot, in parallel up
// to the provisioning limit: the G rollouts of a GRPO group start from one
// prepared state. The caller releases the sandboxes and the snapshot.
func (m *Manager) Fork(ctx context.Context, sb *Sandbox, n int) (Image, []*Sandbox, error) {
	if n <= 0 {
		return Image{}, nil, errors.New("fork: n must be positive")
	}
	snap, err := m.Snapshot(ctx, sb)
	if err != nil {
		return Image{}, nil, err
	}
	out := make([]*Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = m.Create(ctx, snap) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range out {
			if s != nil {
				_ = m.Release(context.WithoutCancel(ctx), s)
			}
		}
		_ = m.RemoveSnapshot(context.WithoutCancel(ctx), snap)
		return Image{}, nil, fmt.Errorf("fork %s: %w", short(sb.ID), err)
	}
	return snap, out, nil
}
