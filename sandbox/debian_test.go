package sandbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

var (
	pyOnce sync.Once
	pyImg  sandbox.Image
	pyErr  error
)

func pythonImage(t *testing.T, cli *client.Client) sandbox.Image {
	t.Helper()
	pyOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		pyImg, pyErr = sandbox.EnsureDebianImage(ctx, cli, sandbox.DebianImageOptions{})
	})
	require.NoError(t, pyErr)
	return pyImg
}

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
