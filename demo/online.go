package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
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
}

// RunOnline drives the fleet for Duration and summarises what the agents
// saw. Start and end rates are the rolling window's, so they are the
// agents' own sampled success, not a greedy held-out score; promotions and
// rollbacks are inferred from the serving version the responses report (a
// version seen before returning counts as a rollback).
func RunOnline(ctx context.Context, cfg OnlineConfig) (Summary, error) {
	if cfg.Duration <= 0 || cfg.OutDir == "" {
		return Summary{}, errors.New("online demo: duration and out dir are required")
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = 5 * time.Second
	}
	fleet, err := NewFleet(cfg.Fleet)
	if err != nil {
		return Summary{}, err
	}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fleet.Run(runCtx) }()

	var prog *Progress
	if cfg.Progress != nil {
		prog = NewProgress(cfg.Progress, cfg.TTY, cfg.Duration, cfg.ProgressInterval)
	}
	start := time.Now()
	var curve []CurvePoint
	var startStats *FleetStats
	fill := fleet.cfg.withDefaults().Window
	tick := time.NewTicker(min(time.Second, cfg.SampleEvery))
	defer tick.Stop()
	lastSample := time.Time{}
	status := func(st FleetStats) Status {
		note := fmt.Sprintf("calls %d, errors %d", st.Calls, st.Errors)
		if st.Calls == 0 && st.LastError != "" {
			note += " (" + truncate(st.LastError, 60) + ")"
		}
		return Status{Elapsed: time.Since(start), Success: st.Success, Safety: st.Safety, Version: st.Version, Note: note}
	}
loop:
	for {
		select {
		case err := <-done:
			if err != nil {
				return Summary{}, err
			}
			break loop
		case <-tick.C:
			st := fleet.Stats()
			if startStats == nil && st.Answered >= fill {
				s := st
				startStats = &s
			}
			if time.Since(lastSample) >= cfg.SampleEvery && st.Answered > 0 {
				lastSample = time.Now()
				curve = append(curve, CurvePoint{Minutes: time.Since(start).Minutes(), Success: st.Success, Safety: st.Safety, Live: -1})
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
	if startStats == nil {
		startStats = &end
	}
	curve = append(curve, CurvePoint{Minutes: time.Since(start).Minutes(), Success: end.Success, Safety: end.Safety, Live: -1})
	sum := Summary{
		Mode: "online", Minutes: cfg.Duration.Minutes(),
		SuccessStart: startStats.Success, SuccessEnd: end.Success, SafetyStart: startStats.Safety, SafetyEnd: end.Safety,
		ServingVersion: end.Version, SampledAnswers: end.Answered, WallSeconds: time.Since(start).Seconds(), Curve: curve,
	}
	sum.VersionsPromoted, sum.VersionsRolledBack = versionMoves(end.Versions, end.Version)
	if sum.CurvePNG, sum.CurveSVG, err = WriteCurve(cfg.OutDir, "Flywheel demo: agents' success through the gateway", curve); err != nil {
		return sum, err
	}
	page := StatusPage{Title: "Flywheel demo status", Generated: time.Now().UTC(), Summary: sum, Sessions: fleet.recentSessions()}
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
