package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

func TestWarmPoolServesAndRefills(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	m := newManager(t, cli, sandbox.Config{ProvisionConcurrency: 2})
	require.NoError(t, m.StartPool(img, 2))
	require.Eventually(t, func() bool { return m.PoolStats(img).Ready == 2 }, time.Minute, 50*time.Millisecond)

	ctx := context.Background()
	a, err := m.Acquire(ctx, img)
	require.NoError(t, err)
	b, err := m.Acquire(ctx, img)
	require.NoError(t, err)
	require.NotEqual(t, a.ID, b.ID)
	require.Equal(t, "ok\n", string(run(t, a, "echo ok").Stdout))
	// The pool refills in the background after being emptied.
	require.Eventually(t, func() bool { return m.PoolStats(img).Ready == 2 }, time.Minute, 50*time.Millisecond)
	require.NoError(t, m.Release(ctx, a))
	require.NoError(t, m.Release(ctx, b))
	_, err = cli.ContainerInspect(ctx, a.ID, client.ContainerInspectOptions{})
	require.Error(t, err, "released sandboxes are removed, never reused")
}

func TestForkStartsCopiesOfAPreparedSandbox(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	src := newSandbox(t, m, baseImage(t, cli))
	ctx := context.Background()
	require.NoError(t, src.WriteFile(ctx, "state.txt", []byte("prepared"), 0))

	snap, forks, err := m.Fork(ctx, src, 3)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, f := range forks {
			require.NoError(t, m.Release(context.Background(), f))
		}
		require.NoError(t, m.RemoveSnapshot(context.Background(), snap))
	})
	require.Len(t, forks, 3)
	for i, f := range forks {
		require.Equal(t, "prepared", string(run(t, f, "cat state.txt").Stdout))
		require.NoError(t, f.WriteFile(ctx, "mine.txt", []byte(fmt.Sprint(i)), 0))
	}
	// Forks are independent of each other and of the source.
	require.Equal(t, "1", string(run(t, forks[1], "cat mine.txt").Stdout))
	require.NotEqual(t, 0, run(t, src, "test -e mine.txt").ExitCode)

	// A fork of a fork keeps what its source deleted deleted.
	require.Equal(t, 0, run(t, forks[0], "rm state.txt").ExitCode)
	snap2, again, err := m.Fork(ctx, forks[0], 1)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, m.Release(context.Background(), again[0]))
		require.NoError(t, m.RemoveSnapshot(context.Background(), snap2))
	})
	require.NotEqual(t, 0, run(t, again[0], "test -e state.txt").ExitCode)
	require.Equal(t, "0", string(run(t, again[0], "cat mine.txt").Stdout))
}

func TestSandboxCanBeReattachedByID(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	m1 := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m1, img)
	require.NoError(t, sb.WriteFile(context.Background(), "x", []byte("1"), 0))

	// A second manager (another worker after a retry) finds it by id.
	m2 := newManager(t, cli, sandbox.Config{})
	again, err := m2.Get(context.Background(), sb.ID)
	require.NoError(t, err)
	require.Equal(t, "1", string(run(t, again, "cat x").Stdout))
}

// TestJanitorAfterCrash starts this test binary as a child that creates
// sandboxes and a snapshot and then dies by SIGKILL, like a crashed worker.
func TestJanitorAfterCrash(t *testing.T) {
	if os.Getenv("FLYWHEEL_JANITOR_CHILD") == "1" {
		crashingChild(t)
		return
	}
	cli := dockerClient(t)
	baseImage(t, cli) // built here, so the child only creates containers
	m := newManager(t, cli, sandbox.Config{})
	mine := newSandbox(t, m, baseImage(t, cli))

	cmd := exec.Command(os.Args[0], "-test.run=^TestJanitorAfterCrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLYWHEEL_JANITOR_CHILD=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "child output: %s", out)
	require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal(), "child output: %s", out)
	var leftovers []string
	for _, line := range strings.Split(string(out), "\n") {
		if id, ok := strings.CutPrefix(line, "LEFTOVER "); ok {
			leftovers = append(leftovers, strings.TrimSpace(id))
		}
	}
	require.Len(t, leftovers, 3, "child output: %s", out)
	ctx := context.Background()
	for _, id := range leftovers[:2] {
		_, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		require.NoError(t, err, "the crash left container %s behind", id)
	}

	rep, err := sandbox.Janitor(ctx, cli, sandbox.JanitorOptions{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, rep.Containers, 2)
	require.GreaterOrEqual(t, rep.Snapshots, 1)
	for _, id := range leftovers[:2] {
		_, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		require.Error(t, err, "janitor must remove %s", id)
	}
	_, err = cli.ImageInspect(ctx, leftovers[2])
	require.Error(t, err, "janitor must remove the snapshot")
	// A live owner's sandbox is untouched.
	require.Equal(t, "alive\n", string(run(t, mine, "echo alive").Stdout))
}

func crashingChild(t *testing.T) {
	cli := dockerClient(t)
	m, err := sandbox.NewManager(cli, sandbox.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	img := baseImage(t, cli)
	a, err := m.Create(ctx, img)
	require.NoError(t, err)
	b, err := m.Create(ctx, img)
	require.NoError(t, err)
	snap, err := m.Snapshot(ctx, a)
	require.NoError(t, err)
	fmt.Printf("LEFTOVER %s\nLEFTOVER %s\nLEFTOVER %s\n", a.ID, b.ID, snap.Ref)
	_ = os.Stdout.Sync()
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestWarmPoolNeverHandsOutADeadSandbox(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	m := newManager(t, cli, sandbox.Config{})
	require.NoError(t, m.StartPool(img, 1))
	require.Eventually(t, func() bool { return m.PoolStats(img).Ready == 1 }, time.Minute, 50*time.Millisecond)

	// Kill the warm container behind the pool's back.
	ctx := context.Background()
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{Filters: make(client.Filters).Add("label", sandbox.LabelOwner+"="+m.Owner())})
	require.NoError(t, err)
	require.Len(t, list.Items, 1)
	_, err = cli.ContainerKill(ctx, list.Items[0].ID, client.ContainerKillOptions{Signal: "KILL"})
	require.NoError(t, err)

	// The stream closes a moment after the kill; from then on the dead
	// sandbox is discarded and a working one comes back.
	require.Eventually(t, func() bool {
		sb, err := m.Acquire(ctx, img)
		require.NoError(t, err)
		defer func() { require.NoError(t, m.Release(ctx, sb)) }()
		if sb.ID == list.Items[0].ID {
			return false
		}
		_, err = sb.Ping(ctx)
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
}

// TestReleasedSandboxesAreRecycledClean: a sandbox acquired from a pool
// goes back to it on release, reset, while the pool holds fewer than were
// ever held at once; the next rollout that gets it sees nothing of the
// last one: no file in any writable place, no process, no message queue,
// /workspace as the image has it.
func TestReleasedSandboxesAreRecycledClean(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	m := newManager(t, cli, sandbox.Config{ProvisionConcurrency: 2})
	require.NoError(t, m.StartPool(img, 1))
	require.Eventually(t, func() bool { return m.PoolStats(img).Ready == 1 }, time.Minute, 50*time.Millisecond)
	ctx := context.Background()
	a, err := m.Acquire(ctx, img)
	require.NoError(t, err)
	b, err := m.Acquire(ctx, img)
	require.NoError(t, err)
	require.Equal(t, 2, m.PoolStats(img).Peak)
	require.Eventually(t, func() bool { return m.PoolStats(img).Ready == 1 }, time.Minute, 50*time.Millisecond)

	before := string(run(t, a, "ls -la /workspace; cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem").Stdout)
	require.Equal(t, 0, run(t, a, "for d in /workspace /tmp /var/tmp /home/sandbox /dev/shm /dev/mqueue; do echo secret > $d/secret-of-a; done; "+
		"mkdir -p /workspace/deep/er && echo x > /workspace/deep/er/f && chmod -R a-w /workspace/deep; "+
		"setsid sleep 600 >/dev/null 2>&1 &").ExitCode)
	require.NoError(t, m.Release(ctx, a))
	st := m.PoolStats(img)
	require.Equal(t, 1, st.Recycled, "held twice at once, the pool keeps two: a goes back")
	require.Equal(t, 2, st.Ready)

	first, err := m.Acquire(ctx, img)
	require.NoError(t, err)
	second, err := m.Acquire(ctx, img)
	require.NoError(t, err)
	again := first
	if second.ID == a.ID {
		again = second
	}
	require.Equal(t, a.ID, again.ID, "the released container serves again")
	res := run(t, again, "cat /workspace/secret-of-a /tmp/secret-of-a /var/tmp/secret-of-a /home/sandbox/secret-of-a /dev/shm/secret-of-a /dev/mqueue/secret-of-a 2>/dev/null; "+
		"ls /workspace/deep 2>/dev/null; ps -o args | grep -c '^sleep 600'")
	require.Equal(t, "0\n", string(res.Stdout), "no file and no process of the last rollout survives")
	require.Equal(t, before, string(run(t, again, "ls -la /workspace; cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem").Stdout),
		"/workspace and the IPC namespace are as the image gave them")

	// Three were held at once: the queue keeps three, and a release
	// beyond them is removed.
	require.Equal(t, 3, m.PoolStats(img).Peak)
	for _, sb := range []*sandbox.Sandbox{b, first, second} {
		require.NoError(t, m.Release(ctx, sb))
	}
	st = m.PoolStats(img)
	require.Equal(t, [2]int{3, 1}, [2]int{st.Recycled, st.Removed})
	require.Eventually(t, func() bool { return m.PoolStats(img).Ready == 3 }, time.Minute, 50*time.Millisecond)
	_, err = cli.ContainerInspect(ctx, second.ID, client.ContainerInspectOptions{})
	require.Error(t, err, "the release the queue had no room for is removed")
}
