package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func prometheusRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

// histogramMean is the mean capture batch size observed by m.
func histogramMean(m *metrics) float64 {
	n, sum := histogramTotals(m.captureBatch)
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// histogramTotals is h's sample count and sum so far.
func histogramTotals(h prometheus.Histogram) (uint64, float64) {
	var out dto.Metric
	if err := h.Write(&out); err != nil {
		return 0, 0
	}
	return out.Histogram.GetSampleCount(), out.Histogram.GetSampleSum()
}

// captureTotals snapshots the gateway's commits, rows and commit seconds,
// so a phase's mean batch and commit time are differences of two.
type captureTotals struct {
	commits    uint64
	rows       float64
	commitSecs float64
}

func captureSnapshot(m *metrics) captureTotals {
	n, rows := histogramTotals(m.captureBatch)
	_, secs := histogramTotals(m.captureCommit)
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
