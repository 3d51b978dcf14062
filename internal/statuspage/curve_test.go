package statuspage

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/statusapi"
)

// TestCurveChartSeries checks the page's curve: one line per version in
// version order, labelled serving / canary, and a dashed mean weighted by
// how many interactions each version scored in a bucket.
func TestCurveChartSeries(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	d := statusapi.DeploymentStatus{Name: "dep", ServingVersion: "dep@v2", Canary: &statusapi.CanaryStatus{Candidate: "dep@v10", Share: 0.2},
		Curve: statusapi.Curve{BucketSeconds: 30, Points: []statusapi.CurvePoint{
			{Start: t0, Version: "dep@v2", Rewarded: 3, MeanReward: 0.5},
			{Start: t0, Version: "dep@v10", Rewarded: 1, MeanReward: -0.5},
			{Start: t0.Add(90 * time.Second), Version: "dep@v10", Rewarded: 2, MeanReward: 1},
		}}}
	c := curveChart(d)
	require.Contains(t, c.XLabel, "2026-01-02 03:04:00 UTC (30 s buckets)")
	require.Len(t, c.Series, 3)
	require.Equal(t, "dep@v2 (serving)", c.Series[0].Name, "v2 before v10: by number, not by text")
	require.Equal(t, "dep@v10 (canary)", c.Series[1].Name)
	require.Equal(t, []float64{0, 1.5}, []float64{c.Series[1].Points[0].X, c.Series[1].Points[1].X}, "minutes since the first bucket")
	mean := c.Series[2]
	require.Equal(t, "all versions", mean.Name)
	require.NotEmpty(t, mean.Dashes)
	require.Len(t, mean.Points, 2)
	require.InDelta(t, (3*0.5+1*-0.5)/4, mean.Points[0].Y, 1e-12)
	require.InDelta(t, 1, mean.Points[1].Y, 1e-12)
	require.LessOrEqual(t, c.YMin, -0.5)
	require.GreaterOrEqual(t, c.YMax, 1.0)

	// One version: no mean line, and no label it does not have.
	d.Curve.Points = d.Curve.Points[:1]
	d.ServingVersion = "dep@v1"
	c = curveChart(d)
	require.Len(t, c.Series, 1)
	require.Equal(t, "dep@v2", c.Series[0].Name)
	require.InDelta(t, 0.5, c.Series[0].Points[0].Y, 1e-12)
}
