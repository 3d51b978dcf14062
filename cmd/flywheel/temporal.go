package main

import (
	"context"
	"fmt"
	"time"

	"github.com/flywheel-ai/flywheel/worker"
)

func runTemporal(ctx context.Context, args []string) error {
	const usage = "flywheel temporal setup"
	v, rest, err := verb(args, usage)
	if err != nil {
		return err
	}
	if v != "setup" {
		return fmt.Errorf("unknown temporal subcommand %q; usage: %s", v, usage)
	}
	cfg, _, err := loadConfig("temporal setup", rest, nil)
	if err != nil {
		return err
	}
	logger := newLogger(cfg.Log)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := worker.Dial(ctx, cfg.Temporal.Address, cfg.Temporal.Namespace, logger)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := worker.Setup(ctx, c, cfg.Temporal.Namespace); err != nil {
		return err
	}
	fmt.Printf("namespace %s ready with Flywheel search attributes\n", cfg.Temporal.Namespace)
	return nil
}
