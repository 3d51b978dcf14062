package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// Snapshot makes an image from which sandboxes start with sb's /workspace
// as it is now (process state, /tmp and the home directory are not kept).
// The root filesystem is read-only and /workspace a tmpfs, which a commit
// would not see, so the snapshot is a build: sb's image plus a tarball of
// /workspace packed inside sb, added at a path of its own that a label
// names (the image's /workspace would need a RUN to empty it first, which
// costs a container start). The image is labelled for the janitor; remove
// it with RemoveSnapshot.
func (m *Manager) Snapshot(ctx context.Context, sb *Sandbox) (Image, error) {
	tree, err := sb.packWorkspace(ctx)
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	id := hex.EncodeToString(nonce[:])
	ref := "flywheel-sandbox/snapshot:" + id
	dir := "/.flywheel/snapshot-" + id
	dockerfile := "FROM " + sb.Image.Ref + "\nADD workspace.tar " + dir + "/\n"
	var buf bytes.Buffer
	tw := newTarWriter(&buf)
	tw.file("Dockerfile", []byte(dockerfile), 0o644, 0)
	tw.file("workspace.tar", tree, 0o644, 0)
	if err := tw.close(); err != nil {
		return Image{}, err
	}
	labels := map[string]string{LabelKind: "snapshot", LabelOwner: m.cfg.Owner, labelWorkspace: path.Join(dir, "workspace")}
	if err := buildImage(ctx, m.cli, &buf, ref, labels); err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	ins, err := m.cli.ImageInspect(ctx, ref)
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	return Image{Ref: ref, ContentHash: ins.ID, HasAgent: sb.Image.HasAgent}, nil
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
