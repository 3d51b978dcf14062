package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/internal/testenv"
	"github.com/flywheel-ai/flywheel/worker"
)

// TestDialTracesTemporalCallsWhenACollectorIsConfigured: with an OTLP
// collector configured, the Temporal client carries OpenTelemetry's
// interceptor (a workflow start is a span); without one it does not.
func TestDialTracesTemporalCallsWhenACollectorIsConfigured(t *testing.T) {
	ctx := context.Background()
	_, addr := testenv.TemporalServer(t)
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	start := func(id string) {
		c, err := worker.Dial(ctx, addr, testenv.TemporalNamespace, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		defer c.Close()
		_, err = c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "tracing-test"}, "NoWorkerRunsThis")
		require.NoError(t, err)
	}
	start("untraced")
	require.Empty(t, rec.Ended(), "no collector, no interceptor")

	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	start("traced")
	var names []string
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	require.True(t, strings.Contains(strings.Join(names, " "), "StartWorkflow:NoWorkerRunsThis"), "spans: %v", names)
}
