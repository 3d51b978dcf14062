package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/sandbox"
)

func init() {
	benchCommands["sandbox"] = benchSandbox
}

// benchSandbox is `flywheel bench sandbox`: warm-pool acquire, cold
// provisioning, agent exec against docker exec, fork and concurrency on the
// local Docker engine. The last line is the JSON result.
func benchSandbox(ctx context.Context, args []string) error {
	var cfg sandbox.BenchConfig
	all, _, err := loadConfig("bench sandbox", args, func(fs *flag.FlagSet) {
		fs.IntVar(&cfg.Provisions, "provisions", 6, "sequential cold creates to time")
		fs.IntVar(&cfg.PoolSize, "pool", 4, "warm pool size")
		fs.IntVar(&cfg.AcquireRounds, "rounds", 5, "warm-pool rounds (each drains the full pool)")
		fs.IntVar(&cfg.AgentExecs, "agent-execs", 200, "exec samples through the agent")
		fs.IntVar(&cfg.DockerExecs, "docker-execs", 30, "exec samples through docker exec")
		fs.IntVar(&cfg.Forks, "forks", 4, "sandboxes started from one snapshot")
		fs.IntVar(&cfg.Concurrent, "concurrent", 16, "sandboxes started and held at once")
	})
	if err != nil {
		return err
	}
	cfg.Progress = os.Stdout
	cli, err := sandbox.Connect(ctx, all.Docker.Host)
	if err != nil {
		return err
	}
	defer cli.Close()
	res, err := sandbox.RunBench(ctx, cli, cfg)
	if err != nil {
		return err
	}
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}
