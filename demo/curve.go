package demo

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("write curve: %w", err)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "minutes"
	p.Y.Label.Text = "rate (%)"
	p.Y.Min, p.Y.Max = 0, 104 // headroom: a safety line at 100% stays visible
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	// Bottom right: rising curves leave that corner empty.
	p.Legend.Top = false
	p.Legend.Left = false

	series := []struct {
		name  string
		value func(CurvePoint) float64
		col   color.Color
		dash  []vg.Length
	}{
		{"held-out success (greedy)", func(c CurvePoint) float64 { return c.Success }, color.RGBA{R: 31, G: 119, B: 180, A: 255}, nil},
		{"safety suite", func(c CurvePoint) float64 { return c.Safety }, color.RGBA{R: 44, G: 160, B: 44, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}},
		{"agents' live success (sampled)", func(c CurvePoint) float64 { return c.Live }, color.RGBA{R: 255, G: 127, B: 14, A: 255}, []vg.Length{vg.Points(2), vg.Points(2)}},
	}
	for _, s := range series {
		xys := make(plotter.XYs, 0, len(pts))
		for _, c := range pts {
			v := s.value(c)
			if math.IsNaN(v) || v < 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: c.Minutes, Y: 100 * v})
		}
		if len(xys) == 0 {
			continue
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return "", "", fmt.Errorf("write curve: %s: %w", s.name, err)
		}
		line.Color = s.col
		line.Width = vg.Points(2)
		line.Dashes = s.dash
		p.Add(line)
		p.Legend.Add(s.name, line)
	}
	p.Legend.ThumbnailWidth = vg.Points(24)
	p.Legend.Padding = vg.Points(2)
	p.Legend.YOffs = vg.Points(8)
	p.Legend.XOffs = -vg.Points(4)

	pngPath, svgPath = filepath.Join(dir, CurvePNG), filepath.Join(dir, CurveSVG)
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, pngPath); err != nil {
		return "", "", fmt.Errorf("write curve png: %w", err)
	}
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, svgPath); err != nil {
		return "", "", fmt.Errorf("write curve svg: %w", err)
	}
	return pngPath, svgPath, nil
}
