package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/sandboxtest"
	"github.com/stretchr/testify/require"
)

var (
	dockerClient = sandboxtest.Docker
	baseImage    = sandboxtest.BaseImage
	pythonImage  = sandboxtest.PythonImage
	newManager   = sandboxtest.Manager
)

func newSandbox(t *testing.T, m *sandbox.Manager, img sandbox.Image) *sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sb, err := m.Create(ctx, img)
	require.NoError(t, err)
	return sb
}

func run(t *testing.T, sb *sandbox.Sandbox, cmd string) sandbox.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: cmd, Timeout: 30 * time.Second})
	require.NoError(t, err)
	return res
}
