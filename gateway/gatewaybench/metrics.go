package gatewaybench

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The gateway's capture metrics, as it registers them.
const (
	metricCaptureBatch  = "flywheel_gateway_capture_batch_size"
	metricCaptureCommit = "flywheel_gateway_capture_commit_seconds"
)

// histogramMean is h's mean observation so far.
func histogramMean(h prometheus.Histogram) float64 {
	var out dto.Metric
	if err := h.Write(&out); err != nil || out.Histogram.GetSampleCount() == 0 {
		return 0
	}
	return out.Histogram.GetSampleSum() / float64(out.Histogram.GetSampleCount())
}

// gathered is the sample count and sum of the histogram named name in reg.
func gathered(reg prometheus.Gatherer, name string) (uint64, float64) {
	families, err := reg.Gather()
	if err != nil {
		return 0, 0
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// captureTotals snapshots the gateway's commits, rows and commit seconds,
// so a phase's mean batch and commit time are differences of two.
type captureTotals struct {
	commits    uint64
	rows       float64
	commitSecs float64
}

func captureSnapshot(reg prometheus.Gatherer) captureTotals {
	n, rows := gathered(reg, metricCaptureBatch)
	_, secs := gathered(reg, metricCaptureCommit)
	return captureTotals{commits: n, rows: rows, commitSecs: secs}
}

// since is the mean batch and mean commit time (ms) between two snapshots.
func (t captureTotals) since(before captureTotals) (meanBatch, meanCommitMS float64) {
	n := float64(t.commits - before.commits)
	if n == 0 {
		return 0, 0
	}
	return (t.rows - before.rows) / n, (t.commitSecs - before.commitSecs) / n * 1000
}
