package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"sync"
	"time"
)

// Summary is the demo's result; the --json line is this object.
type Summary struct {
	Mode    string  `json:"mode"`
	Minutes float64 `json:"minutes"`
	// SuccessStart/End are the serving version's held-out success at the
	// start and the end; SafetyStart/End its safety-suite score.
	SuccessStart float64 `json:"success_start"`
	SuccessEnd   float64 `json:"success_end"`
	SafetyStart  float64 `json:"safety_start"`
	SafetyEnd    float64 `json:"safety_end"`
	// VersionsPromoted and VersionsRolledBack count gate decisions;
	// VersionsHeld counts candidates that were not released.
	VersionsPromoted   int     `json:"versions_promoted"`
	VersionsRolledBack int     `json:"versions_rolled_back"`
	VersionsHeld       int     `json:"versions_held"`
	ServingVersion     string  `json:"serving_version"`
	TrainSteps         int     `json:"train_steps"`
	SampledAnswers     int     `json:"sampled_answers"`
	Params             int     `json:"params"`
	BaseBuildSeconds   float64 `json:"base_build_seconds"`
	BaseCached         bool    `json:"base_cached"`
	WallSeconds        float64 `json:"wall_seconds"`
	CurvePNG           string  `json:"curve_png"`
	CurveSVG           string  `json:"curve_svg"`
	StatusHTML         string  `json:"status_html"`
	// LiveSuccessEnd is the agents' own sampled success over their last
	// answers (online mode; temperature 1, so below the greedy score).
	LiveSuccessEnd float64 `json:"live_success_end"`
	// StatusURL is the gateway's live status page (online mode).
	StatusURL string       `json:"status_url,omitempty"`
	Curve     []CurvePoint `json:"curve"`
}

// JSON is the summary as one line.
func (s Summary) JSON() string {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Sprintf(`{"error":%q}`, err.Error())
	}
	return string(b)
}

// OfflineConfig configures the in-process demo: no gateway, the rehearsal
// loop with its gate stands in for the control plane.
type OfflineConfig struct {
	Rehearsal RehearsalConfig
	// OutDir receives the curve and the status page. Required.
	OutDir string
	// Progress receives the progress bar; nil means none.
	Progress io.Writer
	// TTY redraws the bar in place.
	TTY bool
	// ProgressInterval spaces non-terminal progress lines. Default 10s.
	ProgressInterval time.Duration
	// ModelName names versions in the output. Default "flywheel-policy".
	ModelName string
}

// RunOffline runs the rehearsal with live progress and writes the curve
// (PNG, SVG) and a static status page.
func RunOffline(ctx context.Context, cfg OfflineConfig) (Summary, error) {
	if cfg.OutDir == "" {
		return Summary{}, errors.New("offline demo: out dir is required")
	}
	if cfg.ModelName == "" {
		cfg.ModelName = "flywheel-policy"
	}
	rc := cfg.Rehearsal.withDefaults()
	if err := rc.validate(); err != nil {
		return Summary{}, fmt.Errorf("offline demo: %w", err)
	}
	name := func(v int64) string { return fmt.Sprintf("%s@v%d", cfg.ModelName, v) }

	var prog *Progress
	var mu sync.Mutex
	status := Status{Note: "building the base policy"}
	var loopStart time.Time
	if cfg.Progress != nil {
		prog = NewProgress(cfg.Progress, cfg.TTY, rc.Budget, cfg.ProgressInterval)
		prog.Update(status)
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			// Between gate points only the clock moves; keep the bar alive.
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					mu.Lock()
					if !loopStart.IsZero() {
						status.Elapsed = time.Since(loopStart)
					}
					s := status
					mu.Unlock()
					prog.Update(s)
				}
			}
		}()
	}
	res, err := Rehearse(ctx, rc, nil, func(p Point) {
		mu.Lock()
		if loopStart.IsZero() {
			loopStart = time.Now().Add(-p.Elapsed)
		}
		status = Status{Elapsed: p.Elapsed, Success: p.Success, Safety: p.Safety, Version: name(p.Version),
			Note: fmt.Sprintf("step %d", p.Step)}
		if p.Decision != "" {
			status.Note += fmt.Sprintf(", v%d %s", p.Candidate, p.Decision)
		}
		s := status
		mu.Unlock()
		if prog != nil {
			prog.Update(s)
		}
	})
	if err != nil {
		return Summary{}, err
	}
	first, last := res.First(), res.Last()
	if prog != nil {
		mu.Lock()
		s := status
		mu.Unlock()
		s.Elapsed = res.Wall
		prog.Done(s)
	}
	sum := Summary{
		Mode: "offline", Minutes: rc.Budget.Minutes(),
		SuccessStart: first.Success, SuccessEnd: last.Success, SafetyStart: first.Safety, SafetyEnd: last.Safety,
		VersionsPromoted: res.Promoted, VersionsRolledBack: res.RolledBack, VersionsHeld: res.Held,
		ServingVersion: name(last.Version), TrainSteps: res.Steps, SampledAnswers: res.Sampled, Params: res.Params,
		BaseBuildSeconds: res.BaseBuild.Seconds(), BaseCached: res.BaseCached, WallSeconds: res.Wall.Seconds(),
	}
	for i, p := range res.Points {
		live := p.SampledSuccess
		if i == 0 {
			live = math.NaN() // nothing sampled before the first point
		}
		sum.Curve = append(sum.Curve, CurvePoint{Minutes: p.Elapsed.Minutes(), Success: p.Success, Safety: p.Safety, Live: live})
	}
	title := fmt.Sprintf("Flywheel demo (offline): reverse the letters, %d steps", res.Steps)
	if sum.CurvePNG, sum.CurveSVG, err = WriteCurve(cfg.OutDir, title, sum.Curve); err != nil {
		return sum, err
	}
	for i := range sum.Curve {
		if math.IsNaN(sum.Curve[i].Live) {
			sum.Curve[i].Live = -1 // JSON has no NaN
		}
	}
	page := StatusPage{Title: "Flywheel demo status", Generated: time.Now().UTC(), Summary: sum, Points: res.Points, ModelName: cfg.ModelName}
	page.CurveSVG = inlineSVG(sum.CurveSVG)
	sum.StatusHTML = filepath.Join(cfg.OutDir, StatusFile)
	if err := WriteStatusPage(sum.StatusHTML, page); err != nil {
		return sum, err
	}
	return sum, nil
}
