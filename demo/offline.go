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

	"github.com/flywheel-ai/flywheel/demo/rehearsal"
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
	// Task is the task's id (online); CallsPerSession the agents' model
	// calls per session; LateRewardShare the share of rewarded sessions
	// whose reward came late, through feedback.
	Task            string  `json:"task,omitempty"`
	CallsPerSession float64 `json:"calls_per_session,omitempty"`
	LateRewardShare float64 `json:"late_reward_share,omitempty"`
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
	Rehearsal rehearsal.Config
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
	rc := cfg.Rehearsal.WithDefaults()
	if err := rc.Validate(); err != nil {
		return Summary{}, fmt.Errorf("offline demo: %w", err)
	}
	name := func(v int64) string { return fmt.Sprintf("%s@v%d", cfg.ModelName, v) }

	prog := newOfflineProgress(cfg, rc.Budget, name)
	defer prog.close()
	res, err := rehearsal.Run(ctx, rc, nil, prog.point)
	if err != nil {
		return Summary{}, err
	}
	prog.done(res.Wall)
	first, last := res.First(), res.Last()
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

// offlineProgress shows the rehearsal's points on the progress bar, and
// keeps its clock moving between them. Without a Progress writer it shows
// nothing.
type offlineProgress struct {
	prog *Progress
	name func(int64) string
	stop chan struct{}

	mu        sync.Mutex
	status    Status
	loopStart time.Time
}

func newOfflineProgress(cfg OfflineConfig, total time.Duration, name func(int64) string) *offlineProgress {
	o := &offlineProgress{name: name, status: Status{Note: "building the base policy"}}
	if cfg.Progress == nil {
		return o
	}
	o.prog = NewProgress(cfg.Progress, cfg.TTY, total, cfg.ProgressInterval)
	o.prog.Update(o.status)
	o.stop = make(chan struct{})
	go o.keepAlive()
	return o
}

// keepAlive redraws the bar every second until close: between gate points
// only the clock moves.
func (o *offlineProgress) keepAlive() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
			o.mu.Lock()
			if !o.loopStart.IsZero() {
				o.status.Elapsed = time.Since(o.loopStart)
			}
			s := o.status
			o.mu.Unlock()
			o.prog.Update(s)
		}
	}
}

// point shows a measurement of the rehearsal.
func (o *offlineProgress) point(p rehearsal.Point) {
	o.mu.Lock()
	if o.loopStart.IsZero() {
		o.loopStart = time.Now().Add(-p.Elapsed)
	}
	o.status = Status{Elapsed: p.Elapsed, Success: p.Success, Safety: p.Safety, Version: o.name(p.Version),
		Note: fmt.Sprintf("step %d", p.Step)}
	if p.Decision != "" {
		o.status.Note += fmt.Sprintf(", v%d %s", p.Candidate, p.Decision)
	}
	s := o.status
	o.mu.Unlock()
	if o.prog != nil {
		o.prog.Update(s)
	}
}

// done ends the bar at the rehearsal's wall time.
func (o *offlineProgress) done(wall time.Duration) {
	if o.prog == nil {
		return
	}
	o.mu.Lock()
	s := o.status
	o.mu.Unlock()
	s.Elapsed = wall
	o.prog.Done(s)
}

func (o *offlineProgress) close() {
	if o.stop != nil {
		close(o.stop)
	}
}
