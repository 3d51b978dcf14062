package gateway

import (
	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/flywheel-ai/flywheel/config"
	"github.com/flywheel-ai/flywheel/store"
)

// Tracing: one span per model call, with the OpenTelemetry GenAI semantic
// conventions' attributes, a child of the caller's traceparent; the span's
// own traceparent goes back to the caller and on to an upstream.

const tracerName = "github.com/flywheel-ai/flywheel/gateway"

// propagator reads and writes W3C trace context, whatever the process's
// global propagator is.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

func (s *Server) tracer() trace.Tracer {
	tp := s.deps.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// traceContext puts the caller's traceparent (if any) into the request's
// context.
func traceContext(c *gin.Context) {
	ctx := propagator.Extract(c.Request.Context(), propagation.HeaderCarrier(c.Request.Header))
	c.Request = c.Request.WithContext(ctx)
	c.Next()
}

// GenAI semantic-convention attribute names.
const (
	attrOperation      = "gen_ai.operation.name"
	attrProvider       = "gen_ai.provider.name"
	attrRequestModel   = "gen_ai.request.model"
	attrResponseModel  = "gen_ai.response.model"
	attrResponseID     = "gen_ai.response.id"
	attrFinishReasons  = "gen_ai.response.finish_reasons"
	attrInputTokens    = "gen_ai.usage.input_tokens"
	attrOutputTokens   = "gen_ai.usage.output_tokens"
	attrMaxTokens      = "gen_ai.request.max_tokens"
	attrTemperature    = "gen_ai.request.temperature"
	attrTopP           = "gen_ai.request.top_p"
	attrConversationID = "gen_ai.conversation.id"
	attrErrorType      = "error.type"
)

// startSpan opens the call's span once its route is known; the backend
// call and the capture run under it.
func (s *Server) startSpan(c *gin.Context, cl *call) {
	provider := providerOf(s.cfg, cl.target.deployment)
	attrs := []attribute.KeyValue{
		attribute.String(attrOperation, "chat"), attribute.String(attrProvider, provider),
		attribute.String(attrRequestModel, cl.req.Model), attribute.String(attrResponseID, cl.completionID),
		attribute.String(attrConversationID, cl.sessionID), attribute.String("flywheel.protocol", cl.protocol),
		attribute.String("flywheel.tenant", cl.p.TenantID), attribute.Bool("flywheel.stream", cl.stream),
	}
	if cl.req.MaxTokens > 0 {
		attrs = append(attrs, attribute.Int(attrMaxTokens, cl.req.MaxTokens))
	}
	if t := cl.req.Temperature; t != nil {
		attrs = append(attrs, attribute.Float64(attrTemperature, *t))
	}
	if p := cl.req.TopP; p != nil {
		attrs = append(attrs, attribute.Float64(attrTopP, *p))
	}
	ctx, span := s.tracer().Start(c.Request.Context(), "chat "+cl.req.Model,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	c.Request = c.Request.WithContext(ctx)
	cl.span = span
	// Before any byte of a stream goes out.
	propagator.Inject(ctx, propagation.HeaderCarrier(c.Writer.Header()))
}

// providerOf names the GenAI provider of a deployment: the policy model
// (config's policy_model, served by Flywheel's own model server) is
// "flywheel"; every other deployment is an OpenAI-compatible upstream.
func providerOf(cfg config.GatewayConfig, deployment string) string {
	if deployment == cfg.PolicyModel {
		return "flywheel"
	}
	return "openai"
}

// endSpan records what the call produced (and a capture that failed) and
// closes its span.
func endSpan(cl *call, row *store.NewInteraction, captureErr error) {
	if cl.span == nil {
		return
	}
	cl.span.SetAttributes(attribute.String(attrResponseModel, row.ModelVersion),
		attribute.Int(attrInputTokens, row.PromptTokens), attribute.Int(attrOutputTokens, row.CompletionTokens),
		attribute.String("flywheel.status", row.Status))
	if row.FinishReason != "" {
		cl.span.SetAttributes(attribute.StringSlice(attrFinishReasons, []string{row.FinishReason}))
	}
	switch {
	case row.Status != statusOK:
		cl.span.SetAttributes(attribute.String(attrErrorType, row.Status))
		cl.span.SetStatus(codes.Error, row.Error)
	case captureErr != nil:
		cl.span.SetAttributes(attribute.String(attrErrorType, "capture"))
		cl.span.SetStatus(codes.Error, captureErr.Error())
	}
	cl.span.End()
}
