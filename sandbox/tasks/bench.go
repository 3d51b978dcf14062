package tasks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/moby/moby/client"
)

// RolloutBenchConfig sizes RunRolloutBench; zero values take the defaults.
type RolloutBenchConfig struct {
	// Concurrent is how many rollouts run at once; default 4.
	Concurrent int
	// Passes is how many times the corpus is rolled out; default 1.
	Passes int
	// Tasks limits the corpus to these ids; default every task.
	Tasks []string
	// Progress receives human-readable lines; may be nil.
	Progress io.Writer
	// Logger defaults to a discarding logger.
	Logger *slog.Logger
}

// RolloutBenchResult is the rollout part of `flywheel bench sandbox`.
type RolloutBenchResult struct {
	// Rollouts ran, Resolved of them earned reward 1.
	Rollouts int `json:"rollouts"`
	Resolved int `json:"rollouts_resolved"`
	// RolloutsPerMin is completed rollouts over wall time with
	// RolloutConcurrent in flight, images prebuilt.
	RolloutsPerMin    float64 `json:"rollouts_per_min"`
	RolloutConcurrent int     `json:"rollout_concurrent"`
	// A rollout's p50 and the p50s of its three parts: sandbox (request to
	// a sandbox that answers), agent (the scripted tool calls) and grade.
	RolloutP50MS float64 `json:"rollout_p50_ms"`
	SandboxP50MS float64 `json:"rollout_sandbox_p50_ms"`
	AgentP50MS   float64 `json:"rollout_agent_p50_ms"`
	GradeP50MS   float64 `json:"rollout_grade_p50_ms"`
}

// RunRolloutBench rolls out every corpus task with a scripted agent: the
// tool calls a model-driven agent makes (list the tree, read the sources,
// git status, write the reference fix, git diff), then hidden-test grading,
// then release. No model is called, so the figure is the rollout rate the
// sandbox layer allows, the ceiling under any model. Images are built
// before the clock starts; every container is removed before it returns.
func RunRolloutBench(ctx context.Context, cli *client.Client, cfg RolloutBenchConfig) (RolloutBenchResult, error) {
	if cfg.Concurrent <= 0 {
		cfg.Concurrent = 4
	}
	if cfg.Passes <= 0 {
		cfg.Passes = 1
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var res RolloutBenchResult
	all, err := Corpus()
	if err != nil {
		return res, err
	}
	if len(cfg.Tasks) > 0 {
		all = all[:0:0]
		for _, id := range cfg.Tasks {
			t, err := Find(id)
			if err != nil {
				return res, err
			}
			all = append(all, t)
		}
	}
	images := &Images{Client: cli, Logger: cfg.Logger}
	imgs := map[string]sandbox.Image{}
	for _, t := range all {
		if _, imgs[t.ID], err = images.Ensure(ctx, t.ID); err != nil {
			return res, err
		}
	}
	m, err := sandbox.NewManager(cli, sandbox.Config{Logger: cfg.Logger})
	if err != nil {
		return res, err
	}
	defer func() { _ = m.Close(context.WithoutCancel(ctx)) }()

	var queue []*Task
	for range cfg.Passes {
		queue = append(queue, all...)
	}
	work := make(chan *Task, len(queue))
	for _, t := range queue {
		work <- t
	}
	close(work)
	var (
		mu                             sync.Mutex
		total, sbLat, agentLat, grades []time.Duration
		wg                             sync.WaitGroup
		errs                           = make([]error, cfg.Concurrent)
	)
	start := time.Now()
	for w := range cfg.Concurrent {
		wg.Go(func() {
			for t := range work {
				r, err := scriptedRollout(ctx, m, imgs[t.ID], t, cfg.Logger)
				if err != nil {
					errs[w] = fmt.Errorf("rollout %s: %w", t.ID, err)
					return
				}
				mu.Lock()
				total = append(total, r.sandbox+r.agent+r.grade)
				sbLat, agentLat, grades = append(sbLat, r.sandbox), append(agentLat, r.agent), append(grades, r.grade)
				if r.resolved {
					res.Resolved++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.Rollouts, res.RolloutConcurrent = len(total), cfg.Concurrent
	res.RolloutsPerMin = float64(len(total)) / elapsed.Minutes()
	res.RolloutP50MS, res.SandboxP50MS, res.AgentP50MS, res.GradeP50MS = p50(total), p50(sbLat), p50(agentLat), p50(grades)
	fmt.Fprintf(cfg.Progress, "rollouts (scripted agent, %d tasks × %d, %d at once): %.1f per minute, %d/%d resolved; p50 %.0f ms = sandbox %.0f + agent %.0f + grade %.0f\n",
		len(all), cfg.Passes, cfg.Concurrent, res.RolloutsPerMin, res.Resolved, res.Rollouts, res.RolloutP50MS, res.SandboxP50MS, res.AgentP50MS, res.GradeP50MS)
	return res, nil
}

type rolloutTimes struct {
	sandbox, agent, grade time.Duration
	resolved              bool
}

func scriptedRollout(ctx context.Context, m *sandbox.Manager, img sandbox.Image, t *Task, log *slog.Logger) (rolloutTimes, error) {
	var r rolloutTimes
	start := time.Now()
	sb, err := m.Acquire(ctx, img)
	if err != nil {
		return r, err
	}
	defer func() { _ = m.Release(context.WithoutCancel(ctx), sb) }()
	if _, err := sb.Ping(ctx); err != nil {
		return r, err
	}
	r.sandbox = time.Since(start)

	start = time.Now()
	if _, err := sb.ListFiles(ctx, sandbox.Workspace, 4); err != nil {
		return r, err
	}
	for _, p := range t.VisibleFiles() {
		if _, _, err := sb.ReadFile(ctx, path.Join(sandbox.Workspace, p), 0); err != nil {
			return r, err
		}
	}
	for _, cmd := range []string{"git status --short", "python3 -c 'import sys; print(sys.version)'"} {
		if _, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: cmd}); err != nil {
			return r, err
		}
	}
	for p, data := range t.Solution {
		if err := sb.WriteFile(ctx, path.Join(sandbox.Workspace, p), data, 0o644); err != nil {
			return r, err
		}
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Cmd: "git diff --stat"}); err != nil {
		return r, err
	}
	r.agent = time.Since(start)

	start = time.Now()
	g, err := Grade(ctx, sb, t, log)
	if err != nil {
		return r, err
	}
	r.grade = time.Since(start)
	r.resolved = g.Resolved
	return r, nil
}

func p50(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[(len(s)-1)/2]) / float64(time.Millisecond)
}
