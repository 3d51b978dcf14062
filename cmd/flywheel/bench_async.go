package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/trainer"
)

func init() {
	benchCommands["async"] = func(ctx context.Context, args []string) error {
		fs := flag.NewFlagSet("bench async", flag.ContinueOnError)
		var cfg trainer.AsyncBenchConfig
		fs.IntVar(&cfg.Batch, "batch", 0, "samples per train step (default 32)")
		fs.IntVar(&cfg.Slots, "slots", 0, "rollouts generating at once (default 8)")
		fs.IntVar(&cfg.Steps, "steps", 0, "train steps per mode (default 24)")
		fs.IntVar(&cfg.Eta, "eta", 0, "staleness bound η of the async mode (default 8)")
		fs.IntVar(&cfg.MinTokens, "min-tokens", 0, "shortest rollout, the Pareto scale (default 8)")
		fs.Float64Var(&cfg.Alpha, "alpha", 0, "Pareto shape of rollout lengths; smaller is a longer tail (default 1.1)")
		fs.IntVar(&cfg.MaxTokens, "max-tokens", 0, "longest rollout (default 192)")
		fs.Uint64Var(&cfg.Seed, "seed", 0, "seed (default 1)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		res, err := trainer.RunAsyncBench(ctx, cfg, os.Stdout)
		if err != nil {
			return fmt.Errorf("bench async: %w", err)
		}
		fmt.Println(res.JSON())
		return nil
	}
}
