package chart_test

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/internal/chart"
)

func sample() chart.Chart {
	return chart.Chart{Title: "reward", XLabel: "minutes", YLabel: "mean reward", YMin: -1, YMax: 1, Series: []chart.Series{
		{Name: "v1", Points: []chart.Point{{X: 0, Y: 0.1}, {X: 1, Y: math.NaN()}, {X: 2, Y: 0.4}}},
		{Name: "v2", Points: []chart.Point{{X: 3, Y: 0.8}}, Dashes: []float64{2, 2}},
	}}
}

// TestSVGInlines checks the SVG is one self-contained element that names
// every series.
func TestSVGInlines(t *testing.T) {
	svg, err := sample().SVG(chart.DefaultWidth, chart.DefaultHeight)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(svg, "<svg"), svg[:min(len(svg), 80)])
	require.True(t, strings.HasSuffix(strings.TrimSpace(svg), "</svg>"))
	for _, want := range []string{">reward<", ">v1<", ">v2<", ">mean reward<"} {
		require.Contains(t, svg, want)
	}
	for _, external := range []string{"<?xml", "<!DOCTYPE", "href=", "url(", "<script"} {
		require.NotContains(t, svg, external)
	}
}

func TestSaveWritesTheFormatOfTheExtension(t *testing.T) {
	dir := t.TempDir()
	png, svg := filepath.Join(dir, "sub", "c.png"), filepath.Join(dir, "c.svg")
	require.NoError(t, sample().Save(png, chart.DefaultWidth, chart.DefaultHeight))
	require.NoError(t, sample().Save(svg, chart.DefaultWidth, chart.DefaultHeight))
	raw, err := os.ReadFile(png)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(raw, []byte("\x89PNG")))
	raw, err = os.ReadFile(svg)
	require.NoError(t, err)
	require.Contains(t, string(raw), "<svg")
}

func TestNoPointsIsAnError(t *testing.T) {
	c := chart.Chart{Title: "empty", Series: []chart.Series{{Name: "gaps only", Points: []chart.Point{{X: 1, Y: math.NaN()}}}}}
	_, err := c.SVG(chart.DefaultWidth, chart.DefaultHeight)
	require.ErrorIs(t, err, chart.ErrNoData)
	require.ErrorIs(t, c.Save(filepath.Join(t.TempDir(), "x.png"), chart.DefaultWidth, chart.DefaultHeight), chart.ErrNoData)
}
