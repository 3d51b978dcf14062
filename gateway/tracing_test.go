package gateway_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestModelCallSpans: each model call is one span with the GenAI
// semantic-convention attributes, a child of the caller's traceparent;
// its trace goes back to the caller and on to the upstream.
func TestModelCallSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newEnv(t, envOpts{tracer: tp, policy: true})
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	parent := "00-" + traceID + "-" + parentID + "-01"

	body := chatBody("trace me")
	body["max_tokens"], body["temperature"] = 32, 0.5
	st, hdr, raw := e.do("POST", "/v1/chat/completions", e.keyA, body, "traceparent", parent)
	require.Equal(t, 200, st, string(raw))
	require.Contains(t, hdr.Get("traceparent"), traceID, "the caller gets the call's trace")
	up := e.fixture.LastHeader("traceparent")
	require.Contains(t, up, traceID, "the upstream is asked within the caller's trace")
	require.NotContains(t, up, parentID, "as a child of the call's span")

	spans := rec.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	require.Equal(t, "chat "+fixtureModel, s.Name())
	require.Equal(t, trace.SpanKindClient, s.SpanKind())
	require.Equal(t, traceID, s.SpanContext().TraceID().String())
	require.Equal(t, parentID, s.Parent().SpanID().String())
	attrs := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		attrs[a.Key] = a.Value
	}
	require.Equal(t, "chat", attrs["gen_ai.operation.name"].AsString())
	require.Equal(t, "openai", attrs["gen_ai.provider.name"].AsString())
	require.Equal(t, fixtureModel, attrs["gen_ai.request.model"].AsString())
	require.Equal(t, fixtureModel, attrs["gen_ai.response.model"].AsString())
	require.EqualValues(t, 32, attrs["gen_ai.request.max_tokens"].AsInt64())
	require.Equal(t, 0.5, attrs["gen_ai.request.temperature"].AsFloat64())
	require.Positive(t, attrs["gen_ai.usage.input_tokens"].AsInt64())
	require.EqualValues(t, len("echo: trace me"), attrs["gen_ai.usage.output_tokens"].AsInt64())
	require.Equal(t, []string{"stop"}, attrs["gen_ai.response.finish_reasons"].AsStringSlice())
	require.NotEmpty(t, attrs["gen_ai.response.id"].AsString())
	require.NotEmpty(t, attrs["gen_ai.conversation.id"].AsString())

	// A failed call is an error span; a call without traceparent starts a trace.
	e.fixture.FailNext.Store(1)
	st, _, _ = e.do("POST", "/v1/chat/completions", e.keyA, chatBody("fails"))
	require.Equal(t, 503, st)
	spans = rec.Ended()
	require.Len(t, spans, 2)
	failed := spans[1]
	require.Equal(t, codes.Error, failed.Status().Code)
	require.False(t, failed.Parent().IsValid(), "no traceparent: a root span")
	var errType string
	for _, a := range failed.Attributes() {
		if a.Key == "error.type" {
			errType = a.Value.AsString()
		}
	}
	require.Equal(t, "upstream_error", errType)

	// The policy deployment, on Flywheel's own model server, is Flywheel's.
	st, _, raw = e.do("POST", "/v1/chat/completions", e.keyA, map[string]any{"model": policyModel, "max_tokens": 2,
		"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
	require.Equal(t, 200, st, string(raw))
	spans = rec.Ended()
	require.Len(t, spans, 3)
	var provider string
	for _, a := range spans[2].Attributes() {
		if a.Key == "gen_ai.provider.name" {
			provider = a.Value.AsString()
		}
	}
	require.Equal(t, "flywheel", provider)
}
