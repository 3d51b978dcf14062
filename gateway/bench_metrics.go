package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func prometheusRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

// histogramMean is the mean capture batch size observed by m.
func histogramMean(m *metrics) float64 {
	var out dto.Metric
	if err := m.captureBatch.Write(&out); err != nil || out.Histogram.GetSampleCount() == 0 {
		return 0
	}
	return out.Histogram.GetSampleSum() / float64(out.Histogram.GetSampleCount())
}
