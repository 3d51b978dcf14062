// Package chart draws line charts with gonum/plot: the demo's success curve
// files and the curve the gateway's status page inlines. It owns only the
// drawing; callers decide what the series mean.
package chart

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Default size of a chart: wide enough for a minutes axis, short enough to
// sit above a table.
const (
	DefaultWidth  = 8 * vg.Inch
	DefaultHeight = 4.5 * vg.Inch
)

// Point is one (x, y) sample; a NaN y is a gap, not a zero.
type Point struct{ X, Y float64 }

// Series is one line.
type Series struct {
	Name   string
	Points []Point
	// Color of the line; nil picks the next colour of Palette.
	Color color.Color
	// Dashes as on/off lengths in points; empty draws a solid line.
	Dashes []float64
}

// Chart is a titled set of lines over shared axes.
type Chart struct {
	Title, XLabel, YLabel string
	// YMin and YMax fix the y range when YMax > YMin; otherwise it fits the
	// data.
	YMin, YMax float64
	// XFromZero starts the x axis at 0 (rates over elapsed time read best
	// from the start).
	XFromZero bool
	Series    []Series
}

// Palette is the colour cycle for series without a colour (matplotlib's
// tab10, which stays distinguishable for about ten lines).
var Palette = []color.Color{
	color.RGBA{R: 31, G: 119, B: 180, A: 255},
	color.RGBA{R: 255, G: 127, B: 14, A: 255},
	color.RGBA{R: 44, G: 160, B: 44, A: 255},
	color.RGBA{R: 214, G: 39, B: 40, A: 255},
	color.RGBA{R: 148, G: 103, B: 189, A: 255},
	color.RGBA{R: 140, G: 86, B: 75, A: 255},
	color.RGBA{R: 227, G: 119, B: 194, A: 255},
	color.RGBA{R: 127, G: 127, B: 127, A: 255},
	color.RGBA{R: 188, G: 189, B: 34, A: 255},
	color.RGBA{R: 23, G: 190, B: 207, A: 255},
}

// ErrNoData is returned for a chart without a single drawable point.
var ErrNoData = errors.New("chart: no points to draw")

func (c Chart) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	if c.YMax > c.YMin {
		p.Y.Min, p.Y.Max = c.YMin, c.YMax
	}
	if c.XFromZero {
		p.X.Min = 0
	}
	p.Add(plotter.NewGrid())
	// Bottom right: rising curves leave that corner empty.
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.ThumbnailWidth = vg.Points(24)
	p.Legend.Padding = vg.Points(2)
	p.Legend.YOffs = vg.Points(8)
	p.Legend.XOffs = -vg.Points(4)

	drawn, auto := 0, 0
	for _, s := range c.Series {
		xys := make(plotter.XYs, 0, len(s.Points))
		for _, pt := range s.Points {
			if math.IsNaN(pt.Y) || math.IsInf(pt.Y, 0) || math.IsNaN(pt.X) || math.IsInf(pt.X, 0) {
				continue
			}
			xys = append(xys, plotter.XY{X: pt.X, Y: pt.Y})
		}
		if len(xys) == 0 {
			continue
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, fmt.Errorf("chart %q: series %q: %w", c.Title, s.Name, err)
		}
		line.Color = s.Color
		if line.Color == nil {
			line.Color = Palette[auto%len(Palette)]
			auto++
		}
		line.Width = vg.Points(2)
		for _, d := range s.Dashes {
			line.Dashes = append(line.Dashes, vg.Points(d))
		}
		p.Add(line)
		// A lone point draws no line segment: mark it so it shows.
		if len(xys) == 1 {
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, fmt.Errorf("chart %q: series %q: %w", c.Title, s.Name, err)
			}
			sc.Color = line.Color
			p.Add(sc)
		}
		if s.Name != "" {
			p.Legend.Add(s.Name, line)
		}
		drawn++
	}
	if drawn == 0 {
		return nil, ErrNoData
	}
	return p, nil
}

// Save writes the chart to path in the format its extension names (.png,
// .svg, .pdf, …).
func (c Chart) Save(path string, width, height vg.Length) error {
	p, err := c.plot()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("save chart: %w", err)
	}
	if err := p.Save(width, height, path); err != nil {
		return fmt.Errorf("save chart %s: %w", path, err)
	}
	return nil
}

// SVG renders the chart as one <svg> element (no XML prolog), ready to
// inline in an HTML page: it references no file, font or script outside
// itself.
func (c Chart) SVG(width, height vg.Length) (string, error) {
	p, err := c.plot()
	if err != nil {
		return "", err
	}
	wt, err := p.WriterTo(width, height, "svg")
	if err != nil {
		return "", fmt.Errorf("render chart %q: %w", c.Title, err)
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return "", fmt.Errorf("render chart %q: %w", c.Title, err)
	}
	return InlineSVG(buf.String()), nil
}

// InlineSVG strips what precedes the <svg> element of an SVG document (the
// XML prolog and doctype), which HTML does not want inline.
func InlineSVG(doc string) string {
	if i := strings.Index(doc, "<svg"); i >= 0 {
		return doc[i:]
	}
	return doc
}
