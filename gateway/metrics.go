package gateway

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flywheel-ai/flywheel/store"
)

// metrics are the gateway's Prometheus series, on a registry of their own
// so several gateways (tests) can live in one process.
type metrics struct {
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	captureBatch  prometheus.Histogram
	captureCommit prometheus.Histogram
	tokens        *prometheus.CounterVec
	notices       *prometheus.CounterVec
	backendErrors *prometheus.CounterVec
	// usageRequests, usagePromptTokens and usageCompletionTokens are
	// usage_daily as it grows, by tenant, tenant key and model (usageLabels).
	usageRequests         *prometheus.CounterVec
	usagePromptTokens     *prometheus.CounterVec
	usageCompletionTokens *prometheus.CounterVec
}

// usageLabels label the usage series. key is the id of the tenant key a
// call is accounted to (store.KeyOwner.AccountTo: a session key's calls
// count to the key that made the session), never the secret and never a
// per-session key, so the series grow with tenant keys and deployments,
// not with sessions or traffic; model is a served deployment, as a name a
// client made up never reaches the capture.
var usageLabels = []string{"tenant", "key", "model"}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_requests_total", Help: "HTTP requests by route and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "flywheel_gateway_request_duration_seconds", Help: "HTTP request latency by route.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route"}),
		captureBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flywheel_gateway_capture_batch_size", Help: "Interactions committed per capture transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		captureCommit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "flywheel_gateway_capture_commit_seconds", Help: "Duration of one capture transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_tokens_total", Help: "Tokens served by deployment and kind (prompt, completion).",
		}, []string{"deployment", "kind"}),
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_session_notices_total", Help: "Session notices delivered to Temporal by outcome.",
		}, []string{"outcome"}),
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_backend_errors_total", Help: "Inference backend failures by deployment and status.",
		}, []string{"deployment", "status"}),
		usageRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_usage_requests_total", Help: "Model calls captured (failed ones too) by tenant, tenant key id and model.",
		}, usageLabels),
		usagePromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_usage_prompt_tokens_total", Help: "Prompt tokens of captured model calls by tenant, tenant key id and model.",
		}, usageLabels),
		usageCompletionTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flywheel_gateway_usage_completion_tokens_total", Help: "Completion tokens of captured model calls by tenant, tenant key id and model.",
		}, usageLabels),
	}
	reg.MustRegister(m.requests, m.latency, m.captureBatch, m.captureCommit, m.tokens, m.notices, m.backendErrors,
		m.usageRequests, m.usagePromptTokens, m.usageCompletionTokens)
	return m
}

// account counts one captured model call, as the capture counted it in
// usage_daily.
func (m *metrics) account(row *store.NewInteraction) {
	labels := []string{row.TenantID, strconv.FormatInt(row.KeyID, 10), row.Deployment}
	m.usageRequests.WithLabelValues(labels...).Inc()
	m.usagePromptTokens.WithLabelValues(labels...).Add(float64(row.PromptTokens))
	m.usageCompletionTokens.WithLabelValues(labels...).Add(float64(row.CompletionTokens))
}

// observe is the middleware recording every request.
func (m *metrics) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
	m.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
}
