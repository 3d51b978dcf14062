// Package sandboxtest gives tests the real Docker engine and the sandbox
// images, built once per test binary. Without an engine socket tests skip,
// unless FLYWHEEL_REQUIRE_SERVICES=1 (as `make test` and CI set it), in which
// case they fail.
package sandboxtest

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/sandbox"
)

// Docker connects to the engine, or skips t when there is none.
func Docker(t testing.TB) *client.Client {
	t.Helper()
	if os.Getenv("DOCKER_HOST") == "" {
		if _, err := os.Stat("/var/run/docker.sock"); err != nil {
			msg := "no Docker engine socket: sandbox tests need the real engine"
			if os.Getenv("FLYWHEEL_REQUIRE_SERVICES") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := sandbox.Connect(ctx, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Manager returns a manager that removes its sandboxes at cleanup.
func Manager(t testing.TB, cli *client.Client, cfg sandbox.Config) *sandbox.Manager {
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

type onceImage struct {
	once sync.Once
	img  sandbox.Image
	err  error
}

func (o *onceImage) get(t testing.TB, build func(ctx context.Context) (sandbox.Image, error)) sandbox.Image {
	t.Helper()
	o.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		o.img, o.err = build(ctx)
	})
	require.NoError(t, o.err)
	return o.img
}

var base, python onceImage

// BaseImage is the busybox base image.
func BaseImage(t testing.TB, cli *client.Client) sandbox.Image {
	return base.get(t, func(ctx context.Context) (sandbox.Image, error) {
		return sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{})
	})
}

// PythonImage is the Debian image with git, python3 and pytest.
func PythonImage(t testing.TB, cli *client.Client) sandbox.Image {
	return python.get(t, func(ctx context.Context) (sandbox.Image, error) {
		return sandbox.EnsureDebianImage(ctx, cli, sandbox.DebianImageOptions{})
	})
}
