package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/store"
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
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = 5 * time.Second
	}
	if cfg.EvalPrompts <= 0 {
		cfg.EvalPrompts = deployHeldOutN
	}
	if cfg.EvalSafety <= 0 {
		cfg.EvalSafety = 32
	}
	if cfg.EvalEvery <= 0 {
		cfg.EvalEvery = time.Minute
	}
	heldOut, err := EvalHeldOut(cfg.EvalPrompts)
	if err != nil {
		return Summary{}, err
	}
	safety := EvalSafety(cfg.EvalSafety)
	gate, err := GateHeldOut()
	if err != nil {
		return Summary{}, err
	}
	cfg.Fleet.Exclude = append(append(append(append(cfg.Fleet.Exclude, heldOut...), safety...), GateSafetyPrompts()...), gate...)
	fleet, err := NewFleet(cfg.Fleet)
	if err != nil {
		return Summary{}, err
	}
	evals := 0 // only one evaluation runs at a time
	evaluate := func(ctx context.Context) (Evaluation, error) {
		evals++
		return fleet.Evaluate(ctx, fmt.Sprint(evals), heldOut, safety)
	}
	fc := fleet.cfg
	// The control plane's own records say what was released and trained;
	// read them before and after (a deployment no session of ours has
	// touched yet answers 404: nothing to subtract).
	before, err := FetchStatus(ctx, fc.BaseURL, fc.APIKey, fc.Model)
	if err != nil && !errors.Is(err, ErrStatusNotFound) {
		fc.Logger.Warn("demo: reading the control plane's status failed; releases are inferred from responses", "err", err)
	}
	stepsBefore := trainedSteps(before, fc.Model)
	stepsSince := func(ctx context.Context) int {
		st, err := FetchStatus(ctx, fc.BaseURL, fc.APIKey, fc.Model)
		if err != nil {
			return -1
		}
		return trainedSteps(st, fc.Model) - stepsBefore
	}
	first, err := evaluate(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("online demo: first evaluation: %w", err)
	}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fleet.Run(runCtx) }()
	// Evaluations run beside the fleet; the loop takes their results.
	type midRun struct {
		ev    Evaluation
		steps int // trained since the start (-1: unknown)
	}
	evalCh := make(chan midRun)
	evalDone := make(chan struct{})
	go func() {
		defer close(evalDone)
		t := time.NewTicker(cfg.EvalEvery)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				ev, err := evaluate(runCtx)
				if err != nil {
					if runCtx.Err() == nil {
						fc.Logger.Warn("demo: evaluation failed", "err", err)
					}
					continue
				}
				steps := -1
				if cfg.StopAfterSteps > 0 {
					steps = stepsSince(runCtx)
				}
				select {
				case evalCh <- midRun{ev, steps}:
				case <-runCtx.Done():
					return
				}
			}
		}
	}()
	latest := first

	var prog *Progress
	if cfg.Progress != nil {
		prog = NewProgress(cfg.Progress, cfg.TTY, cfg.Duration, cfg.ProgressInterval)
	}
	start := time.Now()
	curve := []CurvePoint{{Minutes: 0, Success: first.Success, Safety: first.Safety, Live: -1}}
	tick := time.NewTicker(min(time.Second, cfg.SampleEvery))
	defer tick.Stop()
	lastSample := time.Time{}
	status := func(st FleetStats) Status {
		note := fmt.Sprintf("calls %d, errors %d", st.Calls, st.Errors)
		if st.Errors > 0 && st.LastError != "" {
			note += " (" + truncate(st.LastError, 60) + ")"
		}
		return Status{Elapsed: time.Since(start), Success: latest.Success, Safety: latest.Safety, Version: st.Version,
			Note: fmt.Sprintf("%s, agents' own success %.0f%%", note, 100*st.Success)}
	}
loop:
	for {
		select {
		case err := <-done:
			if err != nil {
				return Summary{}, err
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
			st := fleet.Stats()
			if time.Since(lastSample) >= cfg.SampleEvery && st.Answered > 0 {
				lastSample = time.Now()
				curve = append(curve, CurvePoint{Minutes: time.Since(start).Minutes(), Success: latest.Success, Safety: latest.Safety, Live: st.Success})
			}
			if prog != nil {
				prog.Update(status(st))
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return Summary{}, err
	}
	end := fleet.Stats()
	if prog != nil {
		prog.Done(status(end))
	}
	if end.Answered == 0 {
		return Summary{}, fmt.Errorf("online demo: no answer in %s (%d errors; last: %s)", cfg.Duration, end.Errors, end.LastError)
	}
	cancel()
	<-evalDone
	last, err := evaluate(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("online demo: last evaluation: %w", err)
	}
	curve = append(curve, CurvePoint{Minutes: time.Since(start).Minutes(), Success: last.Success, Safety: last.Safety, Live: end.Success})
	sum := Summary{
		Mode: "online", Minutes: min(cfg.Duration, time.Since(start)).Minutes(),
		SuccessStart: first.Success, SuccessEnd: last.Success, SafetyStart: first.Safety, SafetyEnd: last.Safety,
		LiveSuccessEnd: end.Success,
		ServingVersion: end.Version, SampledAnswers: end.Answered, WallSeconds: time.Since(start).Seconds(), Curve: curve,
	}
	page := StatusPage{Title: "Flywheel demo status", ModelName: fc.Model, Sessions: fleet.recentSessions()}
	if after, err := FetchStatus(ctx, fc.BaseURL, fc.APIKey, fc.Model); err == nil {
		sum.CountFrom(before, after, fc.Model)
		sum.StatusURL = fleet.root + "/status?deployment=" + url.QueryEscape(fc.Model)
		page.Control = after
	} else {
		fc.Logger.Warn("demo: reading the control plane's status failed; releases are inferred from responses", "err", err)
		sum.VersionsPromoted, sum.VersionsRolledBack = versionMoves(end.Versions, end.Version)
		page.Note = "The control plane's records could not be read (" + err.Error() + "): releases are inferred from the versions the agents saw, and training steps are unknown."
	}
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

// trainedSteps is the deployment's count of trained steps in a reading.
func trainedSteps(st *store.Status, deployment string) int {
	if st == nil {
		return 0
	}
	for _, d := range st.Deployments {
		if d.Name == deployment {
			return d.TrainingCounts["trained"]
		}
	}
	return 0
}

// CountFrom fills the run's counts from the control plane's readings of
// the deployment before and after it (before is nil when no session of
// ours had touched it). Held are the versions trained in the run that no
// release promoted or refused (a release of another version was running,
// or theirs was aborted); a rollback of a serving version counts as
// rolled back without a trained version of its own, so held is a lower
// bound.
func (s *Summary) CountFrom(before, after *store.Status, deployment string) {
	s.VersionsPromoted, s.VersionsRolledBack = WeightsMoves(before, after, deployment)
	s.TrainSteps = trainedSteps(after, deployment) - trainedSteps(before, deployment)
	s.VersionsHeld = max(0, s.TrainSteps-s.VersionsPromoted-s.VersionsRolledBack)
	for _, d := range after.Deployments {
		if d.Name == deployment && d.ServingVersion != "" {
			s.ServingVersion = d.ServingVersion
		}
	}
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
	first, ok := versionNumber(versions[0])
	if !ok {
		return len(versions) - 1, 0
	}
	highest := first
	for _, v := range versions[1:] {
		if n, ok := versionNumber(v); ok && n > first {
			promoted++
			highest = max(highest, n)
		}
	}
	if n, ok := versionNumber(final); ok && n < highest {
		rolledBack = 1
	}
	return promoted, rolledBack
}

// versionNumber reads N from "name@vN".
func versionNumber(v string) (int64, bool) {
	i := strings.LastIndex(v, "@v")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[i+2:], 10, 64)
	return n, err == nil
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
