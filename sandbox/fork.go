package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// Snapshot makes an image from which sandboxes start with sb's /workspace
// as it is now (process state, /tmp and the home directory are not kept).
// The root filesystem is read-only and /workspace a tmpfs, which a commit
// of sb would not see, so /workspace is packed inside sb, copied into a
// container of sb's image that is never started, at a path of its own, and
// that container is committed with a label naming the path. (Replacing the
// image's /workspace would need a build with a RUN to empty it: seconds
// more.) The image is labelled for the janitor; remove it with
// RemoveSnapshot.
func (m *Manager) Snapshot(ctx context.Context, sb *Sandbox) (Image, error) {
	tree, err := sb.packWorkspace(ctx)
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	id := hex.EncodeToString(nonce[:])
	dir := ".flywheel/snapshot-" + id
	moved, err := underDir(tree, dir)
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	helper, err := m.cli.ContainerCreate(ctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image:  sb.Image.Ref,
			Labels: map[string]string{LabelManaged: "1", LabelKind: "sandbox", LabelOwner: m.cfg.Owner},
		},
		HostConfig: &container.HostConfig{NetworkMode: "none"},
	})
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	defer m.removeContainer(helper.ID)
	if _, err := m.cli.CopyToContainer(ctx, helper.ID, client.CopyToContainerOptions{DestinationPath: "/", Content: bytes.NewReader(moved)}); err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	ref := "flywheel-sandbox/snapshot:" + id
	res, err := m.cli.ContainerCommit(ctx, helper.ID, client.ContainerCommitOptions{
		Reference: ref,
		Comment:   "flywheel sandbox snapshot of " + short(sb.ID),
		NoPause:   true,
		Changes: []string{"LABEL " + LabelManaged + "=1 " + LabelKind + "=snapshot " + LabelOwner + "=" + m.cfg.Owner +
			" " + labelWorkspace + "=/" + path.Join(dir, "workspace")},
	})
	if err != nil {
		return Image{}, fmt.Errorf("snapshot sandbox %s: %w", short(sb.ID), err)
	}
	return Image{Ref: ref, ContentHash: res.ID, HasAgent: sb.Image.HasAgent}, nil
}

// underDir moves every entry of a tarball under dir, with entries for dir
// and its parents first.
func underDir(tree []byte, dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	parts := strings.Split(dir, "/")
	for i := range parts {
		h := &tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts[:i+1], "/") + "/", Mode: 0o755, ModTime: epoch}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	tr := tar.NewReader(bytes.NewReader(tree))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		h.Name = dir + "/" + h.Name
		if h.Typeflag == tar.TypeLink {
			h.Linkname = dir + "/" + h.Linkname
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// RemoveSnapshot deletes a snapshot image once no sandbox uses it.
func (m *Manager) RemoveSnapshot(ctx context.Context, img Image) error {
	if err := removeImage(ctx, m.cli, img.Ref, false); err != nil {
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
