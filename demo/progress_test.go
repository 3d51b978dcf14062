package demo

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/demo/rehearsal"
	"github.com/flywheel-ai/flywheel/internal/progress"
)

func TestProgressTerminalRedrawsInPlace(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, true, 10*time.Minute, 0)
	p.Update(Status{Elapsed: 5 * time.Minute, Success: 0.42, Safety: 1, Version: "flywheel-policy@v12", Note: "step 40"})
	p.Update(Status{Elapsed: 6 * time.Minute, Success: 0.5, Safety: 1, Version: "flywheel-policy@v13"})
	p.Done(Status{Elapsed: 10 * time.Minute, Success: 0.9, Safety: 1, Version: "flywheel-policy@v20"})
	out := buf.String()
	require.Equal(t, 3, strings.Count(out, "\r\x1b[2K"), "every update redraws the same line")
	require.Equal(t, 1, strings.Count(out, "\n"), "only Done ends the line")
	require.Contains(t, out, " 50% 5:00/10:00  success  42.0%  safety 100.0%  serving flywheel-policy@v12  step 40")
	require.Contains(t, out, "100% 10:00/10:00  success  90.0%")
	require.Contains(t, out, strings.Repeat("█", progress.Width))
}

func TestProgressPlainLinesAreSpaced(t *testing.T) {
	var buf bytes.Buffer
	p := NewProgress(&buf, false, time.Minute, time.Hour)
	for i := 0; i < 50; i++ {
		p.Update(Status{Elapsed: time.Duration(i) * time.Second, Success: float64(i) / 100})
	}
	p.Done(Status{Elapsed: time.Minute, Success: 0.77, Version: "v9"})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 2, "one line per interval plus the final one")
	require.NotContains(t, buf.String(), "\x1b")
	require.Contains(t, lines[1], "success  77.0%")
	require.Contains(t, lines[1], "serving v9")
	require.Contains(t, lines[0], "serving -")
}

func TestCurveAndStatusPage(t *testing.T) {
	dir := t.TempDir()
	pts := []CurvePoint{{0, 0.1, 1, math.NaN()}, {1, 0.3, 1, 0.2}, {2, 0.8, 0.97, 0.7}, {3, 0.95, 1, 0.9}}
	png, svg, err := WriteCurve(dir, "test curve", pts)
	require.NoError(t, err)
	raw, err := os.ReadFile(png)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(raw, []byte("\x89PNG")), "a PNG file")
	require.Greater(t, len(raw), 10_000)
	s, err := os.ReadFile(svg)
	require.NoError(t, err)
	require.Contains(t, string(s), "<svg")
	require.Contains(t, string(s), "held-out success")

	_, _, err = WriteCurve(dir, "empty", nil)
	require.Error(t, err)

	sum := Summary{Mode: "offline", SuccessStart: 0.1, SuccessEnd: 0.95, SafetyStart: 1, SafetyEnd: 1, VersionsPromoted: 3, ServingVersion: "p@v30"}
	page := StatusPage{Title: "t", Generated: time.Now(), ModelName: "p", Summary: sum, CurveSVG: inlineSVG(svg),
		Points:   []rehearsal.Point{{Step: 0, Success: 0.1, Safety: 1}, {Step: 10, Candidate: 10, Decision: rehearsal.DecisionPromote, Version: 10, Success: 0.5, Safety: 1}},
		Sessions: []SessionRow{{ID: "s1", Prompt: "<b>abc", Answer: "cba", Reward: 1, Version: "p@v10"}}}
	path := filepath.Join(dir, StatusFile)
	require.NoError(t, WriteStatusPage(path, page))
	html, err := os.ReadFile(path)
	require.NoError(t, err)
	h := string(html)
	require.Contains(t, h, "10.0% → <b>95.0%</b>")
	require.Contains(t, h, `class="promote"`)
	require.Contains(t, h, "p@v10")
	require.Contains(t, h, "&lt;b&gt;abc", "prompts are escaped")
	require.Contains(t, h, "<svg")
	require.NotContains(t, h, "<?xml")

	js := sum.JSON()
	var back map[string]any
	require.NoError(t, json.Unmarshal([]byte(js), &back))
	for _, k := range []string{"success_start", "success_end", "safety_start", "safety_end", "versions_promoted", "versions_rolled_back"} {
		require.Contains(t, back, k)
	}
}

func TestVersionMoves(t *testing.T) {
	p, r := versionMoves([]string{"m@v0", "m@v5", "m@v10"}, "m@v10")
	require.Equal(t, 2, p)
	require.Zero(t, r)
	p, r = versionMoves([]string{"m@v0", "m@v5", "m@v10"}, "m@v5")
	require.Equal(t, 2, p)
	require.Equal(t, 1, r)
	p, r = versionMoves(nil, "")
	require.Zero(t, p+r)
	p, _ = versionMoves([]string{"a", "b"}, "b")
	require.Equal(t, 1, p)
}
