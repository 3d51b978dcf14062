package sandbox_test

import (
	"testing"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/stretchr/testify/require"
)

func TestDebianImageHasGitPythonPytest(t *testing.T) {
	cli := dockerClient(t)
	img := pythonImage(t, cli)
	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, img)
	res := run(t, sb, "git --version && python3 -c 'import pytest; print(pytest.__version__)' && id -un")
	require.Equal(t, 0, res.ExitCode, "stderr: %s", res.Stderr)
	require.Contains(t, string(res.Stdout), "git version")
	require.Contains(t, string(res.Stdout), "sandbox")
	// A real socket attempt fails: there is no network at all.
	res = run(t, sb, `python3 -c 'import socket; socket.create_connection(("1.1.1.1", 80), timeout=3)'`)
	require.NotEqual(t, 0, res.ExitCode)
	require.Contains(t, string(res.Stderr), "Network is unreachable")
}
