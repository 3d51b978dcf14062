package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/sandbox"
	"github.com/flywheel-ai/flywheel/sandbox/tasks"
)

func init() {
	benchCommands["sandbox"] = benchSandbox
}

// sandboxBenchLine is the JSON line: the sandbox figures, then the rollout
// figures when they ran.
type sandboxBenchLine struct {
	sandbox.BenchResult
	*tasks.RolloutBenchResult
}

// benchSandbox is `flywheel bench sandbox`: what a rollout feels of the
// sandbox layer on the local Docker engine (request to ready under load,
// reset against create, agent exec against docker exec, fork) and rollouts
// per minute on the SWE corpus with a scripted agent. The last line is the
// JSON result.
func benchSandbox(ctx context.Context, args []string) error {
	var (
		cfg      sandbox.BenchConfig
		rollouts tasks.RolloutBenchConfig
		task     string
		noSWE    bool
	)
	all, _, err := loadConfig("bench sandbox", args, func(fs *flag.FlagSet) {
		fs.StringVar(&task, "task", "", "corpus task whose image the sandbox figures use (default: the busybox base image)")
		fs.IntVar(&cfg.Provisions, "provisions", 6, "sequential cold creates to time (the baseline)")
		fs.IntVar(&cfg.PoolSize, "pool", 4, "warm pool size under load")
		fs.IntVar(&cfg.Concurrent, "concurrent", 16, "rollouts in flight under load")
		fs.IntVar(&cfg.Rounds, "rounds", 3, "rollouts each of them runs")
		fs.DurationVar(&cfg.Hold, "hold", 0, "how long a rollout under load keeps its sandbox (default 1s)")
		fs.IntVar(&cfg.Resets, "resets", 6, "used sandboxes reset to clean")
		fs.IntVar(&cfg.AgentExecs, "agent-execs", 200, "exec samples through the agent")
		fs.IntVar(&cfg.DockerExecs, "docker-execs", 30, "exec samples through docker exec")
		fs.IntVar(&cfg.Forks, "forks", 4, "sandboxes started from one snapshot")
		fs.BoolVar(&noSWE, "no-rollouts", false, "skip the SWE corpus rollouts (they need the Debian image)")
		fs.IntVar(&rollouts.Concurrent, "rollout-concurrent", 4, "SWE rollouts at once")
		fs.IntVar(&rollouts.Passes, "rollout-passes", 1, "passes over the SWE corpus")
	})
	if err != nil {
		return err
	}
	cfg.Progress, rollouts.Progress = os.Stdout, os.Stdout
	cli, err := sandbox.Connect(ctx, all.Docker.Host)
	if err != nil {
		return err
	}
	defer cli.Close()
	if task != "" {
		images := &tasks.Images{Client: cli}
		_, img, err := images.Ensure(ctx, task)
		if err != nil {
			return err
		}
		cfg.Image = &img
	}
	var line sandboxBenchLine
	if line.BenchResult, err = sandbox.RunBench(ctx, cli, cfg); err != nil {
		return err
	}
	if !noSWE {
		r, err := tasks.RunRolloutBench(ctx, cli, rollouts)
		if err != nil {
			return err
		}
		line.RolloutBenchResult = &r
	}
	out, err := json.Marshal(line)
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}
