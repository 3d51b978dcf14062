package sandbox_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/sandbox"
)

// TestConnectUsesTheConfiguredHost: docker.host wins over the
// environment's DOCKER_HOST.
func TestConnectUsesTheConfiguredHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	host := "unix://" + filepath.Join(t.TempDir(), "no-engine.sock")
	_, err := sandbox.Connect(ctx, host)
	require.ErrorContains(t, err, host)
}
