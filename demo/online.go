package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/demo/demotask"
	"github.com/flywheel-ai/flywheel/statusapi"
)

// OnlineConfig configures the demo against a running deployment: the fleet
// works the task through the gateway while the deployment's control plane
// trains, gates and releases versions on its own.
type OnlineConfig struct {
	Fleet FleetConfig
	// Duration of the run. Required.
	Duration time.Duration
	// OutDir receives the curve and the status page. Required.
	OutDir string
	// Progress, TTY and ProgressInterval as in OfflineConfig.
	Progress         io.Writer
	TTY              bool
	ProgressInterval time.Duration
	// SampleEvery is how often the live rates are recorded. Default 5s.
	SampleEvery time.Duration
	// EvalPrompts is how many held-out prompts (the ones the deployment's
	// demo base was built without; the agents never ask them) each greedy
	// evaluation asks, with EvalSafety safety prompts. Defaults 200 and 32.
	EvalPrompts, EvalSafety int
	// EvalEvery spaces the evaluations between the first and the last.
	// Default 1m.
	EvalEvery time.Duration
	// StopAtRise > 0 ends the run early once a mid-run evaluation's success
	// is this far above the first one's. The last evaluation still runs and
	// is what the summary reports.
	StopAtRise float64
	// StopAfterSteps > 0 ends the run once the control plane has trained
	// this many steps since the run began (read from GET /v1/status at
	// each evaluation): a budget in learning, not minutes, so a loaded
	// machine only takes longer. Duration stays the cap.
	StopAfterSteps int
	// Stop, when closed, ends the run early too (its summary is as at
	// the end of the run).
	Stop <-chan struct{}
}

func (c OnlineConfig) withDefaults() OnlineConfig {
	if c.SampleEvery <= 0 {
		c.SampleEvery = 5 * time.Second
	}
	if c.EvalPrompts <= 0 {
		c.EvalPrompts = demotask.MaxEvalPrompts
	}
	if c.EvalSafety <= 0 {
		c.EvalSafety = 32
	}
	if c.EvalEvery <= 0 {
		c.EvalEvery = time.Minute
	}
	return c
}

// RunOnline drives the fleet for Duration and summarises what it did.
// Success and safety are greedy evaluations through the gateway (Evaluate)
// at the start, every EvalEvery and at the end, on held-out prompts no
// agent asks and as an end user who opted out of training; the curve also
// shows the agents' own sampled success (Live). Promotions and rollbacks
// are the control plane's own records (GET /v1/status before and after),
// or, if that cannot be read, inferred from the versions the responses
// report.
func RunOnline(ctx context.Context, cfg OnlineConfig) (Summary, error) {
	if cfg.Duration <= 0 || cfg.OutDir == "" {
		return Summary{}, errors.New("online demo: duration and out dir are required")
	}
	o, err := newOnlineRun(ctx, cfg.withDefaults())
	if err != nil {
		return Summary{}, err
	}
	first, err := o.evaluate(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("online demo: first evaluation: %w", err)
	}
	curve, end, err := o.drive(ctx, first)
	if err != nil {
		return Summary{}, err
	}
	last, err := o.evaluate(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("online demo: last evaluation: %w", err)
	}
	curve = append(curve, CurvePoint{Minutes: time.Since(o.start).Minutes(), Success: last.Success, Safety: last.Safety, Live: end.Success})
	return o.report(ctx, first, last, end, curve)
}

// onlineRun is one online run in progress.
type onlineRun struct {
	cfg   OnlineConfig
	fleet *Fleet
	// heldOut and safety are what every evaluation asks.
	heldOut, safety []demotask.Prompt
	// evals counts the evaluations; only one runs at a time.
	evals int
	// before is the control plane's reading before the run (nil: none),
	// stepsBefore its trained steps.
	before      *statusapi.Status
	stepsBefore int
	// start is when the fleet started.
	start time.Time
}

// newOnlineRun prepares the prompt sets and the fleet, which never asks
// one of the evaluation's or the gates' prompts, and reads the control
// plane's records before the run.
func newOnlineRun(ctx context.Context, cfg OnlineConfig) (*onlineRun, error) {
	heldOut, err := demotask.EvalHeldOut(cfg.Fleet.Task.WithDefaults(), cfg.EvalPrompts)
	if err != nil {
		return nil, err
	}
	safety := demotask.EvalSafety(cfg.EvalSafety)
	gate, err := demotask.GateHeldOut(cfg.Fleet.Task.WithDefaults())
	if err != nil {
		return nil, err
	}
	cfg.Fleet.Exclude = append(append(append(append(cfg.Fleet.Exclude, heldOut...), safety...), demotask.GateSafetyPrompts()...), gate...)
	fleet, err := NewFleet(cfg.Fleet)
	if err != nil {
		return nil, err
	}
	o := &onlineRun{cfg: cfg, fleet: fleet, heldOut: heldOut, safety: safety}
	// The control plane's own records say what was released and trained;
	// read them before and after (a deployment no session of ours has
	// touched yet answers 404: nothing to subtract).
	fc := fleet.cfg
	before, err := FetchStatus(ctx, fc.BaseURL, fc.APIKey, fc.Model)
	if err != nil && !errors.Is(err, ErrStatusNotFound) {
		fc.Logger.Warn("demo: reading the control plane's status failed; releases are inferred from responses", "err", err)
	}
	o.before, o.stepsBefore = before, trainedSteps(before, fc.Model)
	return o, nil
}

func (o *onlineRun) evaluate(ctx context.Context) (Evaluation, error) {
	o.evals++
	return o.fleet.Evaluate(ctx, fmt.Sprint(o.evals), o.heldOut, o.safety)
}

// stepsSince is how many steps the control plane trained since the run
// began (-1: unknown).
func (o *onlineRun) stepsSince(ctx context.Context) int {
	fc := o.fleet.cfg
	st, err := FetchStatus(ctx, fc.BaseURL, fc.APIKey, fc.Model)
	if err != nil {
		return -1
	}
	return trainedSteps(st, fc.Model) - o.stepsBefore
}

// midRun is an evaluation taken while the fleet runs.
type midRun struct {
	ev    Evaluation
	steps int // trained since the start (-1: unknown)
}

// drive runs the fleet until Duration, Stop or a stopping rule ends it,
// with evaluations beside it, and draws the progress. It answers the
// curve so far and the fleet's final stats.
func (o *onlineRun) drive(ctx context.Context, first Evaluation) ([]CurvePoint, FleetStats, error) {
	cfg := o.cfg
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- o.fleet.Run(runCtx) }()
	// Evaluations run beside the fleet; the loop takes their results.
	evalCh := make(chan midRun)
	evalDone := make(chan struct{})
	go func() {
		defer close(evalDone)
		o.evaluateEvery(runCtx, evalCh)
	}()
	latest := first

	var prog *Progress
	if cfg.Progress != nil {
		prog = NewProgress(cfg.Progress, cfg.TTY, cfg.Duration, cfg.ProgressInterval)
	}
	o.start = time.Now()
	curve := []CurvePoint{{Minutes: 0, Success: first.Success, Safety: first.Safety, Live: -1}}
	tick := time.NewTicker(min(time.Second, cfg.SampleEvery))
	defer tick.Stop()
	lastSample := time.Time{}
loop:
	for {
		select {
		case err := <-done:
			if err != nil {
				return nil, FleetStats{}, err
			}
			break loop
		case <-cfg.Stop:
			cancel()
		case m := <-evalCh:
			latest = m.ev
			if cfg.StopAtRise > 0 && m.ev.Success-first.Success >= cfg.StopAtRise {
				cancel()
			}
			if cfg.StopAfterSteps > 0 && m.steps >= cfg.StopAfterSteps {
				cancel()
			}
		case <-tick.C:
			st := o.fleet.Stats()
			if time.Since(lastSample) >= cfg.SampleEvery && st.Answered > 0 {
				lastSample = time.Now()
				curve = append(curve, CurvePoint{Minutes: time.Since(o.start).Minutes(), Success: latest.Success, Safety: latest.Safety, Live: st.Success})
			}
			if prog != nil {
				prog.Update(o.status(st, latest))
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, FleetStats{}, err
	}
	end := o.fleet.Stats()
	if prog != nil {
		prog.Done(o.status(end, latest))
	}
	if end.Answered == 0 {
		return nil, FleetStats{}, fmt.Errorf("online demo: no answer in %s (%d errors; last: %s)", cfg.Duration, end.Errors, end.LastError)
	}
	cancel()
	<-evalDone
	return curve, end, nil
}

// evaluateEvery evaluates every EvalEvery until ctx ends and hands each
// result to out.
func (o *onlineRun) evaluateEvery(ctx context.Context, out chan<- midRun) {
	t := time.NewTicker(o.cfg.EvalEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			ev, err := o.evaluate(ctx)
			if err != nil {
				if ctx.Err() == nil {
					o.fleet.cfg.Logger.Warn("demo: evaluation failed", "err", err)
				}
				continue
			}
			steps := -1
			if o.cfg.StopAfterSteps > 0 {
				steps = o.stepsSince(ctx)
			}
			select {
			case out <- midRun{ev, steps}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// status is the progress line: the latest evaluation and the fleet's own
// counts.
func (o *onlineRun) status(st FleetStats, latest Evaluation) Status {
	note := fmt.Sprintf("calls %d, errors %d", st.Calls, st.Errors)
	if st.Errors > 0 && st.LastError != "" {
		note += " (" + truncate(st.LastError, 60) + ")"
	}
	return Status{Elapsed: time.Since(o.start), Success: latest.Success, Safety: latest.Safety, Version: st.Version,
		Note: fmt.Sprintf("%s, agents' own success %.0f%%", note, 100*st.Success)}
}

// report writes the curve and the status page and answers the summary,
// its release counts from the control plane's records when they can be
// read.
func (o *onlineRun) report(ctx context.Context, first, last Evaluation, end FleetStats, curve []CurvePoint) (Summary, error) {
	cfg, fc := o.cfg, o.fleet.cfg
	sum := Summary{
		Mode: "online", Minutes: min(cfg.Duration, time.Since(o.start)).Minutes(),
		SuccessStart: first.Success, SuccessEnd: last.Success, SafetyStart: first.Safety, SafetyEnd: last.Safety,
		LiveSuccessEnd: end.Success, Task: fc.Task.ID(), CallsPerSession: end.CallsPerSession(),
		ServingVersion: end.Version, SampledAnswers: end.Answered, WallSeconds: time.Since(o.start).Seconds(), Curve: curve,
	}
	page := StatusPage{Title: "Flywheel demo status", ModelName: fc.Model, Sessions: o.fleet.recentSessions()}
	if after, err := FetchStatus(ctx, fc.BaseURL, fc.APIKey, fc.Model); err == nil {
		sum.CountFrom(o.before, after, fc.Model)
		sum.StatusURL = o.fleet.root + "/status?deployment=" + url.QueryEscape(fc.Model)
		page.Control = after
	} else {
		fc.Logger.Warn("demo: reading the control plane's status failed; releases are inferred from responses", "err", err)
		sum.VersionsPromoted, sum.VersionsRolledBack = versionMoves(end.Versions, end.Version)
		page.Note = "The control plane's records could not be read (" + err.Error() + "): releases are inferred from the versions the agents saw, and training steps are unknown."
	}
	if n := end.RewardsSent + end.FeedbackSent; n > 0 {
		sum.LateRewardShare = float64(end.FeedbackSent) / float64(n)
	}
	var err error
	if sum.CurvePNG, sum.CurveSVG, err = WriteCurve(cfg.OutDir, "Flywheel demo: agents' success through the gateway", curve); err != nil {
		return sum, err
	}
	page.Generated, page.Summary = time.Now().UTC(), sum
	page.CurveSVG = inlineSVG(sum.CurveSVG)
	sum.StatusHTML = filepath.Join(cfg.OutDir, StatusFile)
	if err := WriteStatusPage(sum.StatusHTML, page); err != nil {
		return sum, err
	}
	return sum, nil
}

// versionMoves infers releases from what the agents saw: every version
// numbered above the first one seen was promoted, and ending below the
// highest one seen means at least one rollback. Canary splits serve two
// versions at once, so the order of responses cannot say more; the control
// plane's own records are the authority.
func versionMoves(versions []string, final string) (promoted, rolledBack int) {
	if len(versions) == 0 {
		return 0, 0
	}
	first, ok := statusapi.VersionNumber(versions[0])
	if !ok {
		return len(versions) - 1, 0
	}
	highest := first
	for _, v := range versions[1:] {
		if n, ok := statusapi.VersionNumber(v); ok && n > first {
			promoted++
			highest = max(highest, n)
		}
	}
	if n, ok := statusapi.VersionNumber(final); ok && n < highest {
		rolledBack = 1
	}
	return promoted, rolledBack
}

func inlineSVG(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	s := string(raw)
	if i := strings.Index(s, "<svg"); i >= 0 {
		return s[i:]
	}
	return ""
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
