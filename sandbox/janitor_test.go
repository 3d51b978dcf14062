package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

// TestConcurrentJanitorsAgree sweeps one set of leftovers with four janitors
// at once, as two workers on one Docker host do. Every sweep must succeed:
// a container another sweep is removing, or an image another sweep removed,
// is cleared, not an error.
func TestConcurrentJanitorsAgree(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	ctx := context.Background()

	// The leftovers of a process that has exited.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	host, err := os.Hostname()
	require.NoError(t, err)
	m, err := sandbox.NewManager(cli, sandbox.Config{Owner: fmt.Sprintf("%s/%d/gone", host, dead.Process.Pid)})
	require.NoError(t, err)
	var ids, snaps []string
	for i := range 6 {
		sb, err := m.Create(ctx, img)
		require.NoError(t, err)
		ids = append(ids, sb.ID)
		if i < 2 {
			snap, err := m.Snapshot(ctx, sb)
			require.NoError(t, err)
			snaps = append(snaps, snap.Ref)
		}
	}

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { _, errs[i] = sandbox.Janitor(ctx, cli, sandbox.JanitorOptions{}) })
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "janitor %d", i)
	}
	for _, id := range ids {
		_, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		require.Error(t, err, "container %s must be gone", id)
	}
	for _, ref := range snaps {
		_, err := cli.ImageInspect(ctx, ref)
		require.Error(t, err, "snapshot %s must be gone", ref)
	}
}
