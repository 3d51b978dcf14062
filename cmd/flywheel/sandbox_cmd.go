package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/internal/progress"
	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
)

// runSandbox implements `flywheel sandbox SUBCOMMAND`.
func runSandbox(ctx context.Context, args []string) error {
	const usage = "flywheel sandbox {build|tasks|janitor|rollout} [flags]"
	v, rest, err := verb(args, usage)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	switch v {
	case "build":
		return runSandboxBuild(ctx, rest, log)
	case "tasks":
		return runSandboxTasks()
	case "janitor":
		return runSandboxJanitor(ctx, rest, log)
	case "rollout":
		return runSandboxRollout(ctx, rest)
	default:
		return fmt.Errorf("unknown sandbox subcommand %q; usage: %s", v, usage)
	}
}

// runSandboxBuild builds the base image, the Debian image and the image of
// every shipped task (or those named with -tasks). All are cached by content
// hash, so a second run only inspects.
func runSandboxBuild(ctx context.Context, args []string, log *slog.Logger) error {
	var registry, only *string
	var baseOnly *bool
	var parallel *int
	cfg, _, err := loadConfig("sandbox build", args, func(fs *flag.FlagSet) {
		registry = fs.String("registry-image", os.Getenv("FLYWHEEL_SANDBOX_REGISTRY_IMAGE"), "use this Debian/python image when present or pullable instead of building it")
		only = fs.String("tasks", "", "comma-separated task ids to build (default: all shipped tasks)")
		baseOnly = fs.Bool("base-only", false, "build only the minimal busybox base image")
		parallel = fs.Int("parallel", 2, "task images built at once")
	})
	if err != nil {
		return err
	}
	if *parallel < 1 {
		return errors.New("sandbox build: -parallel must be at least 1")
	}
	cli, err := sandbox.Connect(ctx, cfg.Docker.Host)
	if err != nil {
		return err
	}
	defer cli.Close()
	all, err := tasks.Corpus()
	if err != nil {
		return err
	}
	start := time.Now()
	total := 2 + len(all)
	if *baseOnly {
		total = 1
	}
	bar := newBuildProgress(total)
	defer bar.stop()
	bar.begin("base image")
	base, err := sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{Logger: log})
	if err != nil {
		return err
	}
	bar.done("base image")
	fmt.Printf("base    %s built=%v\n", base.Ref, base.Built)
	if *baseOnly {
		return nil
	}
	bar.begin("Debian/python image (minutes when it is built)")
	py, err := sandbox.EnsureDebianImage(ctx, cli, sandbox.DebianImageOptions{RegistryImage: *registry, Logger: log})
	if err != nil {
		return err
	}
	bar.done("Debian/python image")
	fmt.Printf("python  %s built=%v\n", py.Ref, py.Built)
	if *only != "" {
		want := map[string]bool{}
		for _, id := range strings.Split(*only, ",") {
			want[strings.TrimSpace(id)] = true
		}
		var picked []*tasks.Task
		for _, t := range all {
			if want[t.ID] {
				picked = append(picked, t)
				delete(want, t.ID)
			}
		}
		for id := range want {
			return fmt.Errorf("sandbox build: %w: %s", tasks.ErrUnknownTask, id)
		}
		all = picked
		bar.total = 2 + len(all)
	}
	sem := make(chan struct{}, *parallel)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, t := range all {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			bar.begin("task " + t.ID)
			img, err := tasks.EnsureImage(ctx, cli, py, t, log)
			bar.done("task " + t.ID)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			fmt.Printf("task    %s built=%v\n", img.Ref, img.Built)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("%d task images ready in %s\n", len(all), time.Since(start).Round(time.Millisecond))
	return nil
}

// buildProgress is `sandbox build`'s progress bar on stderr: images ready
// of all, the time so far, and what is being built, redrawn every second
// (every 10 s when stderr is not a terminal).
type buildProgress struct {
	bar     *progress.Bar
	start   time.Time
	mu      sync.Mutex
	total   int
	ready   int
	current []string
	quit    chan struct{}
	wg      sync.WaitGroup
}

func newBuildProgress(total int) *buildProgress {
	p := &buildProgress{bar: progress.New(os.Stderr, progress.IsTerminal(os.Stderr), 0), start: time.Now(), total: total,
		quit: make(chan struct{})}
	p.wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
				p.bar.Update(p.line())
			}
		}
	})
	return p
}

func (p *buildProgress) line() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	text := fmt.Sprintf("%d/%d images  %s", p.ready, p.total, progress.Clock(time.Since(p.start)))
	if len(p.current) > 0 {
		text += "  building " + strings.Join(p.current, ", ")
	}
	return progress.Render(float64(p.ready)/float64(max(p.total, 1)), text)
}

func (p *buildProgress) begin(what string) {
	p.mu.Lock()
	p.current = append(p.current, what)
	p.mu.Unlock()
}

func (p *buildProgress) done(what string) {
	p.mu.Lock()
	p.ready++
	for i, c := range p.current {
		if strings.HasPrefix(c, what) {
			p.current = append(p.current[:i], p.current[i+1:]...)
			break
		}
	}
	p.mu.Unlock()
}

// stop ends the redraws and prints the final line.
func (p *buildProgress) stop() {
	close(p.quit)
	p.wg.Wait()
	p.bar.Done(p.line())
}

func runSandboxTasks() error {
	all, err := tasks.Corpus()
	if err != nil {
		return err
	}
	for _, t := range all {
		fmt.Printf("%-16s %-11s f2p=%d p2p=%d  %s\n", t.ID, t.BugKind, len(t.FailToPass), len(t.PassToPass), strings.SplitN(strings.TrimSpace(t.ProblemStatement), "\n", 2)[0])
	}
	return nil
}

func runSandboxJanitor(ctx context.Context, args []string, log *slog.Logger) error {
	var all *bool
	var maxAge *time.Duration
	cfg, _, err := loadConfig("sandbox janitor", args, func(fs *flag.FlagSet) {
		all = fs.Bool("all", false, "remove every flywheel sandbox and snapshot, live owners included")
		maxAge = fs.Duration("max-age", 24*time.Hour, "remove leftovers older than this whatever their owner")
	})
	if err != nil {
		return err
	}
	cli, err := sandbox.Connect(ctx, cfg.Docker.Host)
	if err != nil {
		return err
	}
	defer cli.Close()
	rep, err := sandbox.Janitor(ctx, cli, sandbox.JanitorOptions{All: *all, MaxAge: *maxAge, Logger: log})
	fmt.Printf("removed %d containers, %d snapshots\n", rep.Containers, rep.Snapshots)
	return err
}

// runSandboxRollout starts SWEGroupWorkflow for one shipped task: G
// rollouts (1 by default) by the built-in agent on a worker serving
// workflows.SWETaskQueue.
func runSandboxRollout(ctx context.Context, args []string) error {
	var group, maxCalls int
	var model string
	var wait bool
	e, pos, err := openWF(ctx, "sandbox rollout", args, false, func(fs *flag.FlagSet) {
		fs.IntVar(&group, "group", 1, "rollouts of the task (a GRPO group)")
		fs.StringVar(&model, "model", "", "deployment the agent asks the gateway for (default: the worker's)")
		fs.IntVar(&maxCalls, "max-tool-calls", 0, "cap on tool calls per rollout (default: the agent's)")
		fs.BoolVar(&wait, "wait", false, "wait for the result and print it")
	})
	if err != nil {
		return err
	}
	defer e.close()
	taskID, err := one(pos, "task id (see flywheel sandbox tasks)")
	if err != nil {
		return err
	}
	if _, err := tasks.Find(taskID); err != nil {
		return err
	}
	if group < 1 || group > flow.SWEMaxGroupSize {
		return fmt.Errorf("sandbox rollout: -group %d: want 1..%d", group, flow.SWEMaxGroupSize)
	}
	id := fmt.Sprintf("swe-%s-%d", taskID, time.Now().UnixNano())
	run, err := e.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: flow.SWETaskQueue}, flow.SWEGroupWorkflowName,
		flow.SWEGroupInput{TaskID: taskID, GroupSize: group, Model: model, MaxToolCalls: maxCalls})
	if err != nil {
		return fmt.Errorf("start %s: %w", flow.SWEGroupWorkflowName, err)
	}
	fmt.Printf("started %s (run %s) on task queue %s\n", run.GetID(), run.GetRunID(), flow.SWETaskQueue)
	if !wait {
		return nil
	}
	var out flow.SWEGroupResult
	if err := run.Get(ctx, &out); err != nil {
		return err
	}
	return printJSON(out)
}
