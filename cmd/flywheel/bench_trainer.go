package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/flywheel-ai/flywheel/trainer"
)

func init() {
	benchCommands["trainer"] = func(ctx context.Context, args []string) error {
		fs := flag.NewFlagSet("bench trainer", flag.ContinueOnError)
		var cfg trainer.BenchConfig
		fs.IntVar(&cfg.Model.Layers, "layers", 0, "training model layers (default 4)")
		fs.IntVar(&cfg.Model.DModel, "d-model", 0, "training model width (default 256)")
		fs.IntVar(&cfg.Model.Heads, "heads", 0, "attention heads (default 4)")
		fs.IntVar(&cfg.Model.FFN, "ffn", 0, "MLP width (default 4·d-model)")
		fs.IntVar(&cfg.Seqs, "seqs", 0, "sequences per training batch (default 8)")
		fs.IntVar(&cfg.SeqLen, "seq-len", 0, "tokens per sequence (default 256)")
		fs.IntVar(&cfg.Steps, "steps", 0, "timed steps per measurement (default 5)")
		if err := fs.Parse(args); err != nil {
			return err
		}
		res, err := trainer.RunBench(ctx, cfg, os.Stdout)
		if err != nil {
			return fmt.Errorf("bench trainer: %w", err)
		}
		fmt.Println(res.JSON())
		return nil
	}
}
