package testenv

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"

	"github.com/flywheel-ai/flywheel/flow"
)

// TemporalNamespace is the namespace test dev servers create.
const TemporalNamespace = "flywheel"

// Temporal starts a real Temporal dev server for t from the cached CLI
// (FLYWHEEL_TEMPORAL_CLI; the SDK's own download cannot work offline), with
// the flywheel namespace and search attributes, and returns a client to it.
// The server stops at cleanup.
func Temporal(t testing.TB) client.Client {
	t.Helper()
	c, _ := TemporalServer(t)
	return c
}

// TemporalServer is Temporal, also returning the server's host:port for
// code that dials it itself.
func TemporalServer(t testing.TB) (client.Client, string) {
	t.Helper()
	cli := Need(t, "FLYWHEEL_TEMPORAL_CLI")
	args := []string{"--log-level", "error"}
	for name, typ := range flow.SearchAttributes() {
		args = append(args, "--search-attribute", name+"="+typ.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := testsuite.StartDevServer(ctx, testsuite.DevServerOptions{
		ExistingPath:  cli,
		ClientOptions: &client.Options{Namespace: TemporalNamespace, Logger: tlog.NewStructuredLogger(slog.New(slog.DiscardHandler))},
		LogLevel:      "error",
		ExtraArgs:     args,
	})
	require.NoError(t, err, "start temporal dev server")
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Logf("stop temporal dev server: %v", err)
		}
	})
	return srv.Client(), srv.FrontendHostPort()
}
