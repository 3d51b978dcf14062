package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/trainer/ggraph"
)

func init() {
	benchCommands["ggraph"] = func(ctx context.Context, args []string) error {
		fs := flag.NewFlagSet("bench ggraph", flag.ContinueOnError)
		var cfg ggraph.BenchConfig
		fs.IntVar(&cfg.Model.Layers, "layers", 0, "throughput model layers (default 4)")
		fs.IntVar(&cfg.Model.DModel, "d-model", 0, "throughput model width (default 256)")
		fs.IntVar(&cfg.Model.Heads, "heads", 0, "attention heads (default 4)")
		fs.IntVar(&cfg.Seqs, "seqs", 0, "sequences in the throughput batch (default 4)")
		fs.IntVar(&cfg.SeqLen, "seq-len", 0, "tokens per sequence (default 256)")
		fs.IntVar(&cfg.Steps, "steps", 0, "timed steps per path (default 3)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		res, err := ggraph.RunBench(ctx, cfg, os.Stdout)
		if err != nil {
			return fmt.Errorf("bench ggraph: %w", err)
		}
		fmt.Println(res.JSON())
		return nil
	}
}
