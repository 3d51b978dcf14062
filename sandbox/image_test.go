package sandbox_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

func TestConnectNegotiatesDaemonVersion(t *testing.T) {
	cli := dockerClient(t)
	// The client starts at its newest version; after Connect it must speak
	// no newer than the daemon, or every call would be rejected.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := cli.ServerVersion(ctx, client.ServerVersionOptions{})
	require.NoError(t, err)
	require.LessOrEqual(t, versionNumber(t, cli.ClientVersion()), versionNumber(t, v.APIVersion))
}

func TestBaseImageBuildsLocallyAndRuns(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	require.True(t, strings.HasPrefix(img.Ref, "flywheel-sandbox/base:"))
	require.True(t, img.HasAgent)

	// Cached by content hash: a second call builds nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	again, err := sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{})
	require.NoError(t, err)
	require.False(t, again.Built)
	require.Equal(t, img.Ref, again.Ref)

	m := newManager(t, cli, sandbox.Config{})
	sb := newSandbox(t, m, img)
	res := run(t, sb, "echo hello; echo oops >&2; exit 3")
	require.Equal(t, 3, res.ExitCode)
	require.Equal(t, "hello\n", string(res.Stdout))
	require.Equal(t, "oops\n", string(res.Stderr))
	require.Equal(t, "/workspace\n", string(run(t, sb, "pwd").Stdout))
}

// versionNumber turns "1.41" into 1041 for comparison.
func versionNumber(t *testing.T, v string) int {
	t.Helper()
	major, minor, ok := strings.Cut(v, ".")
	require.True(t, ok, "version %q", v)
	a, err := strconv.Atoi(major)
	require.NoError(t, err)
	b, err := strconv.Atoi(minor)
	require.NoError(t, err)
	return a*1000 + b
}

func TestRegistryImageIsPreferredWhenPresent(t *testing.T) {
	cli := dockerClient(t)
	img := baseImage(t, cli)
	ctx := context.Background()
	// No registry here: a locally tagged image stands for one already pulled.
	const ref = "flywheel-sandbox/registry-test:1"
	_, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: img.Ref, Target: ref})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{}) })

	got, err := sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{RegistryImage: ref})
	require.NoError(t, err)
	require.Equal(t, ref, got.Ref)
	require.True(t, got.HasAgent, "the agent is detected from the image's command")

	// An unreachable registry image falls back to the local build.
	got, err = sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{RegistryImage: "127.0.0.1:1/nope:1"})
	require.NoError(t, err)
	require.Equal(t, img.Ref, got.Ref)
}
