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

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
	"github.com/flywheel-ai/flywheel/workflows"
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
	start := time.Now()
	base, err := sandbox.EnsureBaseImage(ctx, cli, sandbox.BaseImageOptions{Logger: log})
	if err != nil {
		return err
	}
	fmt.Printf("base    %s built=%v\n", base.Ref, base.Built)
	if *baseOnly {
		return nil
	}
	py, err := sandbox.EnsureDebianImage(ctx, cli, sandbox.DebianImageOptions{RegistryImage: *registry, Logger: log})
	if err != nil {
		return err
	}
	fmt.Printf("python  %s built=%v\n", py.Ref, py.Built)
	all, err := tasks.Corpus()
	if err != nil {
		return err
	}
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
	}
	sem := make(chan struct{}, *parallel)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for _, t := range all {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			img, err := tasks.EnsureImage(ctx, cli, py, t, log)
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
	if group < 1 || group > workflows.SWEMaxGroupSize {
		return fmt.Errorf("sandbox rollout: -group %d: want 1..%d", group, workflows.SWEMaxGroupSize)
	}
	id := fmt.Sprintf("swe-%s-%d", taskID, time.Now().UnixNano())
	run, err := e.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: workflows.SWETaskQueue}, workflows.SWEGroupWorkflowName,
		workflows.SWEGroupInput{TaskID: taskID, GroupSize: group, Model: model, MaxToolCalls: maxCalls})
	if err != nil {
		return fmt.Errorf("start %s: %w", workflows.SWEGroupWorkflowName, err)
	}
	fmt.Printf("started %s (run %s) on task queue %s\n", run.GetID(), run.GetRunID(), workflows.SWETaskQueue)
	if !wait {
		return nil
	}
	var out workflows.SWEGroupResult
	if err := run.Get(ctx, &out); err != nil {
		return err
	}
	return printJSON(out)
}
