package sandbox_test

import (
	"context"
	"testing"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/stretchr/testify/require"
)

// TestResetMakesAUsedSandboxClean dirties every writable place of a sandbox
// built from a prepared image, resets it and compares it with a fresh one.
func TestResetMakesAUsedSandboxClean(t *testing.T) {
	cli := dockerClient(t)
	m := newManager(t, cli, sandbox.Config{})
	ctx := context.Background()
	src := newSandbox(t, m, baseImage(t, cli))
	require.NoError(t, src.WriteFile(ctx, "repo/main.txt", []byte("pristine\n"), 0o644))
	img, err := m.Snapshot(ctx, src)
	require.NoError(t, err)
	var made []*sandbox.Sandbox
	t.Cleanup(func() {
		for _, sb := range made {
			require.NoError(t, m.Release(context.Background(), sb))
		}
		require.NoError(t, m.RemoveSnapshot(context.Background(), img))
	})

	// The processes are listed by the shell's own builtins, leaving out the
	// shell itself: a pipeline (ls /proc | grep) counts its own members or
	// not, depending on which of them started first.
	const state = "find /workspace /tmp /var/tmp /home/sandbox /dev/shm /dev/mqueue -mindepth 1 | sort; cat /workspace/repo/main.txt; " +
		`for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] || { read -r c < "$p/comm" && echo "$c"; } 2>/dev/null; done`
	fresh := newSandbox(t, m, img)
	made = append(made, fresh)
	clean := string(run(t, fresh, state).Stdout)
	require.Contains(t, clean, "/workspace/repo/main.txt\npristine\n")

	sb := newSandbox(t, m, img)
	made = append(made, sb)
	res := run(t, sb, "echo changed > repo/main.txt; mkdir -p junk/ro && chmod 555 junk/ro junk; "+
		"for d in /tmp /var/tmp /home/sandbox /dev/shm; do echo x > $d/.hidden; done; touch /dev/mqueue/q")
	require.Equal(t, 0, res.ExitCode, "%s", res.Stderr)
	_, err = sb.Exec(ctx, sandbox.ExecRequest{Cmd: "setsid sleep 600 >/dev/null 2>&1 &", KeepStrays: true})
	require.NoError(t, err)
	require.NotEqual(t, clean, string(run(t, sb, state).Stdout))

	require.NoError(t, sb.Reset(ctx))
	require.Equal(t, clean, string(run(t, sb, state).Stdout))
}
