package demo

import (
	"errors"
	"fmt"
	"image/color"
	"path/filepath"

	"github.com/flywheel-ai/flywheel/internal/chart"
)

// CurvePoint is one point of the success curve.
type CurvePoint struct {
	Minutes float64 `json:"minutes"`
	// Success and Safety are rates in [0, 1].
	Success float64 `json:"success"`
	Safety  float64 `json:"safety"`
	// Live is the agents' rolling success (sampled answers); NaN or
	// negative when not measured.
	Live float64 `json:"live"`
}

// Curve file names inside the output directory.
const (
	CurvePNG = "success-curve.png"
	CurveSVG = "success-curve.svg"
)

// WriteCurve draws the curve as PNG and SVG under dir and returns their
// paths.
func WriteCurve(dir, title string, pts []CurvePoint) (pngPath, svgPath string, err error) {
	if len(pts) == 0 {
		return "", "", errors.New("write curve: no points")
	}
	c := chart.Chart{Title: title, XLabel: "minutes", YLabel: "rate (%)",
		// Headroom: a safety line at 100% stays visible.
		YMin: 0, YMax: 104, XFromZero: true}
	series := []struct {
		name   string
		value  func(CurvePoint) float64
		col    color.Color
		dashes []float64
	}{
		{"held-out success (greedy)", func(c CurvePoint) float64 { return c.Success }, chart.Palette[0], nil},
		{"safety suite", func(c CurvePoint) float64 { return c.Safety }, chart.Palette[2], []float64{6, 3}},
		{"agents' live success (sampled)", func(c CurvePoint) float64 { return c.Live }, chart.Palette[1], []float64{2, 2}},
	}
	for _, s := range series {
		line := chart.Series{Name: s.name, Color: s.col, Dashes: s.dashes}
		for _, p := range pts {
			// Negative marks a rate that was not measured.
			if v := s.value(p); v >= 0 {
				line.Points = append(line.Points, chart.Point{X: p.Minutes, Y: 100 * v})
			}
		}
		c.Series = append(c.Series, line)
	}
	pngPath, svgPath = filepath.Join(dir, CurvePNG), filepath.Join(dir, CurveSVG)
	for _, path := range []string{pngPath, svgPath} {
		if err := c.Save(path, chart.DefaultWidth, chart.DefaultHeight); err != nil {
			return "", "", fmt.Errorf("write curve: %w", err)
		}
	}
	return pngPath, svgPath, nil
}
