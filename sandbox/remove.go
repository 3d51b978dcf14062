package sandbox

import (
	"context"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// Every removal in this package goes through these two functions, because
// several sweepers may reach one object at once: two workers' janitors on one
// Docker host, or a janitor and the owner's own Release. The daemon answers
// the loser of such a race with a conflict ("removal of container … is
// already in progress") or, for an image deleted between its list and its
// removal, a bare error ("unrecognized image ID"). Neither is a failure: the
// object is gone or going. So on any error the object is looked up again,
// and only one that still exists, and is not being removed, fails the call.

// removeContainer force-removes a container and its volumes. When the
// daemon refuses because another removal has it in hand (a conflict), it
// waits, up to removalWait, for that removal to finish; it fails only when
// the container is still there and no removal has it.
func removeContainer(ctx context.Context, cli *client.Client, id string) error {
	_, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	deadline := time.Now().Add(removalWait)
	for {
		got, ierr := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if cerrdefs.IsNotFound(ierr) {
			return nil
		}
		// A force removal first kills the container, and a running
		// container reports "running" even while its removal is under way,
		// so the conflict is what says another removal has it.
		removing := cerrdefs.IsConflict(err) || (ierr == nil && got.Container.State != nil && got.Container.State.Status == container.StateRemoving)
		if !removing || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// removalWait bounds how long a removal waits for another one that has the
// same container in hand.
const removalWait = 30 * time.Second

// removeImage removes an image (force when asked) and its untagged parents.
// An image that is already gone counts as removed.
func removeImage(ctx context.Context, cli *client.Client, ref string, force bool) error {
	_, err := cli.ImageRemove(ctx, ref, client.ImageRemoveOptions{Force: force, PruneChildren: true})
	if err == nil || cerrdefs.IsNotFound(err) {
		return nil
	}
	if _, ierr := cli.ImageInspect(ctx, ref); cerrdefs.IsNotFound(ierr) {
		return nil
	}
	return err
}
