package gateway

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
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
}

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
	}
	reg.MustRegister(m.requests, m.latency, m.captureBatch, m.captureCommit, m.tokens, m.notices, m.backendErrors)
	return m
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
