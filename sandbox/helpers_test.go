package sandbox_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

var (
	baseOnce sync.Once
	baseImg  sandbox.Image
	baseErr  error
)

// dockerClient connects to the real engine. Tests skip only when there is no
// engine socket at all; an engine that is there but broken fails them.
func dockerClient(t *testing.T) *client.Client {
	t.Helper()
	if os.Getenv("DOCKER_HOST") == "" {
		if _, err := os.Stat("/var/run/docker.sock"); err != nil {
			t.Skip("no Docker engine socket; sandbox tests need the real engine")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := sandbox.Connect(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func baseImage(t *testing.T, cli *client.Client) sandbox.Image {
	t.Helper()
	baseOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		baseImg, baseErr = sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{})
	})
	require.NoError(t, baseErr)
	return baseImg
}

func newManager(t *testing.T, cli *client.Client, cfg sandbox.Config) *sandbox.Manager {
	t.Helper()
	m, err := sandbox.NewManager(cli, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, m.Close(ctx))
	})
	return m
}

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
